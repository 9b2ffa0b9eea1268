"""95% intervals of a curve's fit by a bootstrap over trials (docs/fit.md), used only where every study of the
curve trained every trial to its end: each study's trials resampled, its best reaching one kept and drawn within its
check interval, the curve refitted. The minimum lies above the estimate, so S_min, B_crit and E_min get basic
(reflected) intervals; grid values percentile ones. Also what every bootstrap of a curve shares: the statistics of a
resample and percentile intervals.
"""

from __future__ import annotations

import math
from contextlib import suppress
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.fits import HyperbolaFit, InsufficientData, fit_hyperbolas, regime_boundaries, threshold_critical_batch
from analysis.replicates import censored, point_values

# What the bootstrap of a curve resampled (fit-table columns): the studies, those with a single reaching
# trial, and the trials superseded by exact early stopping.
BASIS_COLUMNS = ("interval_studies", "interval_studies_one_reaching", "interval_trials_superseded")


@dataclass(frozen=True)
class Interval:
    low: float | None
    high: float | None


@dataclass(frozen=True)
class StudyOutcomes:
    """One study's trials as the bootstrap reads them (a reaching trial without its steps: NaN, not counted)."""
    trials: int
    reached_steps: np.ndarray
    superseded: int


def _resampled_minima(reached_steps: np.ndarray, trials: int, repeats: int, rng: np.random.Generator) -> np.ndarray:
    """The best reaching trial of each of ``repeats`` resamples of a study's ``trials`` trials, inf where none
    reached; drawn from that minimum's exact distribution (a resample misses all j best of n trials with
    probability ((n - j) / n)^n), a number per resample instead of one per trial."""
    ordered = np.sort(reached_steps[np.isfinite(reached_steps)])
    if not len(ordered):
        return np.full(repeats, np.inf)
    best = np.arange(1, len(ordered) + 1)
    within = 1.0 - ((trials - best) / trials) ** trials  # P(the resample's best is among the j best)
    rank = np.searchsorted(within, rng.random(repeats), side="right")
    return np.where(rank < len(ordered), ordered[np.minimum(rank, len(ordered) - 1)], np.inf)


