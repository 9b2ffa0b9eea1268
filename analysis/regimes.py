"""Fits of steps-to-result curves: the hyperbola, the regime boundaries, and their uncertainty.

- Hyperbola S(B) = S_min (1 + B_crit / B) (McCandlish et al. 2018; the form of the paper's bound
  K(B) ~ a/B + b with S_min = b, B_crit = a/b), fitted by least squares in log space.
- Boundaries, model-free on the measured points (docs/fit.md defines them; one name each, in the
  fit table, the report and the analysis run's metrics): ``perfect_scaling_end`` is the first
  measured batch size whose steps exceed ideal linear scaling from the smallest batch size by more
  than ``tolerance`` (Zhang et al. 2024 use 20%), so perfect scaling holds below it and ends at the
  latest there; ``maximal_parallelism_start`` is the smallest batch size from which every larger one
  stays within ``tolerance`` of the largest batch size's steps. In between: diminishing returns.
  The local slope of log S against log B is reported too (about -1, then 0).
- The critical batch size in the threshold form (Zhang et al., ICLR 2025): ``b_crit_threshold`` is the
  largest measured batch size up to which every measured batch size's steps stay within ``tolerance`` of
  ideal linear scaling from the smallest one (20% by default); with ``perfect_scaling_end``, the smallest
  batch size that fails, it brackets the value as Merrill et al. (2025) report it. The fitted hyperbola's
  value of the same threshold, ``b_crit_threshold_fit``, solves S(B) B = (1 + tolerance) S(B_0) B_0:
  B = (1 + tolerance) B_0 + tolerance B_crit (B_0 the smallest measured batch size; it tends to
  tolerance x B_crit as B_0 -> 0).
- A bootstrap over trials: resample each study's trials with replacement, take the minimum over
  the reaching ones, refit. The minimum's bootstrap distribution lies entirely above the estimate,
  so S_min and B_crit get basic (reflected) intervals; boundaries and ``b_crit_threshold``, which are
  grid values, get percentile intervals; ``b_crit_threshold_fit``, an increasing function of B_crit at
  the measured B_0, gets B_crit's interval carried through it. Superseded trials (exact early stopping) are known only to be slower than
  the best, so resamples without a reaching trial drop that point: use ``full_trials=true`` studies
  for intervals that need every trial's outcome. A basic interval can end short of its estimate
  (nearly every resampled minimum on one side of it): it is kept as it is and the note says so; the
  ``interval_*`` columns count what the resamples rest on (see :func:`interval_basis`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from edps_mlflow.curves import CURVE_AXES, TAG_DEFAULTS

MIN_POINTS = 3
# What identifies a curve (edps_mlflow.curves.CurveId: workload, optimizer, sparsity, pruning): declared there once.
CURVE_KEYS = CURVE_AXES


def with_curve_axes(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with every curve axis as a column: a row made before an axis existed (a CSV or a frame
    without ``pruning``, or with the cell empty) was measured at its default (curves.TAG_DEFAULTS: SNIP)."""
    filled = {axis: table[axis].fillna(default) if axis in table.columns else default
              for axis, default in TAG_DEFAULTS.items()
              if axis not in table.columns or table[axis].isna().any()}
    return table.assign(**filled) if filled else table
# Studies measured under another protocol do not lie on one curve: a different goal, trial count,
# check interval or step cap changes steps-to-result itself. When a table holds such columns, their
# values are part of a curve's identity, and a (workload, optimizer, sparsity) measured under two
# protocols becomes two curves, each fitted on its own (the fit's note says so).
PROTOCOL_KEYS = ("goal_error", "trials_total", "check_interval", "max_steps")


class InsufficientData(ValueError):
    """A curve with too few points for a meaningful fit."""


@dataclass(frozen=True)
class HyperbolaFit:
    s_min: float
    b_crit: float
    rmse_log: float  # root mean square residual of log S (natural log)
    r2_log: float

    def steps(self, batch_size: np.ndarray | float) -> np.ndarray | float:
        return self.s_min * (1.0 + self.b_crit / np.asarray(batch_size, dtype=float))


