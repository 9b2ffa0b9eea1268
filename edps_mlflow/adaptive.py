"""The decision rule of an adaptive sweep: which batch size each curve measures next, and when to stop.

    edps sweep --adaptive --workload digits-simple-cnn --sparsities 0,0.9 --target 2 --max-studies 16

Adaptivity chooses only *where* to measure. Every point is an ordinary exact study with its ordinary
key (the same trials, goal, cap and check interval as any sweep's), so the registry reuses it like any
other. The rule, per curve (curves.CurveId: optimizer x sparsity x pruning), on the fit of the points measured so far
(``analysis.regimes.fit_table``: hyperbola, bootstrap intervals, model-free regime boundaries):

- B_crit: its 95% interval must lie within a factor ``target`` of the estimate. Its excess is
  ``log2(max(estimate / low, high / estimate)) - log2(target)`` doublings. The batch size that helps
  is an unmeasured power of two inside the interval, as far (in doublings) from every measured one
  as possible, the nearest to the estimate on a tie.
- The end of perfect scaling: the last measured batch size that scales perfectly and the first that
  does not must be adjacent powers of two. Excess: the doublings between them beyond one; the batch
  size that helps bisects them. Perfect scaling through every measured point: extend upwards.
- The start of maximal data parallelism (the plateau): the measured batch size before it must be
  half of it. Excess and choice as above; a curve that has not shown its plateau yet measures
  between its two largest points, else extends upwards.
- A curve without a fit (fewer than 3 points with a result), or whose fit the analysis calls doubtful
  (steps rising with batch size, B_crit far outside the measured range: ``analysis.regimes.fit_warnings``),
  bisects its widest gap first: a B_crit interval of a hyperbola that does not describe the curve
  answers nothing, however narrow.

Each round every curve measures the batch size of its largest excess (one per curve, so a round's
studies run in parallel). The sweep stops when no curve has an excess left (``target met``), when
what is left cannot be narrowed by another batch size (``exhausted``: that needs more trials per
study, which adaptivity never changes), or when ``--max-studies`` or ``--budget`` runs out.

Pure: plain numbers and pandas in, decisions out. No MLflow, no torch, no training.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import Enum

import numpy as np
import pandas as pd

from analysis.regimes import fit_table, is_degenerate
from edps_mlflow.curves import CURVE_AXES, CurveId
from edps_mlflow.errors import EdpsError

# At least this many points per curve in the coarse grid (the hyperbola has two parameters).
COARSE_POINTS = 4
# The coarse grid takes about every 4th power of two of the range.
COARSE_STRIDE = 4
# An interval that is not there (too few bootstrap fits) or a boundary with no bracket counts as
# this many doublings of excess: larger than any measured one, so it is attended to first.
UNKNOWN_EXCESS = 20.0
BOOTSTRAP_REPEATS = 200
BOOTSTRAP_SEED = 0
TOLERANCE = 0.2  # of the regime boundaries (analysis.regimes)


class UncertaintyKind(str, Enum):
    NO_FIT = "no fit"
    DOUBTFUL_FIT = "doubtful fit"  # analysis.regimes says the hyperbola does not describe the curve
    B_CRIT = "B_crit interval"
    PERFECT_SCALING_END = "end of perfect scaling"
    MAXIMAL_PARALLELISM_START = "start of maximal data parallelism"


class StopReason(str, Enum):
    TARGET_MET = "target met"
    EXHAUSTED = "exhausted"  # something is still uncertain but no batch size left could narrow it
    MAX_STUDIES = "max studies"
    BUDGET_STEPS = "budget (trial-steps)"
    BUDGET_TIME = "budget (wall clock)"


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
        if not isinstance(self.kind, BudgetKind):
            raise EdpsError(f"budget kind must be a BudgetKind, got {self.kind!r}")
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


@dataclass(frozen=True)
class AdaptiveSettings:
    """When an adaptive sweep stops: ``target`` (factor of B_crit's 95% interval around its estimate),
    and optionally at most ``max_studies`` studies or a ``budget``."""

    target: float = 2.0
    max_studies: int | None = None
    budget: Budget | None = None

    def __post_init__(self) -> None:
        number = isinstance(self.target, (int, float)) and not isinstance(self.target, bool)
        if not number or not math.isfinite(self.target) or self.target <= 1.0:
            raise EdpsError(f"target must be a factor greater than 1 (e.g. 2), got {self.target!r}")
        if self.max_studies is not None and (isinstance(self.max_studies, bool) or not isinstance(self.max_studies, int)
                                             or self.max_studies < 1):
            raise EdpsError(f"max studies must be a positive integer, got {self.max_studies!r}")
        if self.budget is not None and not isinstance(self.budget, Budget):
            raise EdpsError(f"budget must be a Budget, got {self.budget!r}")

    def key_fields(self) -> dict:
        return {"target": float(self.target), "max_studies": self.max_studies,
                "budget": self.budget.text() if self.budget else None}


def is_power_of_two(value: int) -> bool:
    return isinstance(value, int) and value > 0 and value & (value - 1) == 0


def powers_of_two(low: int, high: int) -> tuple[int, ...]:
    """The powers of two in [low, high]."""
    return tuple(1 << e for e in range(max(low, 1).bit_length() - 1, high.bit_length()) if low <= 1 << e <= high)


def coarse_grid(batch_sizes: tuple[int, ...]) -> tuple[int, ...]:
    """About every COARSE_STRIDE-th power of two of the range, evenly spread in log2, both ends included,
    at least COARSE_POINTS points (all of them when the range is that short)."""
    ordered = sorted(batch_sizes)
    count = max(COARSE_POINTS, math.ceil((len(ordered) - 1) / COARSE_STRIDE) + 1)
    if count >= len(ordered):
        return tuple(ordered)
    indices = sorted({int(round(i)) for i in np.linspace(0, len(ordered) - 1, count)})
    return tuple(ordered[i] for i in indices)


@dataclass(frozen=True)
class Uncertainty:
    """One open question about one curve: how far from the target (doublings), in words, and the batch
    size that would narrow it (None: none left to measure)."""

    kind: UncertaintyKind
    excess: float
    description: str
    batch_size: int | None

    @property
    def open(self) -> bool:
        return self.excess > 0


@dataclass(frozen=True)
class CurveState:
    """A curve's fit and its uncertainties after the points measured so far."""

    curve: CurveId
    measured: tuple[int, ...]
    fit: dict
    uncertainties: tuple[Uncertainty, ...]

    @property
    def open(self) -> list[Uncertainty]:
        return [u for u in self.uncertainties if u.open]

    def next_batch_size(self) -> Uncertainty | None:
        """The open uncertainty with the largest excess that some batch size can still narrow."""
        actionable = [u for u in self.open if u.batch_size is not None]
        order = list(UncertaintyKind)
        return max(actionable, key=lambda u: (u.excess, -order.index(u.kind))) if actionable else None

    def summary(self) -> str:
        return "; ".join(u.description for u in self.open) or "resolved"


def _value(fit: dict, name: str) -> float | None:
    value = fit.get(name)
    return None if value is None or pd.isna(value) else float(value)


def _distance(b: int, measured: list[int]) -> float:
    return min(abs(math.log2(b / m)) for m in measured) if measured else math.inf


def _bisect(low: int, high: int, candidates: list[int]) -> int | None:
    """The unmeasured power of two nearest the log-midpoint of (low, high), the smaller on a tie."""
    inside = [c for c in candidates if low < c < high]
    if not inside:
        return None
    middle = (math.log2(low) + math.log2(high)) / 2
    return min(inside, key=lambda c: (abs(math.log2(c) - middle), c))


def _widest_gap(measured: list[int], unmeasured: list[int]) -> int | None:
    """The batch size that bisects the widest gap between measured ones (else the next above them)."""
    gaps = sorted(((math.log2(high / low), low, high) for low, high in zip(measured, measured[1:])), reverse=True)
    for _, low, high in gaps:
        choice = _bisect(low, high, unmeasured)
        if choice is not None:
            return choice
    above = [c for c in unmeasured if c > measured[-1]] if measured else unmeasured
    return above[0] if above else None


def _gap_text(low: int, high: int) -> str:
    return f"between {low} and {high} ({math.log2(high / low):.0f} doublings apart)"


def assess_curve(curve: CurveId, points: pd.DataFrame, trials: pd.DataFrame | None,
                 candidates: tuple[int, ...], target: float) -> CurveState:
    """The fit of one curve's measured points and what is still uncertain about it.

    ``points``: one row per measured study of the curve (``workload, optimizer, sparsity, batch_size,
    steps_to_result, study_key``; ``steps_to_result`` empty when no trial reached the goal);
    ``trials``: the studies' trials (``study_key, status, steps_to_result``) for the bootstrap;
    ``candidates``: the batch sizes the sweep may measure.
    """
    measured_all = sorted(int(b) for b in points["batch_size"])
    unmeasured = sorted(set(candidates) - set(measured_all))
    with_result = sorted(int(b) for b, s in zip(points["batch_size"], points["steps_to_result"]) if pd.notna(s))
    fit: dict = {}
    if len(with_result) >= 2:
        fit = fit_table(points, trials, tolerance=TOLERANCE, repeats=BOOTSTRAP_REPEATS,
                        seed=BOOTSTRAP_SEED).iloc[0].to_dict()
    items: list[Uncertainty] = []
    b_crit = _value(fit, "b_crit")
    if b_crit is None:
        items.append(Uncertainty(UncertaintyKind.NO_FIT, UNKNOWN_EXCESS,
                                 f"no fit: {len(with_result)} of {len(measured_all)} measured batch sizes have a "
                                 f"result",
                                 _widest_gap(measured_all, unmeasured)))
        return CurveState(curve, tuple(measured_all), fit, tuple(items))
    if is_degenerate(fit):
        items.append(Uncertainty(UncertaintyKind.DOUBTFUL_FIT, UNKNOWN_EXCESS, f"doubtful fit: {fit.get('note')}",
                                 _widest_gap(measured_all, unmeasured)))
    low, high = _value(fit, "b_crit_low"), _value(fit, "b_crit_high")
    if low is None or high is None or low <= 0:
        inside = unmeasured
        excess, words = UNKNOWN_EXCESS, f"B_crit {b_crit:.3g} has no 95% interval (too few bootstrap fits)"
    else:
        inside = [c for c in unmeasured if low <= c <= high]
        factor = max(b_crit / low, high / b_crit)
        excess = math.log2(factor) - math.log2(target)
        words = (f"B_crit {b_crit:.3g}, 95% interval {low:.3g}..{high:.3g} (within x{factor:.2g} of the estimate; "
                 f"target x{target:g})")
    choice = min(inside, key=lambda c: (-_distance(c, measured_all), abs(math.log2(c / b_crit)), c)) if inside else None
    items.append(Uncertainty(UncertaintyKind.B_CRIT, excess, words, choice))

    end = _value(fit, "perfect_scaling_end")
    # Perfect scaling ends after the largest batch size with a result below perfect_scaling_end.
    last = max((b for b in with_result if b < end), default=None) if end is not None else None
    above = [c for c in unmeasured if c > with_result[-1]]
    if end is None:
        items.append(Uncertainty(UncertaintyKind.PERFECT_SCALING_END, UNKNOWN_EXCESS,
                                 f"perfect scaling through the largest batch size with a result ({with_result[-1]})",
                                 above[0] if above else None))
    elif last is not None:
        last_b, end_b = int(last), int(end)
        items.append(Uncertainty(UncertaintyKind.PERFECT_SCALING_END, math.log2(end_b / last_b) - 1,
                                 f"perfect scaling ends {_gap_text(last_b, end_b)}",
                                 _bisect(last_b, end_b, unmeasured)))

    start = _value(fit, "maximal_parallelism_start")
    if start is None:
        # No plateau of two points yet: between the two largest points, else beyond the largest.
        below = with_result[-2] if len(with_result) >= 2 else with_result[-1]
        choice = _bisect(below, with_result[-1], unmeasured) or (above[0] if above else None)
        items.append(Uncertainty(UncertaintyKind.MAXIMAL_PARALLELISM_START, UNKNOWN_EXCESS,
                                 f"no plateau yet: steps at {with_result[-1]} are not within {TOLERANCE:.0%} of "
                                 f"another measured batch size's", choice))
    else:
        start_b = int(start)
        previous = [b for b in with_result if b < start_b]
        if previous:
            items.append(Uncertainty(UncertaintyKind.MAXIMAL_PARALLELISM_START,
                                     math.log2(start_b / previous[-1]) - 1,
                                     f"maximal data parallelism starts {_gap_text(previous[-1], start_b)}",
                                     _bisect(previous[-1], start_b, unmeasured)))
    return CurveState(curve, tuple(measured_all), fit, tuple(items))


@dataclass(frozen=True)
class Pick:
    """One batch size chosen for one curve, why, and the uncertainty before it was measured."""

    curve: CurveId
    batch_size: int
    reason: UncertaintyKind
    excess: float
    uncertainty: str


@dataclass(frozen=True)
class Decision:
    """The outcome of one round's assessment: batch sizes to measure next, or why the sweep stops."""

    picks: tuple[Pick, ...]
    stop: StopReason | None
    states: tuple[CurveState, ...]

    def uncertain(self) -> list[str]:
        """What is still uncertain, one line per curve that has anything open."""
        return [f"{curve_label(s.curve)}: {s.summary()}" for s in self.states if s.open]


def curve_label(curve: CurveId) -> str:
    return curve.label()


def decide(states: list[CurveState], studies: int, trial_steps: int, seconds: float,
           settings: AdaptiveSettings) -> Decision:
    """Stop, or measure one batch size per curve with an open question, largest excess first.

    ``studies``, ``trial_steps`` and ``seconds``: what the sweep has spent so far (seconds: this
    invocation's wall clock). A limit is checked before a round starts; a round once started finishes.
    """
    wanted = [(state, choice) for state in states if (choice := state.next_batch_size()) is not None]
    if not wanted:
        reason = StopReason.TARGET_MET if not any(s.open for s in states) else StopReason.EXHAUSTED
        return Decision((), reason, tuple(states))
    budget = settings.budget
    if budget is not None and budget.kind is BudgetKind.TRIAL_STEPS and trial_steps >= budget.amount:
        return Decision((), StopReason.BUDGET_STEPS, tuple(states))
    if budget is not None and budget.kind is BudgetKind.SECONDS and seconds >= budget.amount:
        return Decision((), StopReason.BUDGET_TIME, tuple(states))
    room = len(wanted) if settings.max_studies is None else settings.max_studies - studies
    if room <= 0:
        return Decision((), StopReason.MAX_STUDIES, tuple(states))
    wanted.sort(key=lambda pair: -pair[1].excess)  # stable: curve order on a tie
    picks = tuple(Pick(state.curve, choice.batch_size, choice.kind, choice.excess, choice.description)
                  for state, choice in wanted[:room])
    return Decision(picks, None, tuple(states))


# The curve's columns are its axes within the sweep's workload (optimizer, sparsity, pruning).
DECISION_COLUMNS = ("round", "decision", *(a for a in CURVE_AXES if a != "workload"), "batch_size", "reason",
                    "excess_doublings", "uncertainty_before", "studies_before", "trial_steps_before")


def decision_rows(round_index: int, decision: Decision, studies: int, trial_steps: int) -> list[dict]:
    """The decision table's rows of one round: one per pick, or one 'stop' row per curve."""
    if decision.stop is None:
        return [{"round": round_index, "decision": "measure", **p.curve.within_workload(), "batch_size": p.batch_size,
                 "reason": p.reason.value, "excess_doublings": round(p.excess, 3),
                 "uncertainty_before": p.uncertainty, "studies_before": studies, "trial_steps_before": trial_steps}
                for p in decision.picks]
    return [{"round": round_index, "decision": f"stop: {decision.stop.value}", **s.curve.within_workload(),
             "batch_size": None, "reason": "", "excess_doublings": None,
             "uncertainty_before": s.summary(), "studies_before": studies, "trial_steps_before": trial_steps}
            for s in decision.states]


def coarse_rows(curves: list[CurveId], grid: tuple[int, ...]) -> list[dict]:
    return [{"round": 0, "decision": "measure", **c.within_workload(), "batch_size": b,
             "reason": "coarse grid", "excess_doublings": None, "uncertainty_before": "nothing measured yet",
             "studies_before": 0, "trial_steps_before": 0} for c in curves for b in grid]
