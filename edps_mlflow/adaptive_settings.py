"""What an adaptive sweep pins (``--target``), its width and its limits (``--max-studies``, ``--budget``): the
settings in its key (adaptive.py has the rule)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import Enum

from edps_mlflow.errors import EdpsError


class BudgetKind(str, Enum):
    TRIAL_STEPS = "steps"
    SECONDS = "seconds"


_BUDGET = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+]?[0-9]+)?)\s*(steps|s|m|h)\s*$")
_SECONDS_PER = {"s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class Budget:
    """A limit on trial-steps (every trial's steps, over the sweep's measured studies) or on this
    invocation's wall-clock seconds."""

    kind: BudgetKind
    amount: float

    def __post_init__(self) -> None:
        if isinstance(self.amount, bool) or not math.isfinite(self.amount) or self.amount <= 0:
            raise EdpsError(f"a budget must be a positive finite amount, got {self.amount!r}")

    @classmethod
    def parse(cls, text: str) -> "Budget":
        """``2e6steps`` (trial-steps), ``90s``, ``30m`` or ``2h`` (wall clock)."""
        match = _BUDGET.match(text or "")
        if match is None:
            raise EdpsError(f"budget {text!r} is not <number>steps (trial-steps, e.g. 2e6steps) or <number>s|m|h "
                            f"(wall clock, e.g. 30m)")
        number, unit = float(match.group(1)), match.group(2)
        if unit == "steps":
            return cls(BudgetKind.TRIAL_STEPS, number)
        return cls(BudgetKind.SECONDS, number * _SECONDS_PER[unit])

    def text(self) -> str:
        """The canonical spelling (part of the adaptive sweep's key)."""
        return f"{self.amount:g}steps" if self.kind is BudgetKind.TRIAL_STEPS else f"{self.amount:g}s"


# Part of an adaptive sweep's key: bumped when the rule changes, so a rerun never replays another rule.
RULE = "walk-down-1"


class Goal(str, Enum):
    """What an adaptive sweep pins (``--target``)."""

    B_CRIT = "b_crit"
    THRESHOLD = "threshold"
    BOUNDARIES = "boundaries"


@dataclass(frozen=True)
class AdaptiveSettings:
    """What an adaptive sweep pins (``goal``; ``target``: the B_crit goal's factor) and when it stops otherwise;
    ``width``: studies per round (the sweep's workers), part of the key: it changes which batch sizes are measured."""

    target: float = 2.0
    max_studies: int | None = None
    budget: Budget | None = None
    goal: Goal = Goal.B_CRIT
    width: int = 1

    def __post_init__(self) -> None:
        number = isinstance(self.target, (int, float)) and not isinstance(self.target, bool)
        if not number or not math.isfinite(self.target) or self.target <= 1.0:
            raise EdpsError(f"target must be a factor greater than 1 (e.g. 2), got {self.target!r}")
        if self.max_studies is not None and (isinstance(self.max_studies, bool) or not isinstance(self.max_studies, int)
                                             or self.max_studies < 1):
            raise EdpsError(f"max studies must be a positive integer, got {self.max_studies!r}")

    @classmethod
    def parse_target(cls, text: str) -> tuple[Goal, float]:
        """``--target``: ``b_crit`` or ``b_crit:F`` (a bare ``F`` too), ``threshold`` or ``boundaries``."""
        name, colon, factor = (text or "").strip().partition(":")
        try:
            if not colon and name and name[0].isdigit():
                return Goal.B_CRIT, float(name)
            goal = Goal(name)
            if colon and (goal is not Goal.B_CRIT or not factor):
                raise ValueError
            return goal, float(factor) if factor else 2.0
        except ValueError:
            raise EdpsError(f"target {text!r} is not b_crit, b_crit:<factor> (e.g. b_crit:2), threshold or "
                            f"boundaries") from None

    def target_text(self) -> str:
        return f"b_crit:{self.target:g}" if self.goal is Goal.B_CRIT else self.goal.value

    def key_fields(self) -> dict:
        return {"rule": RULE, "goal": self.goal.value, "target": float(self.target), "width": self.width,
                "max_studies": self.max_studies, "budget": self.budget.text() if self.budget else None}
