"""The study's fields are declared once (edps_mlflow/fields.py): StudySpec, its keys, the `edps study`
options, the MLproject's main entry point and mlproject.study_parameters all agree with that table."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from edps_mlflow.cli import cli
from edps_mlflow.config import StudySpec, content_key
from edps_mlflow.errors import EdpsError
from edps_mlflow.fields import ALWAYS, KEY_FIELDS, STUDY_FIELDS, StudyField, key_fields
from edps_mlflow.mlproject import study_parameters
from edps_mlflow.sweep import SweepSpec

REPO = Path(__file__).resolve().parents[1]
STUDY = cli.commands["study"]


def _main_entry_point() -> dict:
    return yaml.safe_load((REPO / "MLproject").read_text())["entry_points"]["main"]


def _parsed(field: StudyField, text) -> object:
    """A default as `edps study` reads it ('' means left out there too: data_dir or None, device or None)."""
    option = next(p for p in STUDY.params if p.name == field.name)
    value = None if text is None else option.type.convert(text, option, None)
    return None if value == "" and field.name in ("data_dir", "device") else value


def test_the_table_holds_every_studyspec_field_in_order_with_its_annotation():
    assert [(f.name, f.type) for f in dataclasses.fields(StudySpec)] == [(f.name, f.type) for f in KEY_FIELDS]
    names = [f.name for f in STUDY_FIELDS]
    assert len(set(names)) == len(names)


def test_a_field_with_a_default_is_left_out_of_the_key_at_that_default():
    # OpenLTH's rule: the field's StudySpec default is the value old keys lack, so adding it re-keys nothing.
    # (A field that means nothing without another one is left out with it, whatever its default.)
    table = {f.name: f for f in KEY_FIELDS}
    for declared in dataclasses.fields(StudySpec):
        field = table[declared.name]
        if declared.default is dataclasses.MISSING:
            assert field.key_default is ALWAYS, f"{field.name} has no default: it is always hashed"
        elif field.needs is None:
            assert field.key_default == declared.default, \
                f"{field.name}: a default ({declared.default!r}) that is not its key default re-keys every study"
        if field.needs is not None:
            assert [f.name for f in KEY_FIELDS].index(field.needs) < [f.name for f in KEY_FIELDS].index(field.name)


def test_a_new_field_at_its_default_leaves_every_key_unchanged():
    @dataclasses.dataclass(frozen=True)
    class WithMethod(StudySpec):
        pruning_method: str = "snip"

    table = KEY_FIELDS + (StudyField("pruning_method", "str", "snip", "pruning at initialisation", in_key=True,
                                     key_default="snip", option="--pruning-method", parameter="pruning_method"),)
    spec = StudySpec.build("digits-simple-cnn", "momentum", 0.9, 64, probes=("lipschitz",))
    same = WithMethod(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(StudySpec)})
    assert key_fields(same, table) == spec.key_fields()
    assert content_key({"kind": "study", **key_fields(same, table)}) == spec.study_key
    other = dataclasses.replace(same, pruning_method="random")
    assert content_key({"kind": "study", **key_fields(other, table)}) != spec.study_key


def test_every_field_with_an_option_is_an_edps_study_option_with_the_same_default():
    options = {p.name: p for p in STUDY.params}
    defaults = STUDY.make_context("study", []).params
    declared = {f.name for f in STUDY_FIELDS if f.option}
    assert declared == set(options), "an `edps study` option without a row in fields.STUDY_FIELDS, or the reverse"
    for field in STUDY_FIELDS:
        if field.option:
            assert field.option in options[field.name].opts
            assert _parsed(field, field.default) == _parsed(field, defaults[field.name]), field.name


def test_the_main_entry_point_and_study_parameters_pass_every_field_through():
    main = _main_entry_point()
    through = {f.parameter: f for f in STUDY_FIELDS if f.parameter}
    assert set(main["parameters"]) == set(through)
    for name, field in through.items():
        assert f"{field.option} {{{name}}}" in main["command"], name
        default = main["parameters"][name].get("default")
        assert _parsed(field, None if default is None else str(default)) == _parsed(field, field.default), name
    sweep = SweepSpec.build("digits-simple-cnn", ("momentum",), (16,), (0.5,), probes=("noise_scale",))
    assert set(study_parameters(sweep.studies()[0], "run", sweep.sweep_key, None, False, None, None)) == set(through)


def test_the_batch_size_is_validated_by_the_study_before_any_data_load():
    with pytest.raises(EdpsError, match="batch size 5000 exceeds the 1618 training examples of digits-simple-cnn"):
        StudySpec.build("digits-simple-cnn", "sgd", 0.0, 5000)
    with pytest.raises(EdpsError, match="batch size 4096 exceeds the 1618 training examples"):
        SweepSpec.build("digits-simple-cnn", ("sgd",), (64, 4096))
    with pytest.raises(EdpsError, match="batch size must be a positive integer"):
        StudySpec.build("digits-simple-cnn", "sgd", 0.0, 0)
    with pytest.raises(EdpsError, match="unknown workload"):
        StudySpec("no-such-workload", "sgd", 0.0, 8, 2, 0.1, 100, 10, 0)
