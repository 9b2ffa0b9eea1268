"""One curve's points fitted and bounded (docs/fit.md defines each quantity): the hyperbola S(B) = S_min (1 + B_crit
/ B) by least squares in log space (McCandlish et al. 2018), the regime boundaries (Zhang et al. 2024) and the
threshold critical batch size, measured (Zhang et al. 2025; bracketed as Merrill et al. 2025) and fitted."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MIN_POINTS = 3


class InsufficientData(ValueError):
    """A curve with too few points for a meaningful fit."""


@dataclass(frozen=True)
class HyperbolaFit:
    s_min: float
    b_crit: float
    rmse_log: float  # root mean square residual of log S (natural log)
    r2_log: float

    @property
    def e_min(self) -> float:
        """McCandlish et al.'s minimum examples to the goal, S_min B_crit (the fit's E(B) = E_min (1 + B / B_crit))."""
        return self.s_min * self.b_crit


@dataclass(frozen=True)
class Boundaries:
    perfect_scaling_end: int | None  # first measured batch size beyond perfect scaling (None: never left)
    maximal_parallelism_start: int | None  # None: no plateau within the measured range


def points(batch_sizes: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The points with a result (finite, positive steps), by batch size."""
    batch_sizes, steps = np.asarray(batch_sizes, dtype=float), np.asarray(steps, dtype=float)
    keep = np.isfinite(steps) & (steps > 0)
    order = np.argsort(batch_sizes[keep])
    return batch_sizes[keep][order], steps[keep][order]


def fit_hyperbola(batch_sizes: np.ndarray, steps: np.ndarray) -> HyperbolaFit:
    """The hyperbola through one curve's points, by the bootstrap's own solver (:func:`fit_hyperbolas`): an
    estimate and its resamples stop alike where the minimum is not defined."""
    b, s = points(batch_sizes, steps)
    if len(b) < MIN_POINTS:
        raise InsufficientData(f"{len(b)} batch sizes with a result; a fit needs at least {MIN_POINTS}")
    s_min, b_crit = (float(value[0]) for value in fit_hyperbolas(b, s[None, :]))
    log_s = np.log(s)
    fitted = math.log(s_min) + np.logaddexp(0.0, math.log(b_crit) - np.log(b)) - log_s
    total = float(np.sum((log_s - log_s.mean()) ** 2))
    return HyperbolaFit(s_min=s_min, b_crit=b_crit, rmse_log=float(np.sqrt(np.mean(fitted ** 2))),
                        r2_log=float(1.0 - np.sum(fitted ** 2) / total) if total > 0 else float("nan"))


# Levenberg-Marquardt as MINPACK stops it with least_squares' defaults: a step is kept when it lowers the sum
# of squares; it stops when a kept step lowers it by less than FIT_TOLERANCE of it or moves the parameters by
# less than FIT_TOLERANCE of their size, or after FIT_ITERATIONS steps.
FIT_TOLERANCE = 1e-8
FIT_ITERATIONS = 300
DAMPING_UP, DAMPING_DOWN, MAX_DAMPING = 4.0, 3.0, 1e16
FAR_OUT = 50.0  # in log B: a factor e^50, about 5e21