@dataclass(frozen=True)
class Boundaries:
    perfect_scaling_end: int | None  # first measured batch size beyond perfect scaling (None: never left)
    maximal_parallelism_start: int | None  # None: no plateau within the measured range


def _points(batch_sizes: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    batch_sizes, steps = np.asarray(batch_sizes, dtype=float), np.asarray(steps, dtype=float)
    keep = np.isfinite(steps) & (steps > 0)
    order = np.argsort(batch_sizes[keep])
    return batch_sizes[keep][order], steps[keep][order]


def fit_hyperbola(batch_sizes: np.ndarray, steps: np.ndarray) -> HyperbolaFit:
    """The hyperbola through one curve's points, by least squares in log space (:func:`fit_hyperbolas`, the
    solver its bootstrap uses: an estimate and its resamples fitted alike stop alike where the minimum is
    not defined, and an interval reflected about the estimate is not thrown off by two solvers' stops)."""
    b, s = _points(batch_sizes, steps)
    if len(b) < MIN_POINTS:
        raise InsufficientData(f"{len(b)} batch sizes with a result; a fit needs at least {MIN_POINTS}")
    s_min, b_crit = (float(value[0]) for value in fit_hyperbolas(b, s[None, :]))
    log_s = np.log(s)
    fitted = math.log(s_min) + np.logaddexp(0.0, math.log(b_crit) - np.log(b)) - log_s
    total = float(np.sum((log_s - log_s.mean()) ** 2))
    return HyperbolaFit(s_min=s_min, b_crit=b_crit, rmse_log=float(np.sqrt(np.mean(fitted ** 2))),
                        r2_log=float(1.0 - np.sum(fitted ** 2) / total) if total > 0 else float("nan"))


# The batched fit's Levenberg-Marquardt: a step is kept when it lowers the sum of squares; the damping falls
# by DAMPING_DOWN after a kept step and rises by DAMPING_UP after a refused one. It stops, as MINPACK does with
# least_squares' defaults, when a kept step lowers the sum of squares by less than FIT_TOLERANCE of it or moves
# the parameters by less than FIT_TOLERANCE of their size, or after FIT_ITERATIONS steps.
FIT_TOLERANCE = 1e-8
FIT_ITERATIONS = 300
DAMPING_UP, DAMPING_DOWN, MAX_DAMPING = 4.0, 3.0, 1e16
FAR_OUT = 50.0  # in log B: a factor e^50, about 5e21


def fit_hyperbolas(batch_sizes: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The hyperbola through many curves measured at the same batch sizes at once (a bootstrap's resamples):
    ``steps`` has a row per curve and a column per batch size, a value that is not finite and positive being
    a point the curve lacks. Returns S_min and B_crit per row, NaN for a row with fewer than MIN_POINTS
    points. Least squares in log space from the plateau (the largest batch size) and the crossing of the two
    asymptotes, minimised for every row together by a Levenberg-Marquardt iteration written out in numpy: a
    bootstrap refits a curve hundreds of times, and scipy's least_squares costs about a millisecond a call
    in its Python alone. It finds the minimum that MINPACK finds (sums of squares alike to 1e-8, tested);
    where there is none (B_crit far beyond the measured batch sizes, a flat valley) it stops FAR_OUT beyond
    them."""
    b = np.asarray(batch_sizes, dtype=float)
    order = np.argsort(b, kind="stable")
    b = b[order]
    s = np.atleast_2d(np.asarray(steps, dtype=float))[:, order]
    valid = np.isfinite(s) & (s > 0)
    fitted = valid.sum(axis=1) >= MIN_POINTS
    s_min = np.full(len(s), np.nan)
    b_crit = np.full(len(s), np.nan)
    if not fitted.any():
        return s_min, b_crit
    s, valid = s[fitted], valid[fitted]
    weight = valid.astype(float)
    log_b = np.log(b)[None, :]
    log_s = np.log(np.where(valid, s, 1.0))
    # A row whose B_crit runs off towards 0 (a flat curve) or infinity (a straight one, S_min towards 0 with it)
    # stops FAR_OUT beyond the batch sizes, where either is as good as unbounded, before its exponentials
    # underflow to 0 (whose logarithm the basic interval takes) or overflow.
    lowest, highest = log_b[0, 0] - FAR_OUT, log_b[0, -1] + FAR_OUT
    # fit_hyperbola's start, from each row's own first and last points
    rows, first = np.arange(len(s)), np.argmax(valid, axis=1)
    last = valid.shape[1] - 1 - np.argmax(valid[:, ::-1], axis=1)
    b_first, b_last, s_first, s_last = b[first], b[last], s[rows, first], s[rows, last]
    theta = np.column_stack([np.log(s_last),  # (log S_min, log B_crit) per row
                             np.log(np.maximum(b_first, np.minimum(b_last, s_first * b_first / s_last)))])

    def residuals(theta: np.ndarray) -> np.ndarray:
        return (theta[:, :1] + np.logaddexp(0.0, theta[:, 1:] - log_b) - log_s) * weight

    r = residuals(theta)
    cost = np.einsum("ij,ij->i", r, r)
    damping = np.full(len(s), 1e-3)
    active = np.ones(len(s), dtype=bool)
    points = weight.sum(axis=1)
    for _ in range(FIT_ITERATIONS):
        if not active.any():
            break
        # The Jacobian's columns: d r / d log S_min = 1 and d r / d log B_crit = the logistic of
        # log B_crit - log B, at a row's points. The 2x2 normal equations J'J step = -J'r, their diagonal
        # scaled by 1 + damping (Marquardt), solved in closed form for every row.
        slope = weight * _logistic(theta[:, 1:] - log_b)
        a01, a11 = slope.sum(axis=1), np.einsum("ij,ij->i", slope, slope)
        g0, g1 = r.sum(axis=1), np.einsum("ij,ij->i", slope, r)
        d00, d11 = points * (1.0 + damping), a11 * (1.0 + damping)
        det = d00 * d11 - a01 * a01
        with np.errstate(divide="ignore", invalid="ignore"):
            step = np.column_stack([-(d11 * g0 - a01 * g1) / det, -(d00 * g1 - a01 * g0) / det])
        # no step to take: B_crit so far below the batch sizes that the curve no longer depends on it
        solvable = np.isfinite(step).all(axis=1) & (det > 0)
        step[~(active & solvable)] = 0.0
        trial = theta + step
        trial[:, 1] = np.clip(trial[:, 1], lowest, highest)
        r_trial = residuals(trial)
        cost_trial = np.einsum("ij,ij->i", r_trial, r_trial)
        kept = active & solvable & (cost_trial < cost)
        small_step = np.linalg.norm(step, axis=1) <= FIT_TOLERANCE * (FIT_TOLERANCE + np.linalg.norm(theta, axis=1))
        done = kept & ((cost - cost_trial <= FIT_TOLERANCE * cost) | small_step)
        theta[kept], r[kept], cost[kept] = trial[kept], r_trial[kept], cost_trial[kept]
        damping = np.where(kept, damping / DAMPING_DOWN, damping * DAMPING_UP)
        at_bound = (theta[:, 1] <= lowest) | (theta[:, 1] >= highest)
        active &= ~done & solvable & (damping < MAX_DAMPING) & ~at_bound  # no step lowers it any more, or bound
    # A row stopped at a bound: its S_min is the best one for that B_crit (least squares in log S_min alone)
    bound = (theta[:, 1] <= lowest) | (theta[:, 1] >= highest)
    theta[bound, 0] = ((log_s - np.logaddexp(0.0, theta[:, 1:] - log_b)) * weight)[bound].sum(axis=1) / points[bound]
    s_min[fitted], b_crit[fitted] = np.exp(theta[:, 0]), np.exp(theta[:, 1])
    return s_min, b_crit


def _logistic(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x) without overflow at either end, in numpy: scipy's expit would cost the command that
    fits its import (a tenth of a second), for one function."""
    return np.exp(-np.logaddexp(0.0, -x))


def regime_boundaries(batch_sizes: np.ndarray, steps: np.ndarray, tolerance: float = 0.2) -> Boundaries:
    b, s = _points(batch_sizes, steps)
    if len(b) < 2:
        raise InsufficientData(f"{len(b)} batch sizes with a result; boundaries need at least 2")
    ideal = s[0] * b[0] / b
    beyond = np.nonzero(s > (1.0 + tolerance) * ideal)[0]
    perfect_end = int(b[beyond[0]]) if len(beyond) else None
    plateau = s[-1]
    within = s <= (1.0 + tolerance) * plateau
    start = len(b) - 1
    while start > 0 and within[start - 1]:
        start -= 1
    # A plateau needs at least two points in it; a single last point is not one.
    maximal_start = int(b[start]) if start < len(b) - 1 else None
    return Boundaries(perfect_end, maximal_start)


def threshold_critical_batch(batch_sizes: np.ndarray, steps: np.ndarray, tolerance: float = 0.2) -> int:
    """Zhang et al.'s critical batch size on the measured points: the largest measured batch size up to which
    steps stay within ``tolerance`` of ideal linear scaling from the smallest batch size, S(B_0) B_0 / B.
    The smallest batch size passes by definition; a batch size that passes again after one that failed (noise)
    does not count. The next measured batch size, when there is one, is ``perfect_scaling_end``."""
    b, s = _points(batch_sizes, steps)
    if len(b) < 2:
        raise InsufficientData(f"{len(b)} batch sizes with a result; the threshold needs at least 2")
    beyond = np.nonzero(s > (1.0 + tolerance) * s[0] * b[0] / b)[0]
    return int(b[beyond[0] - 1]) if len(beyond) else int(b[-1])


def fitted_threshold(fit: HyperbolaFit, smallest_batch_size: float, tolerance: float = 0.2) -> float:
    """The batch size at which the fitted hyperbola's steps exceed ideal linear scaling from the smallest
    measured batch size B_0 by ``tolerance``: S(B) B = (1 + tolerance) S(B_0) B_0, with S(B) B = S_min (B + B_crit),
    gives B = (1 + tolerance) B_0 + tolerance B_crit."""
    return (1.0 + tolerance) * float(smallest_batch_size) + tolerance * fit.b_crit


def local_slopes(batch_sizes: np.ndarray, steps: np.ndarray) -> list[tuple[int, int, float]]:
    """(B_i, B_i+1, d log S / d log B) between consecutive measured points."""
    b, s = _points(batch_sizes, steps)
    # Several studies of one batch size in a curve (studies that differ only where the curve does not look,
    # or tables merged from several stores) have no slope between them: a batch size counts with the median
    # of its steps.
    b, s = np.unique(b), np.array([np.median(s[b == size]) for size in np.unique(b)])
    return [(int(b[i]), int(b[i + 1]), float(np.log(s[i + 1] / s[i]) / np.log(b[i + 1] / b[i])))
            for i in range(len(b) - 1)]


@dataclass(frozen=True)
class Interval:
    low: float | None
    high: float | None


CONTAINS_TOLERANCE = 1e-6  # relative


def contains_estimate(low: float, value: float, high: float) -> bool:
    """Whether the interval holds the estimate, an end equal to it up to the fits' precision included: an
    interval that collapsed onto its estimate (every resample alike) ends where the resamples' fit stopped,
    which least squares finds only to about 1e-8 in log space (the same points in another order, as the
    estimate and a resample hold them, need not stop at the same last digits), and is not one that excludes
    it."""
    return bool(low <= value <= high or math.isclose(low, value, rel_tol=CONTAINS_TOLERANCE)
                or math.isclose(high, value, rel_tol=CONTAINS_TOLERANCE))


def _resampled_minima(reached_steps: np.ndarray, trials: int, repeats: int, rng: np.random.Generator) -> np.ndarray:
    """The best reaching trial of each of ``repeats`` resamples of a study (its ``trials`` trials drawn with
    replacement), inf where none of a resample reached; ``reached_steps``: the steps of its reaching trials.
    Drawn from the exact distribution of that minimum rather than by drawing every trial: a resample misses
    all j best of n trials with probability ((n - j) / n)^n, so one uniform number per resample picks the
    rank of its best trial. The same distribution for a hundredth of the random numbers: a store of 1,500
    studies of 100 trials would draw 30 million."""
    ordered = np.sort(reached_steps[np.isfinite(reached_steps)])  # reached without its steps: not counted
    if not len(ordered):
        return np.full(repeats, np.inf)
    best = np.arange(1, len(ordered) + 1)
    within = 1.0 - ((trials - best) / trials) ** trials  # P(the resample's best is among the j best)
    rank = np.searchsorted(within, rng.random(repeats), side="right")
    return np.where(rank < len(ordered), ordered[np.minimum(rank, len(ordered) - 1)], np.inf)


@dataclass(frozen=True)
class StudyOutcomes:
    """What the bootstrap reads of one study's trials: how many ran, the steps of those that reached the goal
    (NaN for one that reached without its steps, which counts as not reaching), and how many were superseded
    (exact early stopping)."""
    trials: int
    reached_steps: np.ndarray
    superseded: int


def _outcome_columns(trials: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A trials table's reached and superseded trials (masks) and steps (NaN where it has none)."""
    status = trials["status"]
    steps = pd.to_numeric(trials["steps_to_result"], errors="coerce").to_numpy(dtype=float)
    # compared as they are: a categorical column (analysis.load) is compared by its codes
    return (status.eq("reached").to_numpy(dtype=bool), status.eq("superseded").to_numpy(dtype=bool), steps)


def study_outcomes(trials: pd.DataFrame) -> StudyOutcomes:
    """One study's trials table (columns status and steps_to_result) as StudyOutcomes."""
    reached, superseded, steps = _outcome_columns(trials)
    return StudyOutcomes(len(trials), steps[reached], int(superseded.sum()))


def outcomes_by_study(trials: pd.DataFrame) -> dict[str, StudyOutcomes]:
    """:func:`study_outcomes` of every study in a table of many studies' trials (column study_key), each
    column read once: a pandas operation per study costs about a millisecond, 1.5 s at 1,500 studies."""
    trials = trials[trials["study_key"].notna()]  # a trial of no study belongs to no curve
    keys_column = trials["study_key"]
    if not isinstance(keys_column.dtype, pd.CategoricalDtype):  # categorical (analysis.load): keys as they are
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


CurveTrials = Mapping[int, pd.DataFrame] | Sequence[tuple[int, "pd.DataFrame | StudyOutcomes"]]


def _studies(curve_trials: CurveTrials) -> list[tuple[int, StudyOutcomes]]:
    """Each study of a curve as (batch size, outcomes), from a mapping of batch size to trials table or from
    pairs (a batch size may have several studies)."""
    pairs = curve_trials.items() if isinstance(curve_trials, Mapping) else curve_trials
    return [(size, trials if isinstance(trials, StudyOutcomes) else study_outcomes(trials)) for size, trials in pairs]


def bootstrap(curve_trials: CurveTrials, repeats: int = 200, seed: int = 0, tolerance: float = 0.2,
              estimate: HyperbolaFit | None = None) -> dict[str, Interval]:
    """95% intervals for S_min, B_crit, the boundaries and the threshold critical batch size by resampling each
    study's trials (the fitted threshold's interval: :func:`fit_table` carries B_crit's through it).
    ``curve_trials``: each study's batch size and trials (a batch size may have several studies)."""
    rng = np.random.default_rng(seed)
    samples: dict[str, list[float]] = {"s_min": [], "b_crit": [], "perfect_scaling_end": [],
                                       "maximal_parallelism_start": [], "b_crit_threshold": []}
    # Every repeat's resample of a study at once, as the best reaching trial it holds (inf: none reached).
    batch_sizes, resampled = [], []
    for batch_size, outcomes in _studies(curve_trials):
        if outcomes.trials == 0:
            continue
        batch_sizes.append(batch_size)
        resampled.append(_resampled_minima(outcomes.reached_steps, outcomes.trials, repeats, rng))
    sizes_all = np.array(batch_sizes, dtype=float)
    minima_all = np.column_stack(resampled) if resampled else np.empty((repeats, 0))
    s_min, b_crit = fit_hyperbolas(sizes_all, minima_all)  # NaN where a resample has too few points
    samples["s_min"], samples["b_crit"] = list(s_min), list(b_crit)
    for repeat in range(repeats):
        found = np.isfinite(minima_all[repeat])
        sizes_array, minima_array = sizes_all[found], minima_all[repeat][found]
        try:
            bounds = regime_boundaries(sizes_array, minima_array, tolerance)
            samples["perfect_scaling_end"].append(bounds.perfect_scaling_end or math.nan)
            samples["maximal_parallelism_start"].append(bounds.maximal_parallelism_start or math.nan)
            samples["b_crit_threshold"].append(threshold_critical_batch(sizes_array, minima_array, tolerance))
        except InsufficientData:
            pass
    intervals = {}
    for name, values in samples.items():
        array = np.array(values, dtype=float)
        array = array[np.isfinite(array)]
        if len(array) < max(10, repeats // 4):
            intervals[name] = Interval(None, None)
            continue
        if name in ("s_min", "b_crit"):
            low, high = np.percentile(array, [2.5, 97.5])
        else:  # grid values: keep the interval on the grid
            low, high = np.percentile(array, 2.5, method="lower"), np.percentile(array, 97.5, method="higher")
        if name in ("s_min", "b_crit") and estimate is not None:
            # Basic (reflected) interval in log space: the statistic is a minimum (see module doc).
            centre = math.log(getattr(estimate, name))
            low, high = math.exp(2 * centre - math.log(high)), math.exp(2 * centre - math.log(low))
        intervals[name] = Interval(float(low), float(high))
    return intervals


def curve_columns(table: pd.DataFrame) -> list[str]:
    """The columns that identify a curve in ``table``: CURVE_KEYS, then the protocol columns it holds."""
    return list(CURVE_KEYS) + [k for k in PROTOCOL_KEYS if k in table.columns and table[k].notna().any()]


def curves(table: pd.DataFrame) -> dict[tuple, pd.DataFrame]:
    """Study rows grouped per curve (the values of :func:`curve_columns`), sorted by batch size."""
    table = with_curve_axes(table)
    groups = table.groupby(curve_columns(table), sort=True, dropna=False)
    return {key: group.sort_values("batch_size") for key, group in groups}


def fit_table(table: pd.DataFrame, trials: pd.DataFrame | None = None, tolerance: float = 0.2,
              repeats: int = 200, seed: int = 0) -> pd.DataFrame:
    """One row per curve: hyperbola, boundaries, intervals (when trials are given), or why not."""
    table = with_curve_axes(table)
    rows: list[tuple[dict, np.ndarray, np.ndarray]] = []  # each curve's row, batch sizes and steps
    resampled: list[tuple[dict, list[tuple[int, StudyOutcomes]], HyperbolaFit, float]] = []  # with trials
    columns = curve_columns(table)
    grouped = curves(table)
    base = len(CURVE_KEYS)
    # Each study's trials, grouped once: a comparison per study would cost studies x trials.
    trials_of = outcomes_by_study(trials) if trials is not None and len(trials) else {}
    for key, group in grouped.items():
        row: dict = {**dict(zip(columns, key)), "points": int(group["steps_to_result"].notna().sum()), "note": ""}
        siblings = [other for other in grouped if other[:base] == key[:base]]
        if len(siblings) > 1:
            differing = [c for i, c in enumerate(columns[base:], base) if len({str(k[i]) for k in siblings}) > 1]
            row["note"] = (f"one of {len(siblings)} curves of this workload, optimizer, sparsity and pruning method: "
                           f"the studies differ in {', '.join(differing)}")
        b, s = group["batch_size"].to_numpy(), group["steps_to_result"].to_numpy(dtype=float)
        fit = None
        try:
            fit = fit_hyperbola(b, s)
            row.update({"s_min": fit.s_min, "b_crit": fit.b_crit, "rmse_log": fit.rmse_log, "r2_log": fit.r2_log,
                        "b_crit_threshold_fit": fitted_threshold(fit, _points(b, s)[0][0], tolerance)})
        except InsufficientData as error:
            row["note"] = (row["note"] + "; " if row["note"] else "") + f"no fit: {error}"
        try:
            bounds = regime_boundaries(b, s, tolerance)
            row.update({"perfect_scaling_end": bounds.perfect_scaling_end,
                        "maximal_parallelism_start": bounds.maximal_parallelism_start,
                        "b_crit_threshold": threshold_critical_batch(b, s, tolerance)})
        except InsufficientData:
            pass
        row["slopes"] = " ".join(f"{lo}-{hi}:{slope:+.2f}" for lo, hi, slope in local_slopes(b, s))
        if trials is not None and fit is not None and len(trials):
            # every study of the curve, as the fit has them: a batch size may have several
            by_size = [(int(bs), trials_of[str(key)]) for bs, key in zip(group["batch_size"], group["study_key"])
                       if pd.notna(key) and str(key) in trials_of]
            if len({size for size, _ in by_size}) >= MIN_POINTS:
                resampled.append((row, by_size, fit, _points(b, s)[0][0]))
            else:
                row["note"] = (row["note"] + "; " if row["note"] else "") + "no intervals: trials not available"
        rows.append((row, b, s))
    intervals = [bootstrap(by_size, repeats, seed, tolerance, fit) for _, by_size, fit, _ in resampled]
    for (row, by_size, fit, smallest), found in zip(resampled, intervals):
        for name, interval in found.items():
            row[f"{name}_low"], row[f"{name}_high"] = interval.low, interval.high
        if row.get("b_crit_low") is not None:  # increasing in B_crit at the measured B_0
            for end in ("low", "high"):
                row[f"b_crit_threshold_fit_{end}"] = fitted_threshold(
                    HyperbolaFit(fit.s_min, row[f"b_crit_{end}"], fit.rmse_log, fit.r2_log), smallest, tolerance)
        row.update(interval_basis(by_size))
    for row, b, s in rows:
        row["note"] = "; ".join([part for part in (row["note"],) if part] + fit_warnings(row, b, s))
    return pd.DataFrame([row for row, _, _ in rows])


# What the bootstrap of a curve resampled (fit-table columns): the studies, those with a single reaching
# trial, and the trials superseded by exact early stopping (known only to be slower than the best).
BASIS_COLUMNS = ("interval_studies", "interval_studies_one_reaching", "interval_trials_superseded")


def interval_basis(curve_trials: CurveTrials) -> dict[str, int]:
    """The counts of BASIS_COLUMNS for one curve's trials (one table per study, as :func:`bootstrap` takes)."""
    studies = [outcomes for _, outcomes in _studies(curve_trials)]
    reached = [int(np.isfinite(outcomes.reached_steps).sum()) for outcomes in studies]  # as the resamples count
    superseded = sum(outcomes.superseded for outcomes in studies)
    return dict(zip(BASIS_COLUMNS, (len(reached), sum(1 for r in reached if r == 1), superseded)))


def interval_basis_warning(row: dict | pd.Series) -> str | None:
    """Why a curve's intervals say little, in words with the counts, and what would help; None when they
    rest on more than one reaching trial in most studies."""
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


def fit_warnings(row: dict, batch_sizes: np.ndarray, steps: np.ndarray) -> list[str]:
    """Why a curve's fit may not mean what it seems: said in the fit's note, drawn grey in the figure."""
    b, s = _points(batch_sizes, steps)
    warnings = []
    if 0 < len(b) < 2 + 1:
        warnings.append(f"{len(b)} points for a 2-parameter fit: the fit cannot be checked")
    if len(b) >= 2 and s[-1] > s[0]:
        warnings.append("steps rise with batch size: the hyperbola does not describe this curve")
    b_crit = row.get("b_crit")
    if b_crit is not None and not pd.isna(b_crit) and len(b):
        if b_crit < b[0] / 100 or b_crit > b[-1] * 100:
            warnings.append(f"B_crit {b_crit:.3g} lies far outside the measured batch sizes {int(b[0])}..{int(b[-1])}: "
                            f"not determined by these points")
    for name in ("s_min", "b_crit"):
        low, high, value = row.get(f"{name}_low"), row.get(f"{name}_high"), row.get(name)
        if value is None or pd.isna(value) or low is None or high is None or pd.isna(low) or pd.isna(high):
            continue
        if any(unbounded(value, low, high)):
            warnings.append(f"the {name} interval is practically unbounded ({low:.3g} .. {high:.3g})")
        if not contains_estimate(low, value, high):
            # A basic interval reflects the resamples about the estimate: when nearly every resample's
            # minimum lies on one side of it, the interval ends on the other side, short of the estimate.
            warnings.append(f"the {name} interval ({low:.3g} .. {high:.3g}) does not contain the estimate "
                            f"{value:.3g}: the resampled minima lie almost all on one side of it (too few "
                            f"reaching trials)")
    basis = interval_basis_warning(row)
    if basis:
        warnings.append(basis)
    if row.get("perfect_scaling_end") is None or pd.isna(row.get("perfect_scaling_end")):
        if len(b) >= 2:
            warnings.append(f"perfect scaling through the largest batch size with a result ({int(b[-1])}): "
                            f"perfect_scaling_end lies beyond the measurements")
    end, start = row.get("perfect_scaling_end"), row.get("maximal_parallelism_start")
    if end is not None and start is not None and not pd.isna(end) and not pd.isna(start) and start < end:
        warnings.append(f"maximal data parallelism seems to start ({int(start)}) before perfect scaling ends "
                        f"({int(end)}): the curve is too flat or noisy to separate the regimes")
    return warnings


# An interval end more than this factor from its estimate says nothing about where the value is.
UNBOUNDED_FACTOR = 100.0


def unbounded(value: float, low: float, high: float) -> tuple[bool, bool]:
    """Whether each end of an interval is practically unbounded (more than UNBOUNDED_FACTOR from the value)."""
    return bool(low < value / UNBOUNDED_FACTOR), bool(high > value * UNBOUNDED_FACTOR)


def is_degenerate(row: pd.Series | dict) -> bool:
    """A fit whose note says it does not describe the curve (drawn grey)."""
    note = str(row.get("note", "") or "")
    return any(flag in note for flag in ("no fit", "steps rise", "far outside", "cannot be checked"))


def sparsity_comparison(table: pd.DataFrame) -> pd.DataFrame:
    """Per curve and batch size: steps relative to the dense curve of its (workload, optimizer), and each
    curve normalised by its own first (smallest batch size) point."""
    table = with_curve_axes(table)
    rows = []
    # Compared only within one protocol (see PROTOCOL_KEYS) and one curve family (every curve axis but the
    # sparsity and the pruning method: the dense curve, pruned by none, is every method's reference); a batch
    # size measured twice counts once.
    protocol = curve_columns(table)[len(CURVE_KEYS):]
    family = [axis for axis in CURVE_KEYS if axis not in ("sparsity", "pruning")]
    for _, group in table.groupby([*family, *protocol], sort=True, dropna=False):
        head = {axis: group[axis].iloc[0] for axis in family}
        protocol_values = {column: group[column].iloc[0] for column in protocol}
        dense_rows = group[group["sparsity"] == 0.0].drop_duplicates("batch_size", keep="last")
        dense = pd.to_numeric(dense_rows.set_index("batch_size")["steps_to_result"], errors="coerce")
        for (sparsity, pruning), curve in group.groupby(["sparsity", "pruning"], sort=True):
            curve = curve.sort_values("batch_size")
            # A study that reached nothing has no steps (None in an object column): NaN, not a TypeError.
            steps = pd.to_numeric(curve["steps_to_result"], errors="coerce").to_numpy(dtype=float)
            reached = steps[~np.isnan(steps)]
            first = reached[0] if len(reached) else math.nan
            reference = dense.reindex(curve["batch_size"]).to_numpy(dtype=float)
            with np.errstate(divide="ignore", invalid="ignore"):
                relative = np.where((reference != 0) & ~np.isnan(reference), steps / reference, math.nan)
                normalised = steps / first if first and not math.isnan(first) else np.full(len(steps), math.nan)
            rows.append(pd.DataFrame({**head, "sparsity": sparsity, "pruning": pruning, **protocol_values,
                                      "batch_size": curve["batch_size"].to_numpy().astype(int),
                                      "steps_to_result": steps, "relative_to_dense": relative,
                                      "normalised_by_first": normalised}))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()