def _outcome_columns(trials: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A trials table's reached and superseded trials (masks) and steps (NaN where it has none)."""
    status = trials["status"]  # compared as it is: a categorical column by its codes
    steps = pd.to_numeric(trials["steps_to_result"], errors="coerce").to_numpy(dtype=float)
    return status.eq("reached").to_numpy(dtype=bool), status.eq("superseded").to_numpy(dtype=bool), steps


def study_outcomes(trials: pd.DataFrame) -> StudyOutcomes:
    """One study's trials table (columns status and steps_to_result) as StudyOutcomes."""
    reached, superseded, steps = _outcome_columns(trials)
    return StudyOutcomes(len(trials), steps[reached], int(superseded.sum()))


def outcomes_by_study(trials: pd.DataFrame) -> dict[str, StudyOutcomes]:
    """:func:`study_outcomes` of every study of a trials table (column study_key), each column read once: a
    pandas operation per study would cost seconds at the paper's scale."""
    trials = trials[trials["study_key"].notna()]  # a trial of no study belongs to no curve
    keys_column = trials["study_key"]
    if not isinstance(keys_column.dtype, pd.CategoricalDtype):
        keys_column = keys_column.astype(str)
    codes, keys = pd.factorize(keys_column, sort=False)
    reached, superseded, steps = _outcome_columns(trials)
    order = np.argsort(codes, kind="stable")  # each study's rows together, in their order
    counts = np.bincount(codes, minlength=len(keys))
    ends = np.cumsum(counts)
    outcomes = {}
    for code, key in enumerate(keys):
        rows = order[ends[code] - counts[code]:ends[code]]
        outcomes[str(key)] = StudyOutcomes(len(rows), steps[rows][reached[rows]], int(superseded[rows].sum()))
    return outcomes


CurveTrials = list[tuple[int, StudyOutcomes]]  # each study of a curve: its batch size and its trials


def resample_statistics(sizes: np.ndarray, resampled: np.ndarray, tolerance: float) -> dict[str, np.ndarray]:
    """S_min, B_crit, E_min, the boundaries and the threshold of every row of ``resampled`` (a resample's point
    per batch size of ``sizes``; not finite: no result there), NaN where a resample has too few points."""
    s_min, b_crit = fit_hyperbolas(sizes, resampled)
    grid: dict[str, list[float]] = {"perfect_scaling_end": [], "maximal_parallelism_start": [],
                                    "b_crit_threshold": []}
    for row in resampled:
        found = np.isfinite(row) & (row > 0)
        values = [math.nan] * 3
        with suppress(InsufficientData):
            bounds = regime_boundaries(sizes[found], row[found], tolerance)
            values = [bounds.perfect_scaling_end or math.nan, bounds.maximal_parallelism_start or math.nan,
                      threshold_critical_batch(sizes[found], row[found], tolerance)]
        for name, value in zip(grid, values):
            grid[name].append(value)
    # E_min per resample from that resample's own fit: the product of the two intervals' ends would ignore that
    # S_min and B_crit move together
    return {"s_min": s_min, "b_crit": b_crit, "e_min": s_min * b_crit,
            **{name: np.array(values, dtype=float) for name, values in grid.items()}}


def bootstrap(curve_trials: CurveTrials, repeats: int = 200, seed: int = 0, tolerance: float = 0.2,
              estimate: HyperbolaFit | None = None, check: int | None = None) -> dict[str, Interval]:
    """95% intervals of S_min, B_crit, E_min, the boundaries and the threshold critical batch size; each
    resampled study's best trial drawn within its check interval (``check``), the studies of one batch size
    taken together by the point rule (analysis.replicates.point_values)."""
    rng = np.random.default_rng(seed)
    below: dict[int, list[np.ndarray]] = {}
    above: dict[int, list[np.ndarray]] = {}
    for batch_size, outcomes in curve_trials:
        if outcomes.trials:
            minima = _resampled_minima(outcomes.reached_steps, outcomes.trials, repeats, rng)
            drawn = censored(minima, check, rng)
            below.setdefault(batch_size, []).append(drawn)
            with np.errstate(invalid="ignore"):  # inf - inf: a resample without a reaching trial stays one
                above.setdefault(batch_size, []).append(np.where(np.isfinite(minima), 2 * minima - drawn, minima))
    sizes = np.array(sorted(below), dtype=float)
    samples = resample_statistics(sizes, _points(below, sizes, repeats), tolerance)
    if estimate is not None:
        # A basic interval reflects the resamples about the estimate: the censoring (the truth lies below the
        # recorded steps) must enter them above it to come out below, as the percentile grid values have it.
        s_min, b_crit = fit_hyperbolas(sizes, _points(above, sizes, repeats))
        samples.update(s_min=s_min, b_crit=b_crit, e_min=s_min * b_crit)
    return {name: _interval(name, values, repeats, estimate) for name, values in samples.items()}


def _points(by_size: dict[int, list[np.ndarray]], sizes: np.ndarray, repeats: int) -> np.ndarray:
    """Each resample's point per batch size: its studies' resampled steps taken together by the point rule."""
    return np.column_stack([point_values(np.column_stack(by_size[int(size)])) for size in sizes]) \
        if len(sizes) else np.empty((repeats, 0))


GRID_VALUES = ("perfect_scaling_end", "maximal_parallelism_start", "b_crit_threshold")


def percentile_interval(values: np.ndarray, repeats: int, grid: bool = False) -> Interval:
    """The 2.5 and 97.5 percentiles of the finite ``values``; none where fewer than a quarter of the resamples
    (at least 10) gave one. A grid value's ends stay on the grid."""
    array = np.asarray(values, dtype=float)
    array = array[np.isfinite(array)]
    if len(array) < max(10, repeats // 4):
        return Interval(None, None)
    if grid:
        return Interval(float(np.percentile(array, 2.5, method="lower")),
                        float(np.percentile(array, 97.5, method="higher")))
    low, high = np.percentile(array, [2.5, 97.5])
    return Interval(float(low), float(high))


def _interval(name: str, values: np.ndarray, repeats: int, estimate: HyperbolaFit | None) -> Interval:
    interval = percentile_interval(values, repeats, grid=name in GRID_VALUES)
    if name in GRID_VALUES or estimate is None or interval.low is None:
        return interval
    # basic (reflected) interval in log space: the statistic is a minimum
    centre = math.log(getattr(estimate, name))
    return Interval(math.exp(2 * centre - math.log(interval.high)), math.exp(2 * centre - math.log(interval.low)))


def interval_basis(curve_trials: CurveTrials) -> dict[str, int]:
    """The counts of BASIS_COLUMNS for one curve's trials."""
    reached = [int(np.isfinite(outcomes.reached_steps).sum()) for _, outcomes in curve_trials]  # as resampled
    superseded = sum(outcomes.superseded for _, outcomes in curve_trials)
    return dict(zip(BASIS_COLUMNS, (len(reached), reached.count(1), superseded)))


def interval_basis_warning(row: dict | pd.Series) -> str | None:
    """Why a curve's intervals say little (most studies had one reaching trial) and what would help, else None."""
    studies, single = row.get("interval_studies"), row.get("interval_studies_one_reaching")
    if studies is None or single is None or pd.isna(studies) or pd.isna(single) or not studies:
        return None
    studies, single = int(studies), int(single)
    if 2 * single < studies:
        return None
    superseded = row.get("interval_trials_superseded")
    superseded = int(superseded) if superseded is not None and pd.notna(superseded) else 0
    return (f"the intervals say little: {single} of {studies} studies had one reaching trial"
            + (f" ({superseded} trials superseded by exact early stopping)" if superseded else "")
            + ", so a resample either keeps that trial or loses the point; studies with full_trials=true or "
              "more trials would give intervals that mean something")