def fit_hyperbolas(batch_sizes: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """S_min and B_crit of many curves measured at the same batch sizes (a row of ``steps`` per curve; a value not
    finite and positive is missing; NaN for a row of fewer than MIN_POINTS points), fitted together by
    Levenberg-Marquardt in numpy (a bootstrap refits a curve hundreds of times). It finds MINPACK's minimum; where
    there is none (B_crit far beyond the batch sizes) it stops FAR_OUT beyond them."""
    b = np.asarray(batch_sizes, dtype=float)
    order = np.argsort(b, kind="stable")
    b = b[order]
    s = np.atleast_2d(np.asarray(steps, dtype=float))[:, order]
    valid = np.isfinite(s) & (s > 0)
    fitted = valid.sum(axis=1) >= MIN_POINTS
    s_min, b_crit = np.full(len(s), np.nan), np.full(len(s), np.nan)
    if not fitted.any():
        return s_min, b_crit
    s, valid = s[fitted], valid[fitted]
    weight, log_b = valid.astype(float), np.log(b)[None, :]
    log_s = np.log(np.where(valid, s, 1.0))
    bounds = log_b[0, 0] - FAR_OUT, log_b[0, -1] + FAR_OUT
    theta = _levenberg_marquardt(_start(b, s, valid), weight, log_b, log_s, bounds)
    # A row stopped at a bound: its S_min is the best one for that B_crit (least squares in log S_min alone).
    bound = (theta[:, 1] <= bounds[0]) | (theta[:, 1] >= bounds[1])
    points_per_row = weight.sum(axis=1)
    theta[bound, 0] = ((log_s - np.logaddexp(0.0, theta[:, 1:] - log_b)) * weight)[bound].sum(axis=1) \
        / points_per_row[bound]
    s_min[fitted], b_crit[fitted] = np.exp(theta[:, 0]), np.exp(theta[:, 1])
    return s_min, b_crit


def _start(b: np.ndarray, s: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """The start per row: the plateau (the last point) and the crossing of the asymptotes through first and last."""
    rows, first = np.arange(len(s)), np.argmax(valid, axis=1)
    last = valid.shape[1] - 1 - np.argmax(valid[:, ::-1], axis=1)
    b_first, b_last, s_first, s_last = b[first], b[last], s[rows, first], s[rows, last]
    crossing = np.maximum(b_first, np.minimum(b_last, s_first * b_first / s_last))
    return np.column_stack([np.log(s_last), np.log(crossing)])


def _levenberg_marquardt(theta: np.ndarray, weight: np.ndarray, log_b: np.ndarray, log_s: np.ndarray,
                         bounds: tuple[float, float]) -> np.ndarray:
    lowest, highest = bounds

    def residuals(theta: np.ndarray) -> np.ndarray:
        return (theta[:, :1] + np.logaddexp(0.0, theta[:, 1:] - log_b) - log_s) * weight

    r = residuals(theta)
    cost = np.einsum("ij,ij->i", r, r)
    damping, active, count = np.full(len(theta), 1e-3), np.ones(len(theta), dtype=bool), weight.sum(axis=1)
    for _ in range(FIT_ITERATIONS):
        if not active.any():
            break
        # The Jacobian's columns: 1, and the logistic of log B_crit - log B; the 2x2 normal equations with
        # their diagonal scaled by 1 + damping (Marquardt), solved in closed form for every row.
        slope = weight * np.exp(-np.logaddexp(0.0, -(theta[:, 1:] - log_b)))
        a01, a11 = slope.sum(axis=1), np.einsum("ij,ij->i", slope, slope)
        g0, g1 = r.sum(axis=1), np.einsum("ij,ij->i", slope, r)
        d00, d11 = count * (1.0 + damping), a11 * (1.0 + damping)
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
        active &= ~done & solvable & (damping < MAX_DAMPING) & ~at_bound
    return theta


def regime_boundaries(batch_sizes: np.ndarray, steps: np.ndarray, tolerance: float = 0.2) -> Boundaries:
    b, s = points(batch_sizes, steps)
    if len(b) < 2:
        raise InsufficientData(f"{len(b)} batch sizes with a result; boundaries need at least 2")
    beyond = np.nonzero(s > (1.0 + tolerance) * (s[0] * b[0] / b))[0]
    within = s <= (1.0 + tolerance) * s[-1]
    start = len(b) - 1
    while start > 0 and within[start - 1]:
        start -= 1
    # a plateau needs at least two points; a single last point is not one
    return Boundaries(int(b[beyond[0]]) if len(beyond) else None, int(b[start]) if start < len(b) - 1 else None)


def threshold_critical_batch(batch_sizes: np.ndarray, steps: np.ndarray, tolerance: float = 0.2) -> int:
    """The largest measured batch size up to which steps stay within ``tolerance`` of ideal linear scaling
    from the smallest one; a batch size that passes again after one that failed (noise) does not count."""
    b, s = points(batch_sizes, steps)
    if len(b) < 2:
        raise InsufficientData(f"{len(b)} batch sizes with a result; the threshold needs at least 2")
    beyond = np.nonzero(s > (1.0 + tolerance) * s[0] * b[0] / b)[0]
    return int(b[beyond[0] - 1]) if len(beyond) else int(b[-1])


def fitted_threshold(fit: HyperbolaFit, smallest_batch_size: float, tolerance: float = 0.2) -> float:
    """Where the fit's steps exceed ideal linear scaling from B_0 by ``tolerance``: S(B) B = (1 + tolerance)
    S(B_0) B_0 with S(B) B = S_min (B + B_crit) gives B = (1 + tolerance) B_0 + tolerance B_crit."""
    return (1.0 + tolerance) * float(smallest_batch_size) + tolerance * fit.b_crit


def local_slopes(batch_sizes: np.ndarray, steps: np.ndarray) -> list[tuple[int, int, float]]:
    """(B_i, B_i+1, d log S / d log B) between measured batch sizes (several studies of one: their median)."""
    b, s = points(batch_sizes, steps)
    b, s = np.unique(b), np.array([np.median(s[b == size]) for size in np.unique(b)])
    return [(int(b[i]), int(b[i + 1]), float(np.log(s[i + 1] / s[i]) / np.log(b[i + 1] / b[i])))
            for i in range(len(b) - 1)]
