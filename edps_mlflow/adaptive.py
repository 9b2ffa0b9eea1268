"""The decision rule of an adaptive sweep: which batch sizes to measure next, and when to stop.

    edps sweep --adaptive --workload digits-simple-cnn --sparsities 0,0.5 --target b_crit:2

Adaptivity chooses only *where* to measure. Every point is an ordinary exact study with its ordinary
key (the same trials, goal, cap and check interval as any sweep's), so the registry reuses it like any
other. What a batch size costs decides the order: a study's trial-steps grow about as S(B), which the
hyperbola S(B) = S_min (1 + B_crit / B) makes largest at the smallest batch sizes (on digits, batch 2 and 4
are more than half of a grid's trial-steps). So each curve (curves.CurveId: optimizer x sparsity x
pruning) starts where measurement is cheap, the largest batch sizes of the range (START_POINTS of them),
and walks down one doubling at a time only as far as its question needs; the fit is
``analysis.regimes.fit_table`` (hyperbola, bootstrap intervals, model-free regime boundaries).

The question (``--target``, :class:`Goal`):

- ``b_crit:F`` (the default, F = 2): B_crit's estimate lies at least a factor F inside the measured range
  at both ends (measured points at or below B_crit / F, where steps are about 1 + F times S_min, and at or
  above F x B_crit), the plateau is shown (two batch sizes within the tolerance of each other at the top),
  and the hyperbola describes the curve (``analysis.regimes.fit_warnings``). The bootstrap interval is
  reported with it, not chased: with exact early stopping most studies keep one reaching trial, so the
  interval "says little" (the analysis' note), and narrowing it would spend the smallest, dearest batch
  sizes on noise.
- ``threshold``: the threshold critical batch size (the largest batch size within the tolerance of ideal
  linear scaling from the smallest measured one) with its bracket: measured down until two successive
  doublings at the bottom scale perfectly, so that the smallest point lies in perfect scaling; the
  bracket is then two adjacent powers of two, because the walk measures every power of two it passes.
- ``boundaries``: both regime boundaries between adjacent measured powers of two: the threshold's walk,
  and the plateau shown at the top.

A curve whose walk reaches the end of the range, or whose steps still rise with batch size after the
start and four doublings down (NOISY_AFTER batch sizes), says so and stops spending: more trials per study
would help it, not more batch sizes. So does a curve whose smallest measured batch size reached nothing
within the step cap (smaller ones take more steps). Rounds keep the executor's workers busy (``width``, the
studies the executor runs at once): one batch size per curve with an open question, largest excess first,
and, when there are more workers than such curves, the next doublings down of the curves that are walking
down (the walk's next steps are known in advance: measured early, they save a round of wall clock), never
below where the walk is expected to end (``Uncertainty.walk_to``: for B_crit, the fit's B_crit / target;
for the threshold, the perfect doublings still needed; otherwise one doubling). The sweep stops when no curve has an open
question (``target met``), when what is open cannot be narrowed by another batch size (``exhausted``),
or when ``--max-studies`` or ``--budget`` runs out.

Pure: plain numbers and pandas in, decisions out. No MLflow, no torch, no training.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import Enum

import pandas as pd

from analysis.regimes import fit_table, is_degenerate
from edps_mlflow.curves import CURVE_AXES, CurveId
from edps_mlflow.errors import EdpsError

# Each curve starts with the largest batch sizes of the range: two to show the plateau, one where
# scaling may begin.
START_POINTS = 3
# A curve walks down until this many successive doublings at its bottom scale perfectly (threshold and
# boundaries goals).
PERFECT_DOUBLINGS = 2
# A curve whose steps still rise with batch size after this many measured batch sizes (the start and four
# doublings down) is called too noisy: it stops spending. Fewer would not do: across a plateau steps scatter
# by a third either way (digits, 32 trials: 60 at batch 64, 80 at 1024), and a healthy curve walking down
# through it rises too.
NOISY_AFTER = START_POINTS + 4
# An open question that no fit can size yet (no fit, a doubtful fit, no plateau, a walk not finished)
# counts as this many doublings of excess: larger than any measured one, so it is attended to first.
UNKNOWN_EXCESS = 20.0
BOOTSTRAP_REPEATS = 200
BOOTSTRAP_SEED = 0
TOLERANCE = 0.2  # of the regime boundaries (analysis.regimes)
# Bumped when the rule changes: part of an adaptive sweep's key, so a rerun never replays another rule.
RULE = "walk-down-1"


class Goal(str, Enum):
    """What an adaptive sweep pins (``--target``)."""

    B_CRIT = "b_crit"
    THRESHOLD = "threshold"
    BOUNDARIES = "boundaries"


class UncertaintyKind(str, Enum):
    NO_FIT = "no fit"
    DOUBTFUL_FIT = "doubtful fit"  # analysis.regimes says the hyperbola does not describe the curve
    PLATEAU = "plateau not shown"
    B_CRIT = "B_crit not bracketed"
    PERFECT_SCALING = "perfect scaling not reached"
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
    """What an adaptive sweep pins (``goal``; ``target``: the factor of the B_crit goal) and when it stops
    otherwise: at most ``max_studies`` studies or a ``budget``. ``width``: studies per round (the sweep's
    workers): it changes which batch sizes are measured, so it is part of the key."""

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
        if self.budget is not None and not isinstance(self.budget, Budget):
            raise EdpsError(f"budget must be a Budget, got {self.budget!r}")
        if not isinstance(self.goal, Goal):
            raise EdpsError(f"goal must be a Goal, got {self.goal!r}")
        if isinstance(self.width, bool) or not isinstance(self.width, int) or self.width < 1:
            raise EdpsError(f"width must be a positive integer, got {self.width!r}")

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


def is_power_of_two(value: int) -> bool:
    return isinstance(value, int) and value > 0 and value & (value - 1) == 0


def powers_of_two(low: int, high: int) -> tuple[int, ...]:
    """The powers of two in [low, high]."""
    return tuple(1 << e for e in range(max(low, 1).bit_length() - 1, high.bit_length()) if low <= 1 << e <= high)


def start_grid(batch_sizes: tuple[int, ...]) -> tuple[int, ...]:
    """Where every curve starts: the START_POINTS largest batch sizes of the range (the cheapest)."""
    return tuple(sorted(batch_sizes)[-START_POINTS:])


@dataclass(frozen=True)
class Uncertainty:
    """One open question about one curve: how far from the target (doublings), in words, the batch
    size that would narrow it (None: none left to measure) and, for a walk down, the smallest batch size
    it is expected to need (see ``assess_curve``), below which no free worker measures ahead (None: no
    walk down, nothing measured ahead)."""

    kind: UncertaintyKind
    excess: float
    description: str
    batch_size: int | None
    walk_to: int | None = None

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


def perfect_doublings(points: pd.DataFrame) -> int:
    """How many successive doublings, from the smallest measured batch size up, scale perfectly: steps x
    batch size grows by at most the tolerance (S(2B) 2B <= (1 + TOLERANCE) S(B) B). 0 when the smallest has
    no result."""
    measured = sorted(int(b) for b in points["batch_size"])
    results = {int(b): float(v) for b, v in zip(points["batch_size"], points["steps_to_result"]) if pd.notna(v)}
    count = 0
    for low, high in zip(measured, measured[1:]):
        if high != 2 * low or low not in results or high not in results \
                or results[high] * high > (1.0 + TOLERANCE) * results[low] * low:
            break
        count += 1
    return count


def assess_curve(curve: CurveId, points: pd.DataFrame, trials: pd.DataFrame | None,
                 candidates: tuple[int, ...], settings: AdaptiveSettings) -> CurveState:
    """The fit of one curve's measured points and what is still open about it for ``settings.goal``.

    ``points``: one row per measured study of the curve (``workload, optimizer, sparsity, batch_size,
    steps_to_result, study_key``; ``steps_to_result`` empty when no trial reached the goal);
    ``trials``: the studies' trials (``study_key, status, steps_to_result``) for the bootstrap;
    ``candidates``: the batch sizes the sweep may measure. The walk measures every power of two it passes,
    so the only batch sizes it ever proposes are the next one down and the next one up.
    """
    measured_all = sorted(int(b) for b in points["batch_size"])
    unmeasured = sorted(set(candidates) - set(measured_all))
    down = max((c for c in unmeasured if c < measured_all[0]), default=None)
    up = min((c for c in unmeasured if c > measured_all[-1]), default=None)
    with_result = sorted(int(b) for b, s in zip(points["batch_size"], points["steps_to_result"]) if pd.notna(s))
    fit: dict = {}
    if len(with_result) >= 2:
        fit = fit_table(points, trials, tolerance=TOLERANCE, repeats=BOOTSTRAP_REPEATS,
                        seed=BOOTSTRAP_SEED).iloc[0].to_dict()
    items: list[Uncertainty] = []
    ends = f"the range ends at {measured_all[0]}: more trials per study would help, not more batch sizes"
    # Smaller batch sizes take more steps (the paper's curves fall with batch size): below a smallest
    # measured batch size that no trial brought to the goal within the step cap, none would either.
    capped = (f"no trial at batch size {measured_all[0]} reached the goal within the step cap and smaller "
              f"batch sizes take more: raise --max-steps (or --trials), not the batch sizes"
              if measured_all[0] not in with_result else None)

    def open_below(kind: UncertaintyKind, words: str, excess: float = UNKNOWN_EXCESS,
                   walk_to: int | None = None) -> None:
        """``walk_to``: how far down free workers may measure ahead of the walk; by default one doubling
        below the next step, the most a guess risks."""
        if capped is not None:
            items.append(Uncertainty(kind, excess, f"{words}; {capped}", None))
            return
        if down is None:
            items.append(Uncertainty(kind, excess, f"{words}; {ends}", None))
            return
        items.append(Uncertainty(kind, excess, words, down, down // 2 if walk_to is None else walk_to))

    b_crit = _value(fit, "b_crit")
    if b_crit is None:
        open_below(UncertaintyKind.NO_FIT, f"no fit: {len(with_result)} of {len(measured_all)} measured batch sizes "
                                           f"have a result")
        return CurveState(curve, tuple(measured_all), fit, tuple(items))
    if is_degenerate(fit):
        if "steps rise" in str(fit.get("note")) and len(measured_all) >= NOISY_AFTER:
            # Below the plateau the walk should see steps grow; steps that still fall as batches grow, over
            # this many batch sizes, are trial noise that more batch sizes will not average out.
            items.append(Uncertainty(UncertaintyKind.DOUBTFUL_FIT, UNKNOWN_EXCESS,
                                     f"too noisy to pin: steps rise with batch size over {len(measured_all)} measured "
                                     f"batch sizes; more trials per study would help, not more batch sizes", None))
            return CurveState(curve, tuple(measured_all), fit, tuple(items))
        open_below(UncertaintyKind.DOUBTFUL_FIT, f"doubtful fit: {fit.get('note')}")
    start = _value(fit, "maximal_parallelism_start")
    # Without a plateau the B_crit goal still has the hyperbola's S_min; at the end of the range it is said, not
    # chased. The boundaries goal asks for it.
    if start is None and (up is not None or settings.goal is Goal.BOUNDARIES):
        items.append(Uncertainty(UncertaintyKind.PLATEAU, UNKNOWN_EXCESS,
                                 f"no plateau yet: steps at {with_result[-1]} are not within {TOLERANCE:.0%} of the "
                                 f"next smaller batch size's" + ("" if up else " (the range ends there)"), up))
    if settings.goal is Goal.B_CRIT:
        # B_crit must lie a factor ``target`` inside the measured range at both ends.
        low_end, high_end = b_crit / settings.target, b_crit * settings.target
        interval = (f"; 95% interval {_number(fit.get('b_crit_low'))}..{_number(fit.get('b_crit_high'))}"
                    if _value(fit, "b_crit_low") is not None else "")
        if measured_all[0] > low_end:
            # As far down as the estimate says: the first batch size at or below B_crit / target.
            walk_to = max((c for c in candidates if c <= low_end), default=min(candidates, default=None))
            open_below(UncertaintyKind.B_CRIT,
                       f"B_crit {b_crit:.3g}{interval}: the smallest measured batch size {measured_all[0]} is above "
                       f"B_crit / {settings.target:g} = {low_end:.3g}", math.log2(measured_all[0] / low_end), walk_to)
        elif measured_all[-1] < high_end:
            items.append(Uncertainty(UncertaintyKind.B_CRIT, math.log2(high_end / measured_all[-1]),
                                     f"B_crit {b_crit:.3g}{interval}: the largest measured batch size "
                                     f"{measured_all[-1]} is below B_crit x {settings.target:g}", up))
        return CurveState(curve, tuple(measured_all), fit, tuple(items))
    perfect = perfect_doublings(points)
    if perfect < PERFECT_DOUBLINGS:
        # The walk needs at least this many more doublings: measure that far ahead, no further.
        open_below(UncertaintyKind.PERFECT_SCALING,
                   f"{perfect} of {PERFECT_DOUBLINGS} doublings from {measured_all[0]} up scale perfectly",
                   walk_to=measured_all[0] >> (PERFECT_DOUBLINGS - perfect))
    end = _value(fit, "perfect_scaling_end")
    if end is None:
        items.append(Uncertainty(UncertaintyKind.PERFECT_SCALING_END, UNKNOWN_EXCESS,
                                 f"perfect scaling through the largest batch size with a result ({with_result[-1]})",
                                 up))
    if settings.goal is Goal.BOUNDARIES and start is not None:
        previous = [b for b in with_result if b < start]
        if previous and start > 2 * previous[-1]:  # a gap left by a study without a result
            items.append(Uncertainty(UncertaintyKind.MAXIMAL_PARALLELISM_START, math.log2(start / previous[-1]) - 1,
                                     f"maximal data parallelism starts between {previous[-1]} and {int(start)}",
                                     None))
    return CurveState(curve, tuple(measured_all), fit, tuple(items))


def _number(value: object) -> str:
    return "-" if value is None or pd.isna(value) else f"{float(value):.3g}"


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
           settings: AdaptiveSettings, candidates: tuple[int, ...] = ()) -> Decision:
    """Stop, or measure: one batch size per curve with an open question, largest excess first, then, while
    a round has fewer than ``settings.width`` studies, the next doublings down (among ``candidates``) of
    the curves walking down, round robin.

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
    room = settings.width if settings.max_studies is None else min(settings.width, settings.max_studies - studies)
    if room <= 0:
        return Decision((), StopReason.MAX_STUDIES, tuple(states))
    wanted.sort(key=lambda pair: -pair[1].excess)  # stable: curve order on a tie
    picks = [Pick(state.curve, choice.batch_size, choice.kind, choice.excess, choice.description)
             for state, choice in wanted[:room]]
    # Workers left over: the walks' next steps down, one curve after another, never below where the walk is
    # expected to end (walk_to; the next doubling costs about twice the last: a guess is paid dearly).
    walking = [(state, choice) for state, choice in wanted[:room] if choice.batch_size < state.measured[0]]
    ahead = {state.curve: choice.batch_size for state, choice in walking}
    while len(picks) < room and walking:
        for state, choice in list(walking):
            lower = ahead[state.curve] // 2
            if len(picks) >= room or lower not in candidates or (choice.walk_to is not None and lower < choice.walk_to):
                walking.remove((state, choice))
                continue
            ahead[state.curve] = lower
            picks.append(Pick(state.curve, lower, choice.kind, choice.excess,
                              f"{choice.description} (ahead of the walk: a free worker)"))
    return Decision(tuple(picks), None, tuple(states))


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


def start_rows(curves: list[CurveId], grid: tuple[int, ...]) -> list[dict]:
    return [{"round": 0, "decision": "measure", **c.within_workload(), "batch_size": b,
             "reason": "start: the largest batch sizes", "excess_doublings": None,
             "uncertainty_before": "nothing measured yet", "studies_before": 0, "trial_steps_before": 0}
            for c in curves for b in grid]
