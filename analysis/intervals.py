"""What a curve's intervals rest on, and the bootstrap over replicates (docs/fit.md): where every fitted point has
MIN_REPLICATES replicates or more, each point's replicates are resampled with replacement, each draw's steps placed
uniformly within its check interval, the point taken by the point rule and the curve refitted; percentile intervals
(the point is a mean, not a minimum). Else the trial bootstrap where every study trained every trial to its end;
else none, and why. An interval whose ends are equal (every resample alike) is dropped, with the reason."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import numpy as np
import pandas as pd

from analysis.bootstrap import GRID_VALUES, Interval, StudyOutcomes, percentile_interval, resample_statistics
from analysis.replicates import MIN_REPLICATES, censored, point_values

# A curve's intervals rest on (fit-table column interval_basis) ...
BASIS_REPLICATES, BASIS_TRIALS, BASIS_SOME = "replicates", "complete trials", "replicates at some points"
# The note of a `replicates at some points` curve: from its start to its end, the clause that names the points.
SOME_POINTS_START, SOME_POINTS_END = "intervals over the replicates at batch sizes", "noise is not in the intervals"
# ... and on how many: the fewest replicates at a fitted point (column interval_replicates).
HOW_TO_GET_ONE = f"--replicates {MIN_REPLICATES} or more, or studies with full_trials=true, would give them"
# Why a curve with grounds for intervals has none of its fit (percentile_interval wants a quarter of the resamples).
NO_FIT_INTERVALS = ("no s_min, b_crit, e_min intervals: fewer than a quarter of the resamples kept enough points for "
                    "a fit (a point is lost where more than half of its resampled studies did not reach)")


class Basis(Enum):
    REPLICATES = BASIS_REPLICATES
    TRIALS = BASIS_TRIALS
    # Replicates where an adaptive sweep spent them (the points that decide its answer), the other points held at
    # their values: an interval of those points' noise alone, and said so.
    SOME_REPLICATES = BASIS_SOME
    NONE = ""


@dataclass(frozen=True)
class Grounds:
    """What a curve's intervals can rest on: the basis, and why none where there is none (or, with replicates at
    some points, what the intervals leave out)."""
    basis: Basis
    note: str = ""


def grounds(replicates: dict[int, np.ndarray], fitted: list[int], outcomes: list[StudyOutcomes | None]) -> Grounds:
    """Replicates where every fitted batch size has MIN_REPLICATES; else complete trials where every study's
    trials were read and none was superseded (exact early stopping supersedes them); else replicates where some
    fitted batch sizes have MIN_REPLICATES (an adaptive sweep spends them where its answer is decided); else none,
    and why.
    ``outcomes``: each study's trials (None: not read); empty where no trials were read at all."""
    fewest = min((len(replicates[size]) for size in fitted), default=0)
    if fitted and fewest >= MIN_REPLICATES:
        return Grounds(Basis.REPLICATES)
    missing = sum(o is None for o in outcomes)
    superseded = sum(o is not None and o.superseded > 0 for o in outcomes)
    if outcomes and not missing and not superseded:
        return Grounds(Basis.TRIALS)
    replicated = [size for size in fitted if len(replicates[size]) >= MIN_REPLICATES]
    if replicated:
        return Grounds(Basis.SOME_REPLICATES, f"{SOME_POINTS_START} {', '.join(map(str, replicated))} "
                                              f"({MIN_REPLICATES} or more each); the other points, with fewer, are "
                                              f"held at their values, so their seed {SOME_POINTS_END}")
    short = (f"the fewest replicates at a fitted point is {fewest} (intervals over replicates need "
             f"{MIN_REPLICATES} at every point)")
    if not outcomes:
        return Grounds(Basis.NONE, f"no intervals: {short} and no trials were read; {HOW_TO_GET_ONE}")
    if missing:
        return Grounds(Basis.NONE, f"no intervals: {short} and the trials of {missing} of {len(outcomes)} studies "
                                   f"are not available; {HOW_TO_GET_ONE}")
    return Grounds(Basis.NONE, f"no intervals: {short} and {superseded} of {len(outcomes)} studies had trials "
                               f"superseded by exact early stopping (known only to be slower than the best, so "
                               f"a resample of them is no sample of the study); {HOW_TO_GET_ONE}")


