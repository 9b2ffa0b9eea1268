"""The option a user meant when the one typed does not exist: ``--batch_size`` (what ``mlflow run . -P
batch_size=64`` passes, since MLflow appends a parameter the MLproject does not declare as ``--name
value``) is ``--bs``; ``--max_steps`` is ``--max-steps``; ``--lr`` is no option at all (the trials of a
study tune the learning rate). click's own guess goes by spelling alone and answered ``--batch_size``
with ``--pack-size``.

Torch- and MLflow-free: the hint is printed before anything heavy is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import yaml

# Names a user would guess (dashed, lower case) -> the option of each command they mean.
_ALIASES: dict[str, dict[str, str]] = {
    "study": {
        "batch-size": "bs", "batch": "bs", "batchsize": "bs", "b": "bs", "batch-sizes": "bs",
        "sparsities": "sparsity", "optimizers": "optimizer", "opt": "optimizer",
        "steps": "max-steps", "max-step": "max-steps", "n-trials": "trials", "num-trials": "trials",
        "goal": "goal-error", "target-error": "goal-error",
        "pruning-method": "pruning", "method": "pruning", "pruner": "pruning", "prunings": "pruning",
    },
    "sweep": {
        "batch-size": "batch-sizes", "batch": "batch-sizes", "batchsize": "batch-sizes", "bs": "batch-sizes",
        "b": "batch-sizes", "sparsity": "sparsities", "optimizer": "optimizers", "opt": "optimizers",
        "steps": "max-steps", "max-step": "max-steps", "n-trials": "trials", "num-trials": "trials",
        "goal": "goal-error", "target-error": "goal-error",
        "pruning-methods": "pruning", "methods": "pruning", "pruners": "pruning", "prunings": "pruning",
    },
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


@dataclass(frozen=True)
class OptionHint:
    """Where an unknown option of one command should point."""

    command: str
    options: frozenset[str]  # the command's option names, without dashes
    mlproject: Path | None  # the project's MLproject when running under `mlflow run`, else None

    def line(self, typed: str) -> str | None:
        """One line for the unknown option ``typed`` (e.g. ``--batch_size``), or None with nothing to say."""
        name = typed.lstrip("-").strip().lower().replace("_", "-")
        if name in _NOT_OPTIONS:
            return f"no such option {typed}: {_NOT_OPTIONS[name]}"
        meant = name if name in self.options else _ALIASES.get(self.command, {}).get(name)
        if meant is None or meant not in self.options:
            return None
        return f"no such option {typed}: did you mean --{meant}{self._under_mlflow_run(meant)}?"

    def _under_mlflow_run(self, option: str) -> str:
        if self.mlproject is None:
            return ""
        parameter = option.replace("-", "_")
        entry_point = _ENTRY_POINTS.get(self.command, "")
        if parameter in _parameters(self.mlproject, entry_point):
            return f" (under mlflow run: -P {parameter}=...)"
        return f" (not a parameter of the MLproject's {entry_point} entry point)"


def _parameters(mlproject: Path, entry_point: str) -> Iterable[str]:
    try:
        spec = yaml.safe_load(mlproject.read_text())
        return tuple(spec["entry_points"][entry_point].get("parameters", {}))
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        return ()
