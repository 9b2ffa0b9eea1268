"""The options of the ``edps`` commands: the click type of each kind of option of fields.py;
:func:`declared_options`, which gives a command the options that fields.COMMAND_OPTIONS declares for it; and
:func:`usage_line`, which names the option a user meant by an unknown one. No torch, no MLflow: `--help` and a
bad value are answered before anything heavy is imported.
"""

from __future__ import annotations

import functools
import math
import os
from types import SimpleNamespace
from typing import Any, Callable

import click

from edps_mlflow.config import PROBE_NAMES, ProbeTrials, parse_probes
from edps_mlflow.coordinates import Coordinates
from edps_mlflow.executors import EXECUTORS
from edps_mlflow.experiment_names import experiment_name_problem
from edps_mlflow.fields import COMMAND_OPTIONS, SPEC_ARGUMENTS, STUDY_FIELDS, Option
from edps_mlflow.mlproject import Backend, EnvManager
from edps_mlflow.optimizers import optimizer_names
from edps_mlflow.parameterization import PARAMETERIZATIONS, parse_parameterizations
from edps_mlflow.pruning import METHODS, parse_methods
from edps_mlflow.workloads import WORKLOADS

_DEFAULT_WORDS = ("", "default", "workload", "none")


class _Read(click.ParamType):
    """Text read by ``read``, whose ValueError is click's one-line refusal (a parser of the package refuses with
    its own EdpsError); a word of ``absent`` ('default', the MLproject's spelling) is None, the default."""

    def __init__(self, name: str, read: Callable[[str], Any], absent: tuple[str, ...] = _DEFAULT_WORDS) -> None:
        self.name, self.read, self.absent = name, read, absent

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):  # a default read already, or a program's value
            return value
        if value.strip().lower() in self.absent:
            return None
        try:
            return self.read(value)
        except ValueError as error:
            self.fail(str(error), param, ctx)


def _number(integer: bool) -> Callable[[str], int | float]:
    """A finite number (integral when ``integer``) or 'default': the workload's value."""
    def read(text: str) -> int | float:
        text = text.strip()
        try:
            number = float(text)
        except ValueError:
            raise ValueError(f"must be a number or 'default', got {text!r}") from None
        if not math.isfinite(number):
            raise ValueError(f"must be a finite number or 'default', got {text!r}")
        if integer and number != int(number):
            raise ValueError(f"must be an integer or 'default', got {text!r}")
        return int(number) if integer else number
    return read


def _batch_sizes(text: str) -> tuple[int, ...]:
    """``2..1024`` (the powers of two in between) or ``16,64,256``."""
    text = text.strip()
    try:
        if ".." in text:
            low, high = (int(part) for part in text.split("..", 1))
            if low < 1 or high < low or low & (low - 1) or high & (high - 1):
                raise ValueError
            return tuple(2 ** e for e in range(low.bit_length() - 1, high.bit_length()))
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"must be a list like 16,64,256 or a power-of-two range like 2..1024, got {text!r}") from None


def _numbers(text: str) -> tuple[float, ...]:
    try:
        numbers = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"must be a comma-separated list of numbers, got {text!r}") from None
    if not all(math.isfinite(n) for n in numbers):
        raise ValueError(f"must hold finite numbers, got {text!r}")
    return numbers


def _goals(text: str) -> tuple[float, ...]:
    if not text.strip():
        raise ValueError("an empty goal ladder: give one goal or more, easiest first (e.g. 0.10,0.05,0.03)")
    return _numbers(text)


class FiniteRange(click.FloatRange):
    """click's FloatRange lets nan through (every comparison with nan is false): this one does not."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"must be a finite number, got {value!r}", param, ctx)
        return number


class _OptionalCount(click.IntRange):
    """A count in the range, or 'default' (None), the MLproject's spelling of "leave it out"."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | None:
        if isinstance(value, str) and value.strip().lower() == "default":
            return None
        return super().convert(value, param, ctx)


