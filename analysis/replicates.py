"""A curve's replicates: the independent studies at each of its batch sizes (their own seeds, the same search
points), summarised per point by the one rule every table, fit and interval uses (docs/fit.md)."""

from __future__ import annotations

import numpy as np
import pandas as pd

# The fewest replicates at a point for an interval that rests on them: two give three distinct resamples.
MIN_REPLICATES = 3
POINT_COLUMNS = ("batch_size", "steps_to_result", "replicates", "replicates_reached", "steps_min", "steps_max")


def point_value(steps: np.ndarray) -> float:
    """One point's steps-to-result from its replicates' (NaN or inf: that replicate did not reach): the geometric
    mean of those that reached (the fits work in log steps) where more than half reached, else NaN (the point
    did not reach: a mean of the lucky few would flatter it)."""
    steps = np.asarray(steps, dtype=float)
    reached = steps[np.isfinite(steps) & (steps > 0)]
    if not len(steps) or 2 * len(reached) <= len(steps):
        return float("nan")
    return float(np.exp(np.mean(np.log(reached))))


def point_steps(group: pd.DataFrame) -> pd.DataFrame:
    """One curve's study rows (columns batch_size and steps_to_result, one row per study) as one row per batch
    size (POINT_COLUMNS), sorted by batch size; a point of one study keeps that study's steps."""
    rows = []
    for batch_size, studies in group.groupby("batch_size", sort=True):
        steps = pd.to_numeric(studies["steps_to_result"], errors="coerce").to_numpy(dtype=float)
        reached = steps[np.isfinite(steps) & (steps > 0)]
        rows.append({"batch_size": int(batch_size), "steps_to_result": point_value(steps), "replicates": len(steps),
                     "replicates_reached": len(reached),
                     "steps_min": float(reached.min()) if len(reached) else float("nan"),
                     "steps_max": float(reached.max()) if len(reached) else float("nan")})
    return pd.DataFrame(rows, columns=list(POINT_COLUMNS))