def some_points_words(note: object) -> str:
    """The clause of a fit-table note that names the replicated points of a `replicates at some points` curve and
    says what its intervals leave out ("" where the note has none)."""
    note = str(note or "")
    start, end = note.find(SOME_POINTS_START), note.find(SOME_POINTS_END)
    return note[start:end + len(SOME_POINTS_END)] if 0 <= start < end else ""


def resampled_points(replicates: dict[int, np.ndarray], check: int | None, repeats: int,
                     rng: np.random.Generator, held: frozenset[int] = frozenset()) -> np.ndarray:
    """``repeats`` resamples of every point (a column per batch size, in order): its replicates drawn with
    replacement (those of ``held`` batch sizes kept as they are), each draw within its censoring, taken together
    by the point rule."""
    columns = []
    for size in sorted(replicates):
        steps = replicates[size]
        drawn = np.tile(steps, (repeats, 1)) if size in held else \
            steps[rng.integers(0, len(steps), size=(repeats, len(steps)))]
        columns.append(point_values(censored(drawn, check, rng)))
    return np.column_stack(columns) if columns else np.empty((repeats, 0))


def replicate_bootstrap(replicates: dict[int, np.ndarray], check: int | None, repeats: int = 200, seed: int = 0,
                        tolerance: float = 0.2, held: frozenset[int] = frozenset()) -> dict[str, Interval]:
    """95% percentile intervals of S_min, B_crit, E_min, the boundaries and the threshold over resamples of each
    point's replicates (each draw within its censoring; ``held`` points' replicates not resampled, only their
    censoring drawn); point_table's per point come from the same resamples."""
    sizes = np.array(sorted(replicates), dtype=float)
    resampled = resampled_points(replicates, check, repeats, np.random.default_rng(seed), held)
    samples = resample_statistics(sizes, resampled, tolerance)
    return {name: percentile_interval(values, repeats, grid=name in GRID_VALUES) for name, values in samples.items()}


def point_intervals(replicates: dict[int, np.ndarray], resampled: np.ndarray, repeats: int) -> dict[int, Interval]:
    """Each point's interval from its column of ``resampled``, where it has MIN_REPLICATES replicates."""
    return {size: open_interval(resampled[:, i], repeats) if len(replicates[size]) >= MIN_REPLICATES
            else Interval(None, None) for i, size in enumerate(sorted(replicates))}


def open_interval(values: np.ndarray, repeats: int) -> Interval:
    """A resample without a value is a point that did not reach (more than half its replicates drawn did not):
    infinitely many steps, not a resample to leave out, so where more than 2.5% lack one the high end is inf."""
    lost = ~np.isfinite(values)
    if lost.mean() <= 0.025:
        return percentile_interval(values, repeats)
    if lost.mean() >= 0.975:
        return Interval(None, None)
    return Interval(float(np.percentile(np.where(lost, np.inf, values), 2.5, method="lower")), math.inf)


def collapsed(low: object, high: object) -> bool:
    """Whether an interval's ends are equal (every resample alike): such an interval is dropped, never [x, x]."""
    return all(v is not None and not pd.isna(v) for v in (low, high)) and math.isclose(
        float(low), float(high), rel_tol=1e-9, abs_tol=0.0)


def drop_collapsed(row: dict, names: tuple[str, ...]) -> list[str]:
    """Each interval of ``row`` (<name>_low, <name>_high) whose ends are equal dropped; the reasons."""
    reasons = []
    for name in names:
        low, high = row.get(f"{name}_low"), row.get(f"{name}_high")
        if collapsed(low, high):
            row[f"{name}_low"] = row[f"{name}_high"] = None
            reasons.append(f"no {name} interval: every resample gave {float(low):.6g}")
    return reasons
