"""The fields of a study and the options of `edps study` and `edps sweep`, declared once (OpenLTH's
``Hparams``): each one's name, how the command line reads it, its default, its help, and whether it enters
the keys. The keys, the options (cli_options.py), the MLproject's parameters and the sweep key derive from
``STUDY_FIELDS``; ``SWEEP_FIELDS`` are the options only a sweep has. A help text names a registry's list as
``{optimizers}``: the command line fills it in.

Old keys hold (OpenLTH's rule): a field at its ``key_default`` is left out of the hash, so a new field comes with
a default equal to the value every study had before it existed. A field that means nothing without another
(``needs``) is left out with it. No import from the rest of the package: config.py builds its keys from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


class _KeyDefault(Enum):
    ALWAYS = "always"  # the key default of a field that is always hashed: old keys lack no value of it


ALWAYS: Any = _KeyDefault.ALWAYS


@dataclass(frozen=True)
class Option:
    """One option of a command. ``name``: the value's name (the StudySpec field, or the SweepSpec.build or
    command argument it fills); ``kind``: how the command line reads it (``cli_options.KINDS``); ``default``: as typed
    on the command line, None for none; ``flag``: its spelling, None when it is no option (a field set by the
    study itself); ``parameter``: its MLproject parameter, None when the entry point has none."""

    name: str
    kind: str | None
    default: str | None
    help: str
    flag: str | None = None
    parameter: str | None = None
    hidden: bool = False


@dataclass(frozen=True)
class StudyField(Option):
    """One field of a study. ``in_key``: part of the study's identity (a StudySpec attribute); the others
    change only how a study runs, never its result. ``in_sweep``: `edps sweep` takes the same option (a
    protocol field); ``axis``: its plural option of a sweep, a grid axis."""

    in_key: bool = False
    key_default: Any = ALWAYS
    needs: str | None = None
    in_sweep: bool = False
    axis: Option | None = None


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _parameter(flag: str) -> str:
    """The MLproject's name of an option's parameter: ``--batch-sizes`` takes ``-P batch_sizes=...``."""
    return flag.lstrip("-").replace("-", "_")


def _key(name: str, kind: str | None, default: str | None, help_: str, key_default: Any = ALWAYS,
         needs: str | None = None, flag: str | None = None, axis: Option | None = None) -> StudyField:
    flag = (flag or _flag(name)) if kind else None
    return StudyField(name, kind, default, help_, flag, flag and _parameter(flag), in_key=True,
                      key_default=key_default, needs=needs, in_sweep=kind is not None and axis is None, axis=axis)


def _option(name: str, kind: str, default: str | None, help_: str, parameter: bool = False,
            flag: str | None = None) -> Option:
    flag = flag or _flag(name)
    return Option(name, kind, default, help_, flag, _parameter(flag) if parameter else None)


def _run(name: str, kind: str, default: str | None, help_: str, parameter: bool = False, sweep: bool = False,
         hidden: bool = False) -> StudyField:
    """A field that changes how a study runs (ExecutionOptions), never its result: no part of a key."""
    return StudyField(name, kind, default, help_, _flag(name), name if parameter else None, hidden, in_sweep=sweep)


_REPLICATES_HELP = ("Independent studies per point, each its own study with seeds --seed, --seed + 1, ... "
                    "(initialisations and data order; the same search points): the analysis' intervals rest on them.")

# In StudySpec's order (the order of key_fields, hence of a study run's ``spec.*`` params and study.json).
STUDY_FIELDS: tuple[StudyField, ...] = (
    _key("workload", "text", "digits-simple-cnn", "Workload: {workloads} (`edps workloads`), or "
         "package.module:NAME for a workload of your own (docs/workloads.md)."),
    _key("optimizer", "text", "sgd", "Optimizer: {optimizers}.",
         axis=_option("optimizers", "names", "sgd", "Comma-separated: {optimizers}.", parameter=True)),
    _key("sparsity", "number", "0.0", "Fraction pruned at initialisation (by --pruning), in [0, 1).",
         axis=_option("sparsities", "numbers", None, "Comma-separated, each in [0, 1); default 0.", parameter=True)),
    _key("batch_size", "int", "256", "Batch size.", flag="--bs",
         axis=_option("batch_sizes", "batch sizes", None, "2..1024 (powers of two) or 16,64,256; default 2..largest "
                      "that fits the training split.", parameter=True)),
    _key("trials", "int|default", "default", "Quasi-random trials per study (Sobol order); 'default': the workload's."),
    _key("goal_error", "number|default", "default", "Goal validation error (of a loss-goal workload: the validation "
         "loss to reach); 'default': the workload's."),
    _key("max_steps", "int|default", "default", "Step cap; 'default': the workload's."),
    _key("check_interval", "int|default", "default", "Steps between validation checks; 'default': the workload's."),
    _key("seed", "int", "0", "Study seed (data order and trial seeds)."),
    _key("probes", "probes", "", "Measurements during training: {probes} (comma-separated).", key_default=()),
    _key("probe_interval", "int|default", "default", "Steps between probe calls; 'default': the workload's (the "
         "paper's workloads: 1,000).", needs="probes"),
    # Studies probed before the choice existed probed every trial: "all" is the value their keys lack, though
    # `edps study` now defaults to "best".
    _key("probe_trials", "probe_trials", "best", "Which trials probe, each along its whole run: best (the study "
         "runs without probes, then trains its best trial again with them) or all (every trial, each to its goal or "
         "the cap).", key_default="all", needs="probes"),
    _key("allow_tf32", "bool", "false", "true: TF32 matmuls and convolutions on GPUs that have them (default: full "
         "FP32, as the paper; part of the study key).", key_default=False),
    # Set from the data a study or sweep loads (data/fingerprint.py), never typed.
    _key("data_fingerprint", None, None, "sha256 of the data loaded", key_default=None),
    # Studies made before methods existed were pruned by SNIP: "snip" is the value their keys lack. At sparsity 0
    # every method is the dense network, spelled "snip" (StudySpec), so one dense study serves them all.
    _key("pruning", "text", "snip", "Pruning method at initialisation: {methods}, or shuffle(<method>) "
         "(docs/pruning.md).", key_default="snip",
         axis=_option("prunings", "methods", "snip", "Pruning methods, comma-separated (an axis beside the "
                      "sparsities): {methods}, or shuffle(<method>). Sparsity 0 is one dense study for them all.",
                      flag="--pruning", parameter=True)),
    # A ladder of goals, easiest first: each rung gets its own steps-to-result from the same trials. One goal is
    # the plain study (--goal-error), whose keys lack this field.
    _key("goals", "goals", "none", "Comma-separated goals, easiest first (e.g. 0.10,0.05,0.03, or losses in nats on a "
         "loss-goal workload): each gets its own best trial and steps-to-result from one set of trials, at the cost "
         "of the hardest alone (instead of --goal-error).", key_default=()),
    # Studies searched the optimizer's own metaparameters before the choice existed: "raw" is the value keys lack.
    _key("search_coordinates", "coordinates", "raw", "What the search tunes: raw (the optimizer's own "
         "metaparameters) or invariant (Adam's, AdamW's and Lion's beta2 as a half-life in examples, a decoupled "
         "weight decay as its timescale tau in epochs; docs/studies.md).", key_default="raw"),
    # Studies made before the choice were SP's. At sparsity 0 SμPar is SP to the bit: one dense study, spelled "sp".
    _key("parameterization", "parameterization", "sp", "sp (the paper's standard parameterisation) or supar "
         "(SμPar: each masked layer's initial variance and learning rate divided by its density; "
         "docs/parameterization.md).", key_default="sp",
         axis=_option("parameterizations", "parameterizations", "sp", "Comma-separated, an axis beside the "
                      "sparsities: sp, supar. Sparsity 0 is one dense study for both.", parameter=True)),
    # A study's option only: the MLproject's main entry point runs one study (a sweep's option has a parameter).
    _run("replicates", "count", "1", _REPLICATES_HELP),
    _run("full_trials", "bool", "false", "true: run every trial to its own end instead of exact early stopping "
         "(same result).", parameter=True, sweep=True),
    _run("data_dir", "text", None, "Dataset directory (else $EDPS_DATA_DIR, else the user cache).", parameter=True,
         sweep=True),
    _run("accept_unverified_data", "bool", "false", "true: train on data files that are not the published ones "
         "(their checksums differ, or none is published), each run saying so (default: refused).", parameter=True,
         sweep=True),
    _run("experiment", "experiment", None, "MLflow experiment (else $MLFLOW_EXPERIMENT_NAME, else "
         "edps/<workload>).", sweep=True),
    _run("log_interval", "seconds", None, "Seconds between progress lines when not on a terminal (default: 10 "
         "for a study, 30 for a sweep).", sweep=True),
    _run("device", "text", None, "cpu, cuda or cuda:N (default: cuda when available).", parameter=True),
    _run("workers", "count|default", "default", "Worker processes on CPU; 'default': one per core.", parameter=True),
    _run("pack_size", "count", None, "Trials trained in lockstep (default: per device and batch size)."),
    _run("full_evaluation", "flag", None, "Always evaluate the whole validation split (no early abort)."),
    _run("system_metrics", "flag", None, "Log CPU, memory (and GPU) use on the study run (needs psutil)."),
    _run("curve_interval", "int|default", "default", "Steps between full validation passes that draw each "
         "trial's validation-error curve (rounded to a multiple of the check interval); 'default': every check "
         "on small validation splits, else every 10th."),
    _run("wait", "flag", None, "When another live process runs this study, wait for it (or take over when it "
         "dies)."),
    # Set by `edps sweep --executor mlflow-project` through the MLproject: the study is that sweep's child.
    _run("sweep_run", "text", "", "The sweep run that submitted this study.", parameter=True, hidden=True),
    _run("sweep_key", "text", "", "The key of that sweep.", parameter=True, hidden=True),
)

# The options only a sweep has (SweepOptions, ProjectLaunch, AdaptiveSettings).
SWEEP_FIELDS: tuple[Option, ...] = (
    _option("grid", "grids", "none", "paper: the paper's sparsities (0, 0.5, 0.7, 0.9) and batch sizes 2 .. the "
            "largest that fits the training split (instead of --batch-sizes / --sparsities).", parameter=True),
    _option("replicates", "count", "1", _REPLICATES_HELP, parameter=True),
    _option("executor", "executors", "local", "Where the studies run (docs/executors.md).", parameter=True),
    _option("workers", "count|default", "default", "Local: study processes ('default': one per core, or per GPU); "
            "mlflow-project: runs submitted at once ('default': one per core).", parameter=True),
    _option("ray_address", "text", None, "Ray cluster address (e.g. auto); default: a local Ray instance."),
    _option("backend", "backends", "local", "mlflow-project: MLflow Projects backend of the submitted runs.",
            parameter=True),
    _option("backend_config", "text", "", "mlflow-project with --backend kubernetes: JSON file with MLflow's "
            "kube-job-template-path, repository-uri (and kube-context) and our base-image.", parameter=True),
    _option("env_manager", "env_managers", "local", "mlflow-project on the local backend: MLflow's environment of "
            "each run.", parameter=True),
    _option("device", "text", None, "cpu or cuda (default: cuda when available)."),
    _option("wait", "flag", None, "When another live process runs this sweep, wait for it (or take over when it "
            "dies)."),
    _option("adaptive", "flag", None, "Start at the largest batch sizes of the --batch-sizes range and walk each "
            "curve down only as far as --target needs (a round: as many studies as --workers), or until a limit is "
            "reached."),
    _option("target", "text", None, "Adaptive: b_crit[:F] (B_crit at least xF inside the measured batch sizes; F=2 "
            "by default), threshold (the threshold critical batch size and its bracket) or boundaries (both regime "
            "boundaries bracketed) [default: b_crit:2]."),
    _option("max_studies", "int", None, "Adaptive: stop after this many studies."),
    _option("budget", "text", None, "Adaptive: stop when the measured studies' trial-steps (e.g. 2e6steps) or this "
            "command's wall clock (e.g. 90s, 30m, 2h) is spent; checked before each round."),
)

KEY_FIELDS: tuple[StudyField, ...] = tuple(f for f in STUDY_FIELDS if f.in_key)
GRID_AXES: tuple[str, ...] = tuple(f.name for f in STUDY_FIELDS if f.axis)
# Each command's options, in the order of its help: a sweep takes a study's protocol fields as they are and
# its axes as lists.
COMMAND_OPTIONS: dict[str, tuple[Option, ...]] = {
    "study": tuple(f for f in STUDY_FIELDS if f.flag),
    "sweep": tuple(f.axis or f for f in STUDY_FIELDS if f.axis or f.in_sweep) + SWEEP_FIELDS,
}
# The arguments of StudySpec.build and SweepSpec.build among a command's values.
SPEC_ARGUMENTS = frozenset(f.name for f in KEY_FIELDS) | {f.axis.name for f in KEY_FIELDS if f.axis}


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
        value = encode(getattr(spec, f.name))
        at_default = f.key_default is not ALWAYS and _same(value, encode(f.key_default))
        # A field needs one declared before it (the table is checked for that), so one pass settles it.
        if not at_default and (f.needs is None or f.needs in hashed):
            hashed[f.name] = value
    return hashed


def _same(value: Any, default: Any) -> bool:
    # True == 1 and 0.0 == False in Python: a default matches only a value of its own type.
    return type(value) is type(default) and value == default
