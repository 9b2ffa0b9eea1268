"""The option a user meant when the one typed does not exist: ``--batch_size`` (what ``mlflow run . -P
batch_size=64`` passes, since MLflow appends a parameter the MLproject does not declare as ``--name
value``) is ``--bs``; ``--max_steps`` is ``--max-steps``; ``--bs`` in a sweep is ``--batch-sizes``; ``--lr``
is no option at all (the trials of a study tune the learning rate). click's own guess goes by spelling alone
and answered ``--batch_size`` with ``--pack-size``.

Torch- and MLflow-free: the hint is printed before anything heavy is imported.
"""

from __future__ import annotations

from dataclasses import dataclass

from edps_mlflow.fields import COMMAND_OPTIONS, STUDY_FIELDS, Option

# Names a user would guess (dashed, lower case), by the study field meant: each command answers with its own
# option for it (`--bs` in a study, `--batch-sizes` in a sweep), as it does for the field's and its axis' names.
_GUESSES: dict[str, tuple[str, ...]] = {
    "batch_size": ("batch", "batchsize", "b"), "optimizer": ("opt",), "max_steps": ("steps", "max-step"),
    "trials": ("n-trials", "num-trials"), "goal_error": ("goal", "target-error"),
    "pruning": ("pruning-method", "method", "pruner", "pruning-methods", "methods", "pruners"),
}
_TUNED = ("each trial of a study draws it from the workload's search space and the study keeps the "
          "best trial (`edps trials` lists them); choose how many with --trials")
# Names of things that are not options, and why.
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


@dataclass(frozen=True)
class OptionHint:
    """Where an unknown option of one command should point."""

    command: str
    options: frozenset[str]  # the command's option names, without dashes
    under_mlflow_run: bool  # the command runs as an entry point of the project's MLproject

    def line(self, typed: str) -> str | None:
        """One line for the unknown option ``typed`` (e.g. ``--batch_size``), or None with nothing to say."""
        name = typed.lstrip("-").strip().lower().replace("_", "-")
        if name in _NOT_OPTIONS:
            return f"no such option {typed}: {_NOT_OPTIONS[name]}"
        declared = _spellings(self.command).get(name)
        meant = declared.flag.lstrip("-") if declared else name
        if meant not in self.options:
            return None
        return f"no such option {typed}: did you mean --{meant}{self._under_mlflow_run(declared)}?"

    def _under_mlflow_run(self, option: Option | None) -> str:
        entry_point = _ENTRY_POINTS.get(self.command)
        if not self.under_mlflow_run or entry_point is None:
            return ""
        if option is not None and option.parameter:
            return f" (under mlflow run: -P {option.parameter}=...)"
        return f" (not a parameter of the MLproject's {entry_point} entry point)"
