"""The study's fields and the options of `edps study` and `edps sweep` are declared once (edps_mlflow/fields.py):
StudySpec, its keys, the specs' builders and the MLproject's entry points agree with that table, and every list
of names in a help text is its registry's."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import click
import pytest
import yaml

from edps_mlflow.parameterization import PARAMETERIZATIONS
from edps_mlflow.adaptive import Goal
from edps_mlflow.cli import cli
from edps_mlflow.config import PROBE_NAMES, ProbeTrials, StudySpec, content_key
from edps_mlflow.data.catalog import SOURCES
from edps_mlflow.errors import EdpsError
from edps_mlflow.executors import EXECUTORS
from edps_mlflow.fields import ALWAYS, COMMAND_OPTIONS, KEY_FIELDS, STUDY_FIELDS, StudyField, key_fields
from edps_mlflow.mlproject import Backend, EnvManager, study_parameters
from edps_mlflow.optimizers import optimizer_names
from edps_mlflow.pruning import METHODS
from edps_mlflow.sweep import SweepSpec
from edps_mlflow.workloads import WORKLOADS

REPO = Path(__file__).resolve().parents[1]
# Each registry whose names a help text may list, read where the registry lives.
REGISTRIES = {
    "optimizers": list(optimizer_names()), "pruning methods": list(METHODS), "executors": list(EXECUTORS),
    "workloads": list(WORKLOADS), "probes": list(PROBE_NAMES), "backends": [b.value for b in Backend],
    "environment managers": [e.value for e in EnvManager], "datasets": list(SOURCES),
}


def _parsed(parameter: click.Parameter, text) -> object:
    """A default as the command reads it ('' is left out there too: `--data-dir ''` is no directory)."""
    value = None if text is None else parameter.type.convert(str(text), parameter, None)
    return None if value == "" else value


def test_the_table_holds_every_studyspec_field_in_order_and_the_sweep_builder_takes_every_axis():
    assert [f.name for f in dataclasses.fields(StudySpec)] == [f.name for f in KEY_FIELDS]
    names = [f.name for f in STUDY_FIELDS]
    assert len(set(names)) == len(names)
    assert {f.axis.name for f in KEY_FIELDS if f.axis} <= set(inspect.signature(SweepSpec.build).parameters)


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

    table = KEY_FIELDS + (StudyField("pruning_method", "text", "snip", "pruning at initialisation", "--pruning-method",
                                     "pruning_method", in_key=True, key_default="snip"),)
    spec = StudySpec.build("digits-simple-cnn", "momentum", 0.9, 64, probes=("lipschitz",))
    same = WithMethod(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(StudySpec)})
    assert key_fields(same, table) == spec.key_fields()
    assert content_key({"kind": "study", **key_fields(same, table)}) == spec.study_key
    other = dataclasses.replace(same, pruning_method="random")
    assert content_key({"kind": "study", **key_fields(other, table)}) != spec.study_key


def test_a_sweep_takes_the_protocol_fields_as_a_study_does_and_the_axes_as_lists():
    study = {o.name: o for o in COMMAND_OPTIONS["study"]}
    sweep = {o.name: o for o in COMMAND_OPTIONS["sweep"]}
    for field in KEY_FIELDS:
        if field.axis:
            assert field.name not in sweep and sweep[field.axis.name] == field.axis
        elif field.flag:
            assert sweep[field.name] == study[field.name] == field
    assert [p.name for p in cli.commands["sweep"].params if p.name != "help"] == list(sweep)


@pytest.mark.parametrize("command,entry_point", [("study", "main"), ("sweep", "sweep")])
def test_the_mlproject_entry_points_pass_every_declared_parameter_through(command, entry_point):
    entry = yaml.safe_load((REPO / "MLproject").read_text())["entry_points"][entry_point]
    through = {o.parameter: o for o in COMMAND_OPTIONS[command] if o.parameter}
    assert set(entry["parameters"]) == set(through)
    options = {p.name: p for p in cli.commands[command].params}
    for name, declared in through.items():
        assert f"{declared.flag} {{{name}}}" in entry["command"], name
        option = options[declared.name]
        assert _parsed(option, entry["parameters"][name].get("default")) == _parsed(option, declared.default), name
    if command == "study":
        sweep = SweepSpec.build("digits-simple-cnn", ("momentum",), (16,), (0.5,), probes=("noise_scale",))
        assert set(study_parameters(sweep.studies()[0], "run", sweep.sweep_key, None, False, None, None)) \
            == set(through)


def _help_texts():
    """Every help text of the command line: each command's and each option's, with its place."""
    def walk(command: click.Command, path: str):
        yield path, command.help or ""
        for parameter in command.params:
            if isinstance(parameter, click.Option) and parameter.help:
                yield f"{path} {parameter.opts[0]}", parameter.help
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, f"{path} {name}")
    return list(walk(cli, "edps"))


def test_every_list_of_names_in_a_help_text_is_its_registrys_whole_list():
    """A help text that lists two or more names of a registry lists them all, in the registry's order: a new
    pruning method or optimizer reaches every help, or this fails."""
    separator = r"(?:, or |, and |, | or | and )"
    for registry, names in REGISTRIES.items():
        name = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
        word = rf"(?<![\w-])(?:{name})(?![\w-])"
        for place, text in _help_texts():
            for run in re.finditer(rf"{word}(?:{separator}{word})+", text):
                assert re.findall(word, run.group(0)) == names, f"{place}: {run.group(0)!r} is not the {registry}"
    helps = dict(_help_texts())
    for place, registry in [("edps study --optimizer", "optimizers"), ("edps sweep --optimizers", "optimizers"),
                            ("edps trials --optimizer", "optimizers"), ("edps study --pruning", "pruning methods"),
                            ("edps sweep --pruning", "pruning methods"), ("edps study --workload", "workloads"),
                            ("edps trials --workload", "workloads"), ("edps sweep --probes", "probes"),
                            ("edps data download", "datasets")]:
        assert ", ".join(REGISTRIES[registry]) in helps[place], place
    # --target names the goals of an adaptive sweep, each with what it pins.
    assert re.findall(r"\b([a-z_]+)(?:\[:F\])? \(", helps["edps sweep --target"]) == [g.value for g in Goal]


def test_every_choice_is_its_registrys():
    choices = {(c, p.name): list(p.type.choices) for c in ("study", "sweep") for p in cli.commands[c].params
               if isinstance(p.type, click.Choice)}
    probe_trials = [t.value for t in ProbeTrials]
    assert choices == {
        ("study", "probe_trials"): probe_trials, ("sweep", "probe_trials"): probe_trials,
        ("study", "search_coordinates"): ["raw", "invariant"], ("sweep", "search_coordinates"): ["raw", "invariant"],
        ("sweep", "grid"): ["none", "paper"], ("sweep", "executor"): REGISTRIES["executors"],
        ("sweep", "backend"): REGISTRIES["backends"], ("sweep", "env_manager"): REGISTRIES["environment managers"],
        ("study", "parameterization"): list(PARAMETERIZATIONS)}


def test_the_batch_size_is_validated_by_the_study_before_any_data_load():
    with pytest.raises(EdpsError, match="batch size 5000 exceeds the 1618 training examples of digits-simple-cnn"):
        StudySpec.build("digits-simple-cnn", "sgd", 0.0, 5000)
    with pytest.raises(EdpsError, match="batch size 4096 exceeds the 1618 training examples"):
        SweepSpec.build("digits-simple-cnn", ("sgd",), (64, 4096))
    with pytest.raises(EdpsError, match="batch size must be a positive integer"):
        StudySpec.build("digits-simple-cnn", "sgd", 0.0, 0)
    with pytest.raises(EdpsError, match="unknown workload"):
        StudySpec("no-such-workload", "sgd", 0.0, 8, 2, 0.1, 100, 10, 0)
