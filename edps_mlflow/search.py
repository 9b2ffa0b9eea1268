"""Metaparameter search spaces as data, and the paper's quasi-random Sobol points: as the original, unscrambled
(Bratley and Fox's direction numbers) without the leading all-zero point, so the first point is 0.5 in every
dimension (a learning rate of 0.01 on the paper's 1e-4..1 log range); every batch size gets the same points."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import numpy as np


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
        """Map a coordinate in [0, 1] onto the range as the original does: linear and log 0 -> low, 1 -> high;
        reverse log 0 -> high (momentum 0.9999), 1 -> low (0.9); integers truncated, as ``int()``."""
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
    """Tuned dimensions in a fixed order (the order decides which Sobol coordinate each gets), and fixed
    metaparameters that every point carries (an Adam warm-up, say): in each trial's key, never tuned."""

    dimensions: tuple[Dimension, ...]
    fixed: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        names = [d.name for d in self.dimensions] + [name for name, _ in self.fixed]
        if not self.dimensions:
            raise ValueError("a search space tunes at least one dimension")
        if len(set(names)) != len(names):
            raise ValueError(f"a search space names each metaparameter once, got {names}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dimensions)

    def points(self, count: int) -> list[dict[str, float]]:
        """The first ``count`` metaparameter points of the paper's Sobol order (with the fixed values)."""
        units = sobol_points(count, len(self.dimensions))
        fixed = {name: float(value) for name, value in self.fixed}
        return [{**{d.name: d.value(float(u)) for d, u in zip(self.dimensions, row)}, **fixed} for row in units]

    def units(self, point: dict[str, float]) -> np.ndarray:
        """The unit-cube coordinates of a point (used to order trials by closeness)."""
        return np.array([d.unit(point[d.name]) for d in self.dimensions])


# Sobol points ported from the original code's sobol_lib (namhoonlee/effect-dps-public, MIT licence), itself John
# Burkardt's i4_sobol (Python by Corrado Chisari, MIT licence) after Bratley and Fox, ACM TOMS Algorithm 659 (1988).
# Not scipy's: its direction numbers (Joe and Kuo's) differ from the third dimension on (CIFAR-10 Nesterov's).

# Bits per coordinate: points are multiples of 2**-30, so float64 holds them exactly.
_SOBOL_BITS = 30

# Per dimension: the primitive polynomial over GF(2) as an integer (bit k is the coefficient of x**k) and the
# initial direction numbers m_1..m_degree, in the original's order; the first is van der Corput's (every one 1).
_SOBOL_TABLE: tuple[tuple[int, tuple[int, ...]], ...] = (
    (1, (1,)),
    (3, (1,)),
    (7, (1, 1)),
    (11, (1, 3, 7)),
    (13, (1, 1, 5)),
    (19, (1, 3, 1, 1)),
    (25, (1, 1, 3, 7)),
    (37, (1, 3, 3, 9, 9)),
    (59, (1, 3, 7, 13, 3)),
    (47, (1, 1, 5, 11, 27)),
    (61, (1, 3, 5, 1, 15)),
    (55, (1, 1, 7, 3, 29)),
    (41, (1, 3, 7, 7, 21)),
    (67, (1, 1, 1, 9, 23, 37)),
    (97, (1, 3, 3, 5, 19, 33)),
    (91, (1, 1, 3, 13, 11, 7)),
    (109, (1, 1, 7, 13, 25, 5)),
    (103, (1, 3, 5, 11, 7, 11)),
    (115, (1, 1, 1, 3, 13, 39)),
    (131, (1, 3, 1, 15, 17, 63, 13)),
    (193, (1, 1, 5, 5, 1, 27, 33)),
    (137, (1, 3, 3, 3, 25, 17, 115)),
    (145, (1, 1, 3, 15, 29, 15, 41)),
    (143, (1, 3, 1, 7, 3, 23, 79)),
    (241, (1, 3, 7, 9, 31, 29, 17)),
    (157, (1, 1, 5, 13, 11, 3, 29)),
    (185, (1, 3, 1, 9, 5, 21, 119)),
    (167, (1, 1, 3, 1, 23, 13, 75)),
    (229, (1, 3, 3, 11, 27, 31, 73)),
    (171, (1, 1, 7, 7, 19, 25, 105)),
    (213, (1, 3, 5, 5, 21, 9, 7)),
    (191, (1, 1, 1, 15, 5, 49, 59)),
    (253, (1, 1, 1, 1, 1, 33, 65)),
    (203, (1, 3, 5, 15, 17, 19, 21)),
    (211, (1, 1, 7, 11, 13, 29, 3)),
    (239, (1, 3, 7, 5, 7, 11, 113)),
    (247, (1, 1, 5, 3, 15, 19, 61)),
    (285, (1, 3, 1, 1, 9, 27, 89, 7)),
    (369, (1, 1, 3, 7, 31, 15, 45, 23)),
    (299, (1, 3, 3, 9, 9, 25, 107, 39)),
)

MAX_SOBOL_DIMENSIONS = len(_SOBOL_TABLE)
# The original refuses the index whose lowest zero bit lies past the last direction number (2**30 - 1).
MAX_SOBOL_POINTS = 2**_SOBOL_BITS - 2


def _direction_numbers(dimension: int) -> list[int]:
    """The ``_SOBOL_BITS`` direction numbers m_j of one dimension (0-based), odd integers < 2**(j+1), by Bratley and
    Fox's recurrence for x**s + a_1 x**(s-1) + ... + 1: m_j = 2 a_1 m_(j-1) ^ ... ^ 2**s m_(j-s) ^ m_(j-s)."""
    polynomial, initial = _SOBOL_TABLE[dimension]
    degree = polynomial.bit_length() - 1
    if degree == 0:
        return [1] * _SOBOL_BITS
    numbers = list(initial)
    for j in range(degree, _SOBOL_BITS):
        value = numbers[j - degree] ^ (numbers[j - degree] << degree)
        for k in range(1, degree):
            if (polynomial >> (degree - k)) & 1:
                value ^= numbers[j - k] << k
        numbers.append(value)
    return numbers


def sobol_points(count: int, dimensions: int) -> np.ndarray:
    """The original's ``i4_sobol_generate(dimensions, count, skip=2)``, transposed to (count, dimensions): a
    d-dimensional list is the first d columns of any longer one."""
    if count < 1 or dimensions < 1:
        raise ValueError("count and dimensions must be positive")
    if dimensions > MAX_SOBOL_DIMENSIONS:
        raise ValueError(f"the original's direction numbers cover {MAX_SOBOL_DIMENSIONS} dimensions, got {dimensions}")
    if count > MAX_SOBOL_POINTS:
        raise ValueError(f"at most {MAX_SOBOL_POINTS} Sobol points, got {count}")
    # Column j of dimension i, scaled so that its leading bit is 2**-(j+1) of the unit interval.
    directions = np.array([[m << (_SOBOL_BITS - 1 - j) for j, m in enumerate(_direction_numbers(i))]
                           for i in range(dimensions)], dtype=np.int64)
    # Antonov and Saleev: point n is the XOR of the direction numbers at the set bits of n's Gray code (the
    # original walks the same sequence one XOR at a time); skip=2 starts it at n = 1.
    index = np.arange(1, count + 1, dtype=np.int64)
    gray = index ^ (index >> 1)
    integers = np.zeros((count, dimensions), dtype=np.int64)
    for bit in range(_SOBOL_BITS):
        chosen = ((gray >> bit) & 1).astype(bool)
        integers[chosen] ^= directions[:, bit]
    return integers / float(2**_SOBOL_BITS)


# The dimensions the optimizers' default spaces (optimizers/) and the workloads' own are made of. The paper's:
LEARNING_RATE = Dimension("learning_rate", 1e-4, 1.0, Scale.LOG)
MOMENTUM = Dimension("momentum", 0.9, 0.9999, Scale.REVERSE_LOG)
DECAY_STEPS = Dimension("decay_steps", 30_000, 60_000, Scale.LINEAR, integer=True)
END_LEARNING_RATE_FACTOR = Dimension("end_learning_rate_factor", 1e-4, 0.1, Scale.LOG)
# Adam's: the learning rate around its customary 1e-3 (the first Sobol point), AdamW's decoupled weight decay, and
# a beta2 a workload may tune.
ADAM_LEARNING_RATE = Dimension("learning_rate", 1e-5, 0.1, Scale.LOG)
WEIGHT_DECAY = Dimension("weight_decay", 1e-4, 1.0, Scale.LOG)
BETA2 = Dimension("beta2", 0.99, 0.9999, Scale.REVERSE_LOG)

# Workloads of one's own written before the optimizer registry name these: the registered optimizers' default
# spaces, made when asked (the registry is imported then, not with this module, which it builds on).
_SPACE_GROUPS = {"PAPER_SPACES": ("sgd", "momentum", "nesterov"), "ADAM_SPACES": ("adam", "adamw"),
                 "DEFAULT_SPACES": None}


def __getattr__(name: str) -> dict[str, SearchSpace]:
    if name not in _SPACE_GROUPS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from edps_mlflow.optimizers import get_optimizer, optimizer_names

    return {optimizer: get_optimizer(optimizer).space for optimizer in _SPACE_GROUPS[name] or optimizer_names()}