class ExperimentName(click.ParamType):
    """An experiment name by experiment_names' rule, checked before any store is touched (an empty one would
    silently mean ``omitted``); the error names the option's environment variable when the value came from it."""

    name = "name"

    def __init__(self, omitted: str = "the default experiment") -> None:
        self.omitted = omitted

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        problem = experiment_name_problem(text)
        if problem is not None:
            if not text.strip():
                problem += f" (leave the option out for {self.omitted})"
            variable = getattr(param, "envvar", None)
            if isinstance(variable, str) and os.environ.get(variable) == text:
                problem += f" (the value of ${variable})"
            self.fail(problem, param, ctx)
        return text


# The registries whose names an option takes (a kind below) or its help lists ({optimizers} in fields.py).
REGISTRIES: dict[str, tuple[str, ...]] = {
    "workloads": tuple(WORKLOADS), "optimizers": optimizer_names(), "methods": tuple(METHODS), "probes": PROBE_NAMES,
    "probe_trials": tuple(k.value for k in ProbeTrials), "grids": ("none", "paper"), "executors": tuple(EXECUTORS),
    "parameterization": PARAMETERIZATIONS, "coordinates": tuple(c.value for c in Coordinates),
    "backends": tuple(b.value for b in Backend),
    "env_managers": tuple(e.value for e in EnvManager),
}
LISTS = {name: ", ".join(names) for name, names in REGISTRIES.items()}
OPTIONAL_INT = _Read("integer|default", _number(integer=True))

# How the command line reads each kind of option of fields.py: click's arguments.
KINDS: dict[str, dict[str, Any]] = {
    "text": {}, "int": {"type": int}, "number": {"type": float}, "bool": {"type": click.BOOL},
    "flag": {"is_flag": True}, "int|default": {"type": OPTIONAL_INT},
    "number|default": {"type": _Read("number|default", _number(integer=False))},
    "count": {"type": click.IntRange(min=1)},
    "count|default": {"type": _OptionalCount(min=1)}, "seconds": {"type": FiniteRange(min=0.1, max=86_400)},
    # The variable is read here so that its value meets the same rule, before any store is created.
    "experiment": {"type": ExperimentName(), "envvar": "MLFLOW_EXPERIMENT_NAME"},
    "batch sizes": {"type": _Read("batch sizes", _batch_sizes)},
    # An empty list is a mistake, not the default.
    "numbers": {"type": _Read("numbers", _numbers, absent=("default", "workload", "none"))},
    # A ladder of one goal is the plain study; an empty one is a mistake ('none', the MLproject's: no ladder).
    "goals": {"type": _Read("goals", _goals, absent=("none",))},
    "names": {"type": _Read("text", lambda text: tuple(part.strip() for part in text.split(",")), absent=())},
    "methods": {"type": _Read("text", parse_methods, absent=())},
    "probes": {"type": _Read("text", parse_probes, absent=())},
    "parameterizations": {"type": _Read("text", parse_parameterizations, absent=())},
    **{name: {"type": click.Choice(REGISTRIES[name])}
       for name in ("parameterization", "probe_trials", "coordinates", "grids", "executors", "backends",
                    "env_managers")},
}


def _click_option(option: Option) -> Callable[[Callable], Callable]:
    return click.option(option.flag, option.name, default=None if option.kind == "flag" else option.default,
                        show_default=option.default not in (None, ""), hidden=option.hidden,
                        help=option.help.format(**LISTS), **KINDS[option.kind])


def declared_options(command: str) -> Callable[[Callable[[SimpleNamespace], None]], Callable]:
    """The command's options as fields.COMMAND_OPTIONS declares them; the command gets their values in one
    namespace (``given.batch_size``)."""
    def apply(function: Callable[[SimpleNamespace], None]) -> Callable:
        @functools.wraps(function)
        def parsed(**values: Any) -> None:
            function(SimpleNamespace(**values))
        for option in reversed(COMMAND_OPTIONS[command]):
            parsed = _click_option(option)(parsed)
        return parsed
    return apply


