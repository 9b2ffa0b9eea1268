"""The threshold critical batch size under check-interval censoring (docs/fit.md): a study that reached at step s
reached somewhere in s - c + 1 .. s, so a batch size's verdict ("within the tolerance of ideal scaling from B_0") is
decided only where it holds at both ends of both points' censoring: pessimistic (S_B at its top, S_0 at its bottom)
and optimistic (the reverse). Where the two differ the threshold is undecided at this check interval, with what
would decide it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from analysis.replicates import censoring_bottom, point_value, spread

CENSORED_COLUMNS = ("b_crit_threshold_censored_low", "b_crit_threshold_censored_high", "b_crit_threshold_decided",
                    "perfect_scaling_end_censored_low", "perfect_scaling_end_censored_high")


@dataclass(frozen=True)
class Flip:
    """A batch size whose verdict differs between the ends of the censoring."""
    batch_size: int
    distance: float  # steps between its point and the tolerance line
    deciding_check: int  # the largest check interval that would decide it
    spread: tuple[float, float] | None  # its replicates' fewest and most steps (two or more reached)


@dataclass(frozen=True)
class Censoring:
    check: int
    threshold: tuple[int, int]  # pessimistic, optimistic
    end: tuple[int | None, int | None]  # the first failing batch size at each end (None: none fails)
    flips: tuple[Flip, ...]

    @property
    def decided(self) -> bool:
        return self.threshold[0] == self.threshold[1]

    def columns(self) -> dict:
        return dict(zip(CENSORED_COLUMNS, (*self.threshold, self.decided, *self.end)))

    def words(self) -> str:
        """Why the threshold is undecided and what would decide it; empty where it is decided."""
        if self.decided:
            return ""
        flip = min(self.flips, key=lambda f: f.deciding_check)
        text = (f"b_crit_threshold undecided at check interval {self.check}: between {self.threshold[0]} and "
                f"{self.threshold[1]}, since batch size {flip.batch_size} lies {flip.distance:.3g} steps from the "
                f"tolerance line: a check interval of {flip.deciding_check} steps or fewer would decide it")
        if flip.spread is not None:
            wider = flip.spread[1] - flip.spread[0] > self.check
            text += (f" (the seed spread there, {spread(*flip.spread)} steps, is "
                     + ("wider than the check interval, so more replicates matter more than a finer check)" if wider
                        else "within the check interval, so a finer check matters more than more replicates)"))
        return text


def _first_failing(passes: np.ndarray) -> int | None:
    failing = np.nonzero(~passes)[0]
    return int(failing[0]) if len(failing) else None


def threshold_censoring(replicates: dict[int, np.ndarray], check: int | None,
                        tolerance: float = 0.2) -> Censoring | None:
    """The threshold and perfect_scaling_end at both ends of the censoring of each point with a result (its
    replicates' steps; the point rule gives each end); None where the check interval is unknown or a curve has
    fewer than two points."""
    sizes = [size for size, steps in sorted(replicates.items()) if math.isfinite(point_value(steps))]
    if not check or len(sizes) < 2:
        return None
    b = np.array(sizes, dtype=float)
    top = np.array([point_value(replicates[size]) for size in sizes])
    bottom = np.array([point_value(censoring_bottom(replicates[size], check)) for size in sizes])
    limit = 1.0 + tolerance
    pessimistic = top * b <= limit * bottom[0] * b[0]
    optimistic = bottom * b <= limit * top[0] * b[0]
    pessimistic[0] = optimistic[0] = True  # B_0 is where scaling is measured from
    ends = _first_failing(pessimistic), _first_failing(optimistic)
    thresholds = tuple(sizes[end - 1] if end is not None else sizes[-1] for end in ends)
    last = ends[1] if ends[1] is not None else len(sizes)
    flips = []
    for i in range(1, last):
        if pessimistic[i] == optimistic[i]:
            continue
        line = limit * top[0] * b[0] / b[i]
        distance = abs(top[i] - line)
        # failing as recorded: the optimistic end decides at c' < distance + 1; passing: the pessimistic one,
        # whose line moves with S_0's censoring
        deciding = math.ceil(distance) if top[i] > line else math.floor(1 + distance * b[i] / (limit * b[0]))
        reached = replicates[sizes[i]][np.isfinite(replicates[sizes[i]])]
        spread = (float(reached.min()), float(reached.max())) if len(reached) >= 2 else None
        flips.append(Flip(sizes[i], float(distance), max(1, deciding), spread))
    return Censoring(check, thresholds, tuple(sizes[e] if e is not None else None for e in ends), tuple(flips))
