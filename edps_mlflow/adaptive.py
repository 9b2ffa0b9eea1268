"""The decision rule of an adaptive sweep: which batch sizes to measure next, and when to stop.

Each curve (curves.CurveId) starts at the largest, cheapest batch sizes of the range and walks down one
doubling at a time only as far as its question (``--target``, :class:`Goal`) needs; every point is an
ordinary study with its ordinary key. With replicates, an answered question's deciding points get studies of
the other seeds. docs/adaptive.md states the rule, its goals and its stops. Pure: plain
numbers and pandas in, decisions out; no MLflow, no torch, no training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import pandas as pd

from analysis.fits import regime_boundaries, threshold_critical_batch
from analysis.regimes import fit_table, fit_value, is_degenerate
from analysis.replicates import point_steps
from edps_mlflow.adaptive_settings import AdaptiveSettings, Budget, BudgetKind, Goal
from edps_mlflow.curves import CURVE_AXES, CurveId

# Two batch sizes show the plateau, one more where scaling may begin.
START_POINTS = 3
# Successive perfect doublings at a curve's bottom that the threshold and boundaries goals walk down to.
PERFECT_DOUBLINGS = 2
# Steps still rising with batch size after the start and four doublings down is trial noise: across a
# plateau steps scatter by a third either way, so fewer batch sizes would call healthy curves noisy.
NOISY_AFTER = START_POINTS + 4
# The excess, in doublings, of a question no fit can size yet: larger than any measured one, so first.
UNKNOWN_EXCESS = 20.0
BOOTSTRAP_REPEATS = 200
BOOTSTRAP_SEED = 0
TOLERANCE = 0.2  # of the regime boundaries (analysis.regimes)
class UncertaintyKind(str, Enum):
    NO_FIT = "no fit"
    DOUBTFUL_FIT = "doubtful fit"  # analysis.regimes says the hyperbola does not describe the curve
    PLATEAU = "plateau not shown"
    B_CRIT = "B_crit not bracketed"
    PERFECT_SCALING = "perfect scaling not reached"
    PERFECT_SCALING_END = "end of perfect scaling"
    MAXIMAL_PARALLELISM_START = "start of maximal data parallelism"
    REPLICATE = "replicate"  # not an open question: a deciding point of an answered one has too few replicates


class StopReason(str, Enum):
    TARGET_MET = "target met"
    EXHAUSTED = "exhausted"  # something is still uncertain but no batch size left could narrow it
    MAX_STUDIES = "max studies"
    BUDGET_STEPS = "budget (trial-steps)"
    BUDGET_TIME = "budget (wall clock)"


def powers_of_two(low: int, high: int) -> tuple[int, ...]:
    """The powers of two in [low, high]."""
    return tuple(1 << e for e in range(max(low, 1).bit_length() - 1, high.bit_length()) if low <= 1 << e <= high)


def start_grid(batch_sizes: tuple[int, ...]) -> tuple[int, ...]:
    """Where every curve starts: the START_POINTS largest batch sizes of the range (the cheapest)."""
    return tuple(sorted(batch_sizes)[-START_POINTS:])


@dataclass(frozen=True)
class Uncertainty:
    """One open question about one curve: how far from the target (doublings), in words, the batch size that
    would narrow it (None: none left) and, for a walk down, the smallest it is expected to need (``walk_to``)."""

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
    """A curve's fit and its uncertainties after the points measured so far; ``goal``: the rung of a goal ladder
    it is the curve of (each rung is a curve of its own, measured by the same studies), None without a ladder."""

    curve: CurveId
    measured: tuple[int, ...]
    fit: dict
    uncertainties: tuple[Uncertainty, ...]
    goal: float | None = None
    # The sweep's study seeds (replicate 0 first), the studies its deciding points still need, and the
    # replicates per measured batch size.
    seeds: tuple[int, ...] = ()
    replicates: tuple[Replicate, ...] = ()
    counts: tuple[tuple[int, int], ...] = ()

    def label(self) -> str:
        return self.curve.label() + ("" if self.goal is None else f" goal<={self.goal:g}")

    @property
    def open(self) -> list[Uncertainty]:
        return [u for u in self.uncertainties if u.open]

    def next_batch_size(self) -> Uncertainty | None:
        """The open uncertainty with the largest excess that some batch size can still narrow."""
        actionable = [u for u in self.open if u.batch_size is not None]
        order = list(UncertaintyKind)
        return max(actionable, key=lambda u: (u.excess, -order.index(u.kind))) if actionable else None

    def summary(self) -> str:
        if self.open or not self.replicates:
            return "; ".join(u.description for u in self.open) or "resolved"
        short = {r.batch_size: r.index for r in reversed(self.replicates)}  # the first replicate missing
        return (f"deciding points short of {len(self.seeds)} replicates: "
                + ", ".join(f"{b} ({index} of {len(self.seeds)})" for b, index in sorted(short.items())))


def uncertain(states: tuple[CurveState, ...] | list[CurveState]) -> list[str]:
    """What is still uncertain, one line per curve that has anything open or replicates missing."""
    return [f"{s.label()}: {s.summary()}" for s in states if s.open or s.replicates]


def number(value: object, digits: int = 3) -> str:
    return "-" if value is None or pd.isna(value) else f"{float(value):.{digits}g}"


def perfect_doublings(points: pd.DataFrame) -> int:
    """How many successive doublings from the smallest measured batch size up scale perfectly (S(2B) 2B <= (1 +
    TOLERANCE) S(B) B); 0 when the smallest has no result."""
    measured = sorted(int(b) for b in points["batch_size"])
    results = {int(b): float(v) for b, v in zip(points["batch_size"], points["steps_to_result"]) if pd.notna(v)}
    count = 0
    for low, high in zip(measured, measured[1:]):
        if high != 2 * low or low not in results or high not in results \
                or results[high] * high > (1.0 + TOLERANCE) * results[low] * low:
            break
        count += 1
    return count


@dataclass(frozen=True)
class _Walk:
    """A curve's measured batch sizes and where its walk may go: the next unmeasured candidate down and up
    (the walk measures every power of two it passes, so it never proposes any other)."""

    measured: tuple[int, ...]
    with_result: tuple[int, ...]
    down: int | None
    up: int | None

    @classmethod
    def of(cls, points: pd.DataFrame, candidates: tuple[int, ...]) -> "_Walk":
        measured = tuple(sorted(int(b) for b in points["batch_size"]))
        unmeasured = set(candidates) - set(measured)
        with_result = sorted(int(b) for b, s in zip(points["batch_size"], points["steps_to_result"]) if pd.notna(s))
        return cls(measured, tuple(with_result), max((c for c in unmeasured if c < measured[0]), default=None),
                   min((c for c in unmeasured if c > measured[-1]), default=None))

    def below(self, kind: UncertaintyKind, words: str, excess: float = UNKNOWN_EXCESS,
              walk_to: int | None = None) -> Uncertainty:
        """A question the next batch size down narrows; free workers measure ahead down to ``walk_to``, by
        default one doubling below that step, the most a guess risks."""
        bottom = self.measured[0]
        if bottom not in self.with_result:
            # Smaller batch sizes take more steps: below one that reached nothing within the cap, none would.
            return Uncertainty(kind, excess, f"{words}; no trial at batch size {bottom} reached the goal within the "
                               f"step cap and smaller batch sizes take more: raise --max-steps (or --trials), not "
                               f"the batch sizes", None)
        if self.down is None:
            return Uncertainty(kind, excess, f"{words}; the range ends at {bottom}: more trials per study would "
                               f"help, not more batch sizes", None)
        return Uncertainty(kind, excess, words, self.down, self.down // 2 if walk_to is None else walk_to)


def assess_curve(curve: CurveId, points: pd.DataFrame, trials: pd.DataFrame | None,
                 candidates: tuple[int, ...], settings: AdaptiveSettings, goal: float | None = None,
                 seeds: tuple[int, ...] = ()) -> CurveState:
    """The fit of one curve's points (a row per study: its axes, ``batch_size, steps_to_result, study_key`` and,
    with replicates, ``seed``) and what is still open for ``settings.goal``; ``candidates``: the batch sizes the
    sweep may measure; ``goal``: the ladder's rung the points are steps to; ``seeds``: the sweep's study seeds.
    The walk sees one value per batch size (analysis.replicates.point_steps), however many seeds it has."""
    values = point_values(points)
    walk = _Walk.of(values, candidates)
    fit: dict = {}
    if len(walk.with_result) >= 2:
        fit = fit_table(points, trials, tolerance=TOLERANCE, repeats=BOOTSTRAP_REPEATS,
                        seed=BOOTSTRAP_SEED).iloc[0].to_dict()
    questions = tuple(_questions(walk, fit, values, candidates, settings))
    replicates = () if any(u.open for u in questions) else missing_replicates(points, values, fit, settings.goal,
                                                                              seeds)
    counts = tuple((int(b), int(k)) for b, k in zip(values["batch_size"], values["replicates"]))
    return CurveState(curve, walk.measured, fit, questions, goal, tuple(seeds), replicates, counts)


def point_values(points: pd.DataFrame) -> pd.DataFrame:
    """One row per batch size (analysis.replicates.point_steps); a point of one study keeps its steps exactly, as
    a geometric mean of one may end an ulp off them and turn a tie of the scaling tests (16 x 300 = 1.2 x 8 x 500)."""
    values = point_steps(points)
    own = pd.to_numeric(points["steps_to_result"], errors="coerce").groupby(points["batch_size"]).first()
    single = values["replicates"] == 1
    values.loc[single, "steps_to_result"] = own.reindex(values.loc[single, "batch_size"]).to_numpy()
    return values


@dataclass(frozen=True)
class Replicate:
    """A study that a deciding point of a curve still needs: replicate ``index`` (0: the walk's own) of ``of``."""

    batch_size: int
    seed: int
    index: int
    of: int
    why: str

    def description(self) -> str:
        return f"replicate {self.index + 1} of {self.of} at {self.batch_size}: decides {self.why}"


def deciding_points(values: pd.DataFrame, fit: dict, goal: Goal) -> dict[int, str]:
    """The measured batch sizes (one value each, those with a result) on which ``goal``'s answer rests, and why:
    B_crit's, the batch sizes either side of it and both ends; the threshold's (threshold_critical_batch), its
    reference (the smallest), the last that passes and the first that fails; the boundaries', the reference,
    the batch sizes either side of each boundary (regime_boundaries) and the largest (the plateau's level)."""
    known = values[values["steps_to_result"].notna()]
    b, s = known["batch_size"].to_numpy(dtype=int), known["steps_to_result"].to_numpy(dtype=float)
    roles: dict[int, list[str]] = {}
    if len(b) < 2:
        return {}

    def add(size: int, subject: str, role: str) -> None:
        roles.setdefault(int(size), []).append(f"{subject} ({role})")

    if goal is Goal.B_CRIT:
        b_crit = fit_value(fit, "b_crit")
        add(b[0], "B_crit", "the smallest batch size")
        add(b[-1], "B_crit", "the largest batch size")
        if b_crit is not None and (b <= b_crit).any():
            add(b[b <= b_crit][-1], "B_crit", "the batch size below it")
        if b_crit is not None and (b >= b_crit).any():
            add(b[b >= b_crit][0], "B_crit", "the batch size above it")
        return {size: ", ".join(why) for size, why in sorted(roles.items())}
    subject = "the threshold" if goal is Goal.THRESHOLD else "the end of perfect scaling"
    bounds = regime_boundaries(b, s, TOLERANCE)
    add(b[0], subject, "its reference, the smallest batch size")
    add(threshold_critical_batch(b, s, TOLERANCE), subject, "the last batch size in perfect scaling")
    if bounds.perfect_scaling_end is not None:
        add(bounds.perfect_scaling_end, subject, "the first batch size beyond perfect scaling")
    if goal is Goal.BOUNDARIES:
        start = bounds.maximal_parallelism_start
        if start is not None and start > b[0]:
            add(b[b < start][-1], "the start of maximal data parallelism", "the batch size before it")
            add(start, "the start of maximal data parallelism", "its first batch size")
        add(b[-1], "the plateau", "the largest batch size")
    return {size: ", ".join(why) for size, why in sorted(roles.items())}


def missing_replicates(points: pd.DataFrame, values: pd.DataFrame, fit: dict, goal: Goal,
                       seeds: tuple[int, ...]) -> tuple[Replicate, ...]:
    """The studies (batch size, seed) that the deciding points lack of ``seeds``: every replicate, in order;
    none with one seed. A study row without a ``seed`` column is replicate 0's."""
    if len(seeds) < 2:
        return ()
    seed_of = points["seed"] if "seed" in points.columns else pd.Series(seeds[0], index=points.index)
    have = {int(b): set(group.astype(int)) for b, group in seed_of.groupby(points["batch_size"])}
    return tuple(Replicate(size, seed, index, len(seeds), why)
                 for size, why in deciding_points(values, fit, goal).items()
                 for index, seed in enumerate(seeds) if seed not in have.get(size, set()))


def _questions(walk: _Walk, fit: dict, points: pd.DataFrame, candidates: tuple[int, ...],
               settings: AdaptiveSettings) -> list[Uncertainty]:
    """The fit's own questions (none, doubtful, no plateau), then the goal's."""
    b_crit = fit_value(fit, "b_crit")
    if b_crit is None:
        return [walk.below(UncertaintyKind.NO_FIT, f"no fit: {len(walk.with_result)} of {len(walk.measured)} "
                                                   f"measured batch sizes have a result")]
    items = []
    if is_degenerate(fit):
        if "steps rise" in str(fit.get("note")) and len(walk.measured) >= NOISY_AFTER:
            return [Uncertainty(UncertaintyKind.DOUBTFUL_FIT, UNKNOWN_EXCESS,
                                f"too noisy to pin: steps rise with batch size over {len(walk.measured)} measured "
                                f"batch sizes; more trials per study would help, not more batch sizes", None)]
        items.append(walk.below(UncertaintyKind.DOUBTFUL_FIT, f"doubtful fit: {fit.get('note')}"))
    # Without a plateau the B_crit goal still has the hyperbola's S_min: at the end of the range it is said,
    # not chased. The boundaries goal asks for it.
    plateau_wanted = walk.up is not None or settings.goal is Goal.BOUNDARIES
    if fit_value(fit, "maximal_parallelism_start") is None and plateau_wanted:
        items.append(Uncertainty(UncertaintyKind.PLATEAU, UNKNOWN_EXCESS,
                                 f"no plateau yet: steps at {walk.with_result[-1]} are not within {TOLERANCE:.0%} of "
                                 f"the next smaller batch size's" + ("" if walk.up else " (the range ends there)"),
                                 walk.up))
    if settings.goal is Goal.B_CRIT:
        return items + _b_crit_questions(walk, fit, b_crit, candidates, settings.target)
    return items + _scaling_questions(walk, fit, points, settings.goal)


def _b_crit_questions(walk: _Walk, fit: dict, b_crit: float, candidates: tuple[int, ...],
                      target: float) -> list[Uncertainty]:
    """B_crit must lie a factor ``target`` inside the measured range at both ends."""
    low_end, high_end = b_crit / target, b_crit * target
    interval = (f"; 95% interval {number(fit.get('b_crit_low'))}..{number(fit.get('b_crit_high'))}"
                if fit_value(fit, "b_crit_low") is not None else "")
    bottom, top = walk.measured[0], walk.measured[-1]
    if bottom > low_end:
        # As far down as the estimate says: the first batch size at or below B_crit / target.
        walk_to = max((c for c in candidates if c <= low_end), default=min(candidates, default=None))
        return [walk.below(UncertaintyKind.B_CRIT, f"B_crit {b_crit:.3g}{interval}: the smallest measured batch "
                           f"size {bottom} is above B_crit / {target:g} = {low_end:.3g}",
                           math.log2(bottom / low_end), walk_to)]
    if top < high_end:
        return [Uncertainty(UncertaintyKind.B_CRIT, math.log2(high_end / top), f"B_crit {b_crit:.3g}{interval}: the "
                            f"largest measured batch size {top} is below B_crit x {target:g}", walk.up)]
    return []


def _scaling_questions(walk: _Walk, fit: dict, points: pd.DataFrame, goal: Goal) -> list[Uncertainty]:
    """The threshold and boundaries goals: a bottom in perfect scaling, its end, and (boundaries) the start
    of maximal data parallelism between adjacent measured batch sizes."""
    items = []
    perfect = perfect_doublings(points)
    if perfect < PERFECT_DOUBLINGS:
        # The walk needs at least this many more doublings: measure that far ahead, no further.
        items.append(walk.below(UncertaintyKind.PERFECT_SCALING, f"{perfect} of {PERFECT_DOUBLINGS} doublings from "
                                f"{walk.measured[0]} up scale perfectly",
                                walk_to=walk.measured[0] >> (PERFECT_DOUBLINGS - perfect)))
    if fit_value(fit, "perfect_scaling_end") is None:
        items.append(Uncertainty(UncertaintyKind.PERFECT_SCALING_END, UNKNOWN_EXCESS, f"perfect scaling through the "
                                 f"largest batch size with a result ({walk.with_result[-1]})", walk.up))
    start = fit_value(fit, "maximal_parallelism_start")
    if goal is Goal.BOUNDARIES and start is not None:
        previous = [b for b in walk.with_result if b < start]
        if previous and start > 2 * previous[-1]:  # a gap left by a study without a result
            items.append(Uncertainty(UncertaintyKind.MAXIMAL_PARALLELISM_START, math.log2(start / previous[-1]) - 1,
                                     f"maximal data parallelism starts between {previous[-1]} and {int(start)}", None))
    return items


@dataclass(frozen=True)
class Pick:
    """One batch size chosen for one curve, why, and the uncertainty before it was measured."""

    curve: CurveId
    batch_size: int
    reason: UncertaintyKind
    excess: float
    uncertainty: str
    goal: float | None = None  # the ladder's rung that asked for it
    seed: int | None = None  # the study's seed: None, the protocol's


@dataclass(frozen=True)
class Decision:
    """The outcome of one round's assessment: batch sizes to measure next, or why the sweep stops."""

    picks: tuple[Pick, ...]
    stop: StopReason | None
    states: tuple[CurveState, ...]

    def uncertain(self) -> list[str]:
        return uncertain(self.states)


def decide(states: list[CurveState], studies: int, trial_steps: int, seconds: float,
           settings: AdaptiveSettings, candidates: tuple[int, ...] = ()) -> Decision:
    """Stop, or measure: one batch size per curve with an open question, largest excess first, then, while a
    round has fewer than ``settings.width`` studies, the walks' next doublings down. ``studies``, ``trial_steps``
    and ``seconds`` (this invocation's): what the sweep has spent, checked against the limits before a round."""
    wanted = [(state, choice) for state in states if (choice := state.next_batch_size()) is not None]
    replicates = _replicate_picks(states)
    room = settings.width if settings.max_studies is None else min(settings.width, settings.max_studies - studies)
    stop = _stop(states, bool(wanted or replicates), room, trial_steps, seconds, settings.budget)
    if stop is not None:
        return Decision((), stop, tuple(states))
    wanted.sort(key=lambda pair: -pair[1].excess)  # stable: curve order on a tie
    # Rungs of one curve share its studies: a batch size two rungs want is one study.
    first: dict[tuple[CurveId, int], tuple[CurveState, Uncertainty]] = {}
    for state, choice in wanted:
        first.setdefault((state.curve, choice.batch_size), (state, choice))
    chosen = list(first.values())[:room]
    picks = [Pick(state.curve, choice.batch_size, choice.kind, choice.excess, choice.description, state.goal,
                  state.seeds[0] if state.seeds else None) for state, choice in chosen]
    # Then the replicates answered questions need (certain to be wanted), before guesses ahead of a walk.
    picks = _distinct(picks + replicates)[:room]
    return Decision(tuple(_distinct(picks + _ahead(chosen, room - len(picks), candidates))), None, tuple(states))


def _distinct(picks: list[Pick]) -> list[Pick]:
    """The first pick of each study (curve, batch size and seed)."""
    first: dict[tuple[CurveId, int, int | None], Pick] = {}
    for pick in picks:
        first.setdefault((pick.curve, pick.batch_size, pick.seed), pick)
    return list(first.values())


def _replicate_picks(states: list[CurveState]) -> list[Pick]:
    """Every replicate the curves' deciding points lack: the second replicate of every point first (so that the
    values move early), curve by curve, the largest (cheapest) batch size first."""
    found = sorted(((r.index, order, -r.batch_size), Pick(state.curve, r.batch_size, UncertaintyKind.REPLICATE, 0.0,
                                                          r.description(), state.goal, r.seed))
                   for order, state in enumerate(states) for r in state.replicates)
    return [pick for _, pick in found]


def _stop(states: list[CurveState], wanted: bool, room: int, trial_steps: int, seconds: float,
          budget: Budget | None) -> StopReason | None:
    if not wanted:
        return StopReason.TARGET_MET if not any(s.open for s in states) else StopReason.EXHAUSTED
    if budget is not None and budget.kind is BudgetKind.TRIAL_STEPS and trial_steps >= budget.amount:
        return StopReason.BUDGET_STEPS
    if budget is not None and budget.kind is BudgetKind.SECONDS and seconds >= budget.amount:
        return StopReason.BUDGET_TIME
    return StopReason.MAX_STUDIES if room <= 0 else None


def _ahead(chosen: list[tuple[CurveState, Uncertainty]], room: int, candidates: tuple[int, ...]) -> list[Pick]:
    """Workers left over: the walks' next steps down, one curve after another, never below where the walk is
    expected to end (walk_to; the next doubling costs about twice the last: a guess is paid dearly)."""
    walking = [(state, choice) for state, choice in chosen if choice.batch_size < state.measured[0]]
    ahead = {(state.curve, state.goal): choice.batch_size for state, choice in walking}
    picks: list[Pick] = []
    while len(picks) < room and walking:
        for state, choice in list(walking):
            lower = ahead[state.curve, state.goal] // 2
            if len(picks) >= room or lower not in candidates or (choice.walk_to is not None and lower < choice.walk_to):
                walking.remove((state, choice))
                continue
            ahead[state.curve, state.goal] = lower
            picks.append(Pick(state.curve, lower, choice.kind, choice.excess,
                              f"{choice.description} (ahead of the walk: a free worker)", state.goal,
                              state.seeds[0] if state.seeds else None))
    return picks


# The curve's columns are its axes within the sweep's workload (optimizer, sparsity, pruning); a ladder's
# decisions have a goal column after them.
DECISION_COLUMNS = ("round", "decision", *(a for a in CURVE_AXES if a != "workload"), "batch_size", "reason",
                    "excess_doublings", "uncertainty_before", "studies_before", "trial_steps_before")


def decision_columns(ladder: bool, replicated: bool = False) -> list[str]:
    columns = list(DECISION_COLUMNS)
    if ladder:  # the rung a row is about
        columns.insert(columns.index("batch_size"), "goal")
    if replicated:  # which replicate a study is
        columns.insert(columns.index("batch_size") + 1, "seed")
    return columns


def _row(round_index: int, decision: str, curve: CurveId, batch_size: int | None, reason: str, excess: float | None,
         before: str, studies: int, trial_steps: int, goal: float | None = None, seed: int | None = None) -> dict:
    return {"round": round_index, "decision": decision, **curve.within_workload(), "goal": goal,
            "batch_size": batch_size, "seed": seed, "reason": reason, "excess_doublings": excess,
            "uncertainty_before": before, "studies_before": studies, "trial_steps_before": trial_steps}


def decision_rows(round_index: int, decision: Decision, studies: int, trial_steps: int) -> list[dict]:
    """The decision table's rows of one round: one per pick, or one 'stop' row per curve."""
    if decision.stop is None:
        return [_row(round_index, "measure", p.curve, p.batch_size, p.reason.value, round(p.excess, 3), p.uncertainty,
                     studies, trial_steps, p.goal, p.seed) for p in decision.picks]
    return [_row(round_index, f"stop: {decision.stop.value}", s.curve, None, "", None, s.summary(), studies,
                 trial_steps, s.goal) for s in decision.states]


def start_rows(curves: list[CurveId], grid: tuple[int, ...], seed: int | None = None) -> list[dict]:
    return [_row(0, "measure", c, b, "start: the largest batch sizes", None, "nothing measured yet", 0, 0, seed=seed)
            for c in curves for b in grid]
