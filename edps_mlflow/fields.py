"""The fields of a study, declared once: name, type, default, help, and whether (and when) each enters
the keys.

``STUDY_FIELDS`` is the table. The keys derive from it (:func:`key_fields`); the ``edps study`` options,
the MLproject's ``main`` entry point and ``mlproject.study_parameters`` are checked against it by
``tests/test_study_fields.py`` (every field present under its name, the same default), so that a field
added in one place and forgotten in another fails a test instead of silently re-keying the store.

The rule that keeps old keys (OpenLTH's): a field whose value equals its ``key_default`` is left out of
the hash. A new field of ``StudySpec`` is added with a default equal to its ``key_default`` (the value
every study measured before it existed had), and every existing key stays what it was. A field that
means nothing without another (``needs``: the probe interval without probes) is left out with it.

No torch, no MLflow, no import from the rest of the package: config.py builds its keys from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


class _Always:
    """The ``key_default`` of a field that is always hashed (it has no value that old keys lacked)."""

    def __repr__(self) -> str:
        return "ALWAYS"


ALWAYS: Any = _Always()


@dataclass(frozen=True)
class StudyField:
    """One field of a study.

    ``type`` is the annotation of the StudySpec attribute (as written there), or of the run option.
    ``default`` is what ``edps study`` and the MLproject's ``main`` entry point take when the field is
    left out, spelled as on the command line ("default": the workload's protocol). ``in_key``: part of the
    study's identity (a StudySpec attribute); the others change only how a study runs, never its result.
    ``option``/``parameter``: its ``edps study`` option and its MLproject parameter (None: it has none).
    """

    name: str
    type: str
    default: str | None
    help: str
    in_key: bool = False
    key_default: Any = ALWAYS
    needs: str | None = None
    option: str | None = None
    parameter: str | None = None


def _spec(name: str, type_: str, default: str | None, help_: str, key_default: Any = ALWAYS,
          needs: str | None = None, option: str | None = None, parameter: str | None = None,
          on_command_line: bool = True) -> StudyField:
    flag = option or "--" + name.replace("_", "-")
    return StudyField(name, type_, default, help_, True, key_default, needs, flag if on_command_line else None,
                      (parameter or name) if on_command_line else None)


def _run(name: str, type_: str, default: str | None, help_: str, through_mlproject: bool = False) -> StudyField:
    return StudyField(name, type_, default, help_, False, option="--" + name.replace("_", "-"),
                      parameter=name if through_mlproject else None)


# In StudySpec's order (the order of key_fields, hence of a study run's ``spec.*`` params and study.json).
STUDY_FIELDS: tuple[StudyField, ...] = (
    _spec("workload", "str", "digits-simple-cnn", "the workload (dataset and network, edps workloads)"),
    _spec("optimizer", "OptimizerKind", "sgd", "sgd, momentum, nesterov, adam or adamw"),
    _spec("sparsity", "float", "0.0", "fraction of the parameters pruned at initialisation (by --pruning), in [0, 1)"),
    _spec("batch_size", "int", "256", "the batch size", option="--bs", parameter="bs"),
    _spec("trials", "int", "default", "quasi-random trials per study (Sobol order); default: the workload's"),
    _spec("goal_error", "float", "default", "goal validation error (or loss, of a loss-goal workload); default: the "
                                            "workload's"),
    _spec("max_steps", "int", "default", "step cap; default: the workload's"),
    _spec("check_interval", "int", "default", "steps between validation checks; default: the workload's"),
    _spec("seed", "int", "0", "study seed (data order and trial seeds)"),
    _spec("probes", "tuple[str, ...]", "", "measurements during training (probes.py); none: the plain study",
          key_default=()),
    _spec("probe_interval", "int", "default", "steps between probe calls; default: the workload's", needs="probes"),
    # Studies probed before the choice existed probed every trial: "all" is the value their keys lack, though
    # `edps study` now defaults to "best".
    _spec("probe_trials", "ProbeTrials", "best", "which trials probe: best (re-run with probes) or all",
          key_default="all", needs="probes"),
    _spec("allow_tf32", "bool", "false", "TF32 matmuls and convolutions on GPUs that have them (can change results)",
          key_default=False),
    # Set from the data a study or sweep loads (data/fingerprint.py), never typed.
    _spec("data_fingerprint", "str | None", None, "sha256 of the data loaded", key_default=None,
          on_command_line=False),
    # Studies made before methods existed were pruned by SNIP: "snip" is the value their keys lack. At sparsity 0
    # every method is the dense network, spelled "snip" (StudySpec), so one dense study serves them all.
    _spec("pruning", "str", "snip", "the pruning method at initialisation: snip, random, random-erk, magnitude, "
          "grasp, synflow, or shuffle(<method>) (docs/pruning.md)", key_default="snip"),
    # How a study runs (ExecutionOptions): never part of a key.
    _run("full_trials", "bool", "false", "every trial to its own end instead of exact early stopping (same result)",
         through_mlproject=True),
    _run("data_dir", "str | None", None, "dataset directory", through_mlproject=True),
    _run("device", "str | None", None, "cpu, cuda or cuda:N", through_mlproject=True),
    _run("workers", "int | None", "default", "worker processes on CPU", through_mlproject=True),
    _run("sweep_run", "str", "", "the sweep run that submitted this study (set by a sweep)", through_mlproject=True),
    _run("sweep_key", "str", "", "the key of that sweep", through_mlproject=True),
    _run("experiment", "str | None", None, "MLflow experiment"),
    _run("log_interval", "float | None", None, "seconds between progress lines when not on a terminal"),
    _run("pack_size", "int | None", None, "trials trained in lockstep"),
    _run("full_evaluation", "bool", "false", "always evaluate the whole validation split (no early abort)"),
    _run("system_metrics", "bool", "false", "log CPU, memory and GPU use on the study run"),
    _run("curve_interval", "int | None", "default", "steps between full validation passes (each trial's curve)"),
    _run("wait", "bool", "false", "wait for another live process that runs this study"),
)

KEY_FIELDS: tuple[StudyField, ...] = tuple(f for f in STUDY_FIELDS if f.in_key)


def encode(value: Any) -> Any:
    """A field's value as it is hashed (and logged): enums by value, tuples as lists."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [encode(v) for v in value]
    return value


def key_fields(spec: Any, table: tuple[StudyField, ...] = KEY_FIELDS) -> dict[str, Any]:
    """``spec``'s hashed fields in table order: every key field, less those at their ``key_default`` and
    those whose ``needs`` is left out."""
    hashed: dict[str, Any] = {}
    for f in table:
        if not f.in_key:
            continue
        value = encode(getattr(spec, f.name))
        at_default = f.key_default is not ALWAYS and _same(value, encode(f.key_default))
        # A field needs one declared before it (the table is checked for that), so one pass settles it.
        if not at_default and (f.needs is None or f.needs in hashed):
            hashed[f.name] = value
    return hashed


def _same(value: Any, default: Any) -> bool:
    # True == 1 and 0.0 == False in Python: a default matches only a value of its own type.
    return type(value) is type(default) and value == default