def spec_arguments(given: SimpleNamespace) -> dict[str, Any]:
    """The values that StudySpec.build (or SweepSpec.build) takes, by its argument names."""
    return {name: value for name, value in vars(given).items() if name in SPEC_ARGUMENTS}


# Names a user would guess (dashed, lower case), by the study field meant: each command answers with its own
# option for it (`--bs` in a study, `--batch-sizes` in a sweep), as it does for the field's and its axis' names.
_GUESSES: dict[str, tuple[str, ...]] = {
    "batch_size": ("batch", "batchsize", "b"), "optimizer": ("opt",), "max_steps": ("steps", "max-step"),
    "trials": ("n-trials", "num-trials"), "goal_error": ("goal", "target-error"),
    "pruning": ("pruning-method", "method", "pruner", "pruning-methods", "methods", "pruners"),
}
_TUNED = ("each trial of a study draws it from the workload's search space and the study keeps the "
          "best trial (`edps trials` lists them); choose how many with --trials")
_NOT_OPTIONS: dict[str, str] = {
    "lr": f"the learning rate is tuned, not set: {_TUNED}",
    "learning-rate": f"the learning rate is tuned, not set: {_TUNED}",
    "momentum": f"the momentum is tuned, not set: {_TUNED} (--optimizer momentum or nesterov)",
    "epochs": "a study trains each trial to the goal error, not for epochs: --max-steps caps the steps",
}
# The MLproject entry point that runs each command (`mlflow run . -e <entry point>`).
_ENTRY_POINTS = {"study": "main", "sweep": "sweep"}


def _spellings(command: str) -> dict[str, Option]:
    """Every name that means one of the command's declared options, dashed: its own, and for a study field
    the field's, its axis' and the guesses."""
    options = COMMAND_OPTIONS.get(command, ())
    meant: dict[str, Option] = {}
    for field in STUDY_FIELDS:
        forms = [form for form in (field, field.axis) if form is not None and form.flag]
        ours = next((form for form in forms if form in options), None)
        if ours is not None:
            for form in forms:
                meant.update(dict.fromkeys((form.name.replace("_", "-"), form.flag.lstrip("-")), ours))
            meant.update(dict.fromkeys(_GUESSES.get(field.name, ()), ours))
    return {**meant, **{option.flag.lstrip("-"): option for option in options}}


def usage_line(error: click.UsageError, under_mlflow_run: bool) -> str:
    """click's message on one line; for an unknown option, the option a user meant: ``--batch_size`` (what
    ``mlflow run . -P batch_size=64`` passes) is ``--bs``, ``--lr`` is no option at all (click's own guess goes by
    spelling alone). ``under_mlflow_run``: the command runs as an entry point of the project's MLproject."""
    if isinstance(error, click.NoSuchOption) and error.ctx is not None and error.ctx.command.name:
        line = _hint(error.ctx.command, error.option_name, under_mlflow_run)
        if line is not None:
            return line
    return error.format_message().replace("\n", " ")


def _hint(command: click.Command, typed: str, under_mlflow_run: bool) -> str | None:
    name = typed.lstrip("-").strip().lower().replace("_", "-")
    if name in _NOT_OPTIONS:
        return f"no such option {typed}: {_NOT_OPTIONS[name]}"
    declared = _spellings(command.name).get(name)
    meant = declared.flag.lstrip("-") if declared else name
    if meant not in {spelling.lstrip("-") for param in command.params if isinstance(param, click.Option)
                     for spelling in (*param.opts, *param.secondary_opts)}:
        return None
    entry_point, where = _ENTRY_POINTS.get(command.name), ""
    if under_mlflow_run and entry_point is not None:
        where = (f" (under mlflow run: -P {declared.parameter}=...)" if declared is not None and declared.parameter
                 else f" (not a parameter of the MLproject's {entry_point} entry point)")
    return f"no such option {typed}: did you mean --{meant}{where}?"
