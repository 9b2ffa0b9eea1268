"""Metaparameter search spaces as data, and the paper's quasi-random Sobol points.

The original code draws points from an unscrambled Sobol generator with ``skip=2``, i.e. the
sequence without its leading all-zero point: the first point is 0.5 in every dimension, so the
first learning rate on the paper's 1e-4..1 log range is 0.01. The same list of points is reused
at every batch size.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from enum import Enum

import numpy as np
from scipy.stats import qmc


class Scale(str, Enum):
    LINEAR = "linear"
    LOG = "log"
    # 1 - value is log-uniform (momentum 0.9 .. 0.9999).
    REVERSE_LOG = "reverse_log"


@dataclass(frozen=True)
class Dimension:
    """One tuned metaparameter: its range and how a unit coordinate maps onto it."""

    name: str
    low: float
    high: float
    scale: Scale
    integer: bool = False

    def value(self, unit: float) -> float:
        """Map a coordinate in [0, 1] onto the range as the original code does.

        Linear and log: 0 -> low, 1 -> high. Reverse log: 1 - value is log-uniform and, as in the
        original, 0 -> high (momentum 0.9999), 1 -> low (0.9). Integers are truncated, as ``int()``.
        """
        if self.scale is Scale.LINEAR:
            value = self.low + unit * (self.high - self.low)
        elif self.scale is Scale.LOG:
            value = math.exp(math.log(self.low) + unit * (math.log(self.high) - math.log(self.low)))
        else:
            low_gap, high_gap = 1.0 - self.low, 1.0 - self.high
            value = 1.0 - math.exp(math.log(high_gap) + unit * (math.log(low_gap) - math.log(high_gap)))
        return float(int(value)) if self.integer else value

    def unit(self, value: float) -> float:
        """The inverse of :meth:`value`: where a value lies in the unit interval."""
        if self.scale is Scale.LINEAR:
            return (value - self.low) / (self.high - self.low)
        if self.scale is Scale.LOG:
            return (math.log(value) - math.log(self.low)) / (math.log(self.high) - math.log(self.low))
        low_gap, high_gap = 1.0 - self.low, 1.0 - self.high
        return (math.log(1.0 - value) - math.log(high_gap)) / (math.log(low_gap) - math.log(high_gap))


@dataclass(frozen=True)
class SearchSpace:
    """Tuned dimensions in a fixed order (the order decides which Sobol coordinate each gets)."""

    dimensions: tuple[Dimension, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dimensions)

    def points(self, count: int) -> list[dict[str, float]]:
        """The first ``count`` metaparameter points of the paper's Sobol order."""
        units = sobol_points(count, len(self.dimensions))
        return [{d.name: d.value(float(u)) for d, u in zip(self.dimensions, row)} for row in units]

    def units(self, point: dict[str, float]) -> np.ndarray:
        """The unit-cube coordinates of a point (used to order trials by closeness)."""
        return np.array([d.unit(point[d.name]) for d in self.dimensions])


def sobol_points(count: int, dimensions: int) -> np.ndarray:
    """Unscrambled Sobol points without the leading zero point (the original's skip=2)."""
    if count < 1 or dimensions < 1:
        raise ValueError("count and dimensions must be positive")
    generator = qmc.Sobol(dimensions, scramble=False)
    with warnings.catch_warnings():
        # scipy warns that balance needs a power of two; the paper's list is a prefix on purpose.
        warnings.simplefilter("ignore", UserWarning)
        generator.fast_forward(1)
        return generator.random(count)


LEARNING_RATE = Dimension("learning_rate", 1e-4, 1.0, Scale.LOG)
MOMENTUM = Dimension("momentum", 0.9, 0.9999, Scale.REVERSE_LOG)
DECAY_STEPS = Dimension("decay_steps", 30_000, 60_000, Scale.LINEAR, integer=True)
END_LEARNING_RATE_FACTOR = Dimension("end_learning_rate_factor", 1e-4, 0.1, Scale.LOG)

# The paper (docs/protocol.md): SGD tunes the learning rate (constant schedule); momentum and Nesterov tune the
# learning rate and the momentum.
PAPER_SPACES: dict[str, SearchSpace] = {
    "sgd": SearchSpace((LEARNING_RATE,)),
    "momentum": SearchSpace((LEARNING_RATE, MOMENTUM)),
    "nesterov": SearchSpace((LEARNING_RATE, MOMENTUM)),
}
