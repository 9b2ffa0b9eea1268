"""A curve's replicates: the independent studies at each of its batch sizes (their own seeds, the same search
points), summarised per point by the one rule every table, fit and interval uses (docs/fit.md), and the check
interval that censors each study's steps."""

from __future__ import annotations

import numpy as np
import pandas as pd

# The fewest replicates at a point for an interval that rests on them: two give three distinct resamples.
MIN_REPLICATES = 3
POINT_COLUMNS = ("batch_size", "steps_to_result", "replicates", "replicates_reached", "steps_min", "steps_max")


def point_values(steps: np.ndarray) -> np.ndarray:
    """:func:`point_value` of every row of ``steps`` (a row: one set of a point's replicates, e.g. a resample)."""
    steps = np.atleast_2d(np.asarray(steps, dtype=float))
    reached = np.isfinite(steps) & (steps > 0)
    count = reached.sum(axis=1)
    logs = np.where(reached, np.log(np.where(reached, steps, 1.0)), 0.0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.exp(logs / np.maximum(count, 1))
    # one reaching replicate keeps its steps exactly (exp(log(s)) may miss it in the last digit)
    single = np.where(reached, steps, 0.0).max(axis=1)
    return np.where(2 * count > steps.shape[1], np.where(count == 1, single, mean), np.nan)


def point_value(steps: np.ndarray) -> float:
    """One point's steps-to-result from its replicates' (NaN or inf: that replicate did not reach): the geometric
    mean of those that reached (the fits work in log steps) where more than half reached, else NaN (the point
    did not reach: a mean of the lucky few would flatter it)."""
    steps = np.asarray(steps, dtype=float).ravel()
    return float(point_values(steps[None, :])[0]) if len(steps) else float("nan")


def spread(fewest: float, most: float) -> str:
    """Replicates' fewest and most steps as ``fewest..most``, or ``all x`` where they are alike (never ``x..x``)."""
    return f"all {fewest:g}" if fewest == most else f"{fewest:g}..{most:g}"


def replicate_steps(group: pd.DataFrame) -> dict[int, np.ndarray]:
    """One curve's study rows as each batch size's replicates' steps (NaN: did not reach), by batch size: every
    study row is a replicate (the seed column says which seed; a CSV without it: each row is one)."""
    return {int(size): pd.to_numeric(studies["steps_to_result"], errors="coerce").to_numpy(dtype=float)
            for size, studies in group.groupby("batch_size", sort=True)}


def point_steps(group: pd.DataFrame) -> pd.DataFrame:
    """One curve's study rows (columns batch_size and steps_to_result, one row per study) as one row per batch
    size (POINT_COLUMNS), sorted by batch size; a point of one study keeps that study's steps."""
    rows = []
    for batch_size, steps in replicate_steps(group).items():
        reached = steps[np.isfinite(steps) & (steps > 0)]
        rows.append({"batch_size": batch_size, "steps_to_result": point_value(steps), "replicates": len(steps),
                     "replicates_reached": len(reached),
                     "steps_min": float(reached.min()) if len(reached) else float("nan"),
                     "steps_max": float(reached.max()) if len(reached) else float("nan")})
    return pd.DataFrame(rows, columns=list(POINT_COLUMNS))


def censoring_bottom(steps: np.ndarray, check: int) -> np.ndarray:
    """The fewest steps within each step's censoring: s - c + 1, never below step 1."""
    return np.maximum(np.asarray(steps, dtype=float) - (check - 1), 1.0)


def check_interval(group: pd.DataFrame) -> int | None:
    """The check interval of a curve's studies (a protocol column, so one per curve; the largest where several
    are given), None where unknown: a study that reached at step s reached somewhere in s - c + 1 .. s."""
    if "check_interval" not in group.columns:
        return None
    values = pd.to_numeric(group["check_interval"], errors="coerce").dropna()
    return int(values.max()) if len(values) else None


def censored(steps: np.ndarray, check: int | None, rng: np.random.Generator) -> np.ndarray:
    """``steps`` (integers) each drawn uniformly within its censoring s - c + 1 .. s, never below step 1 (steps
    made elsewhere need not be multiples of the check interval); unchanged without one."""
    if not check or check <= 1:
        return steps
    return np.maximum(steps - rng.integers(0, check, size=np.shape(steps)), 1.0)
