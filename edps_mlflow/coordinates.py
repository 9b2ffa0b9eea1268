"""Batch-invariant optimiser coordinates (a study's ``search_coordinates``, docs/studies.md): a search that tunes
beta2 as the half-life of its average in examples (Marek et al. 2025: beta2 = 0.5^(B / half-life)) and a decoupled
weight decay as its timescale tau in epochs (Wang and Aitchison; Bergsma et al. 2025: weight decay = B / (lr tau D)).
The Sobol points are the raw search's unit cube; only their mapping to the raw values depends on the batch size B
and the training examples D, and each point carries both, so that every trial records both."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from edps_mlflow.errors import EdpsError
from edps_mlflow.search import Dimension, Scale, SearchSpace


class Coordinates(str, Enum):
    RAW = "raw"  # the optimizer's own metaparameters (every study before the choice existed)
    INVARIANT = "invariant"


# Each invariant coordinate and the optimizer setting it gives (a point carries both; the optimizer reads the raw).
RAW_OF = {"beta2_half_life": "beta2", "tau": "weight_decay"}

# tau from one epoch (lr x weight decay = B / D <= 1 at every batch size that fits the training split: no step
# decays more than the whole weight) to 10,000 (no decay to speak of within any workload's step cap); first point 100.
TAU = Dimension("tau", 1.0, 1e4, Scale.LOG)


def parse_coordinates(value: object) -> Coordinates:
    try:
        return Coordinates(value)
    except ValueError:
        raise EdpsError(f"unknown search coordinates {value!r}; choose "
                        f"{' or '.join(c.value for c in Coordinates)}") from None


def half_life(beta2: float, batch_size: int) -> float:
    """The examples over which beta2's average halves at ``batch_size``: B ln(0.5) / ln(beta2)."""
    return batch_size * math.log(0.5) / math.log(beta2)


def beta2_of(half_life_examples: float, batch_size: int) -> float:
    if not half_life_examples > 0:
        raise EdpsError(f"a beta2 half-life must be a positive number of examples, got {half_life_examples}")
    return 0.5 ** (batch_size / half_life_examples)


def weight_decay_of(tau: float, learning_rate: float, batch_size: int, train_size: int) -> float:
    """AdamW's decoupled weight decay whose timescale 1 / (lr x weight decay) steps is ``tau`` epochs."""
    if not tau > 0:
        raise EdpsError(f"tau must be a positive number of epochs, got {tau}")
    return batch_size / (learning_rate * tau * train_size)


def half_life_dimension(train_size: int) -> Dimension:
    """From the half-life of beta2 = 0.9 at batch size 1 to that of 0.9999 at the whole training split: at every
    batch size that fits, the search spans beta2 0.9..0.9999 and more (6.6 .. 11.2M examples on digits)."""
    return Dimension("beta2_half_life", half_life(0.9, 1), half_life(0.9999, train_size), Scale.LOG)


@dataclass(frozen=True)
class InvariantSpace(SearchSpace):
    """A space in batch-invariant coordinates whose points carry, beside them, the raw values they give at
    ``batch_size`` with ``train_size`` training examples."""

    batch_size: int = 1
    train_size: int = 1

    def points(self, count: int) -> list[dict[str, float]]:
        return [{**point, **self.raw_values(point)} for point in super().points(count)]

    def raw_values(self, point: dict[str, float]) -> dict[str, float]:
        raw = {}
        if "beta2_half_life" in point:
            raw["beta2"] = beta2_of(point["beta2_half_life"], self.batch_size)
        if "tau" in point:
            raw["weight_decay"] = weight_decay_of(point["tau"], point["learning_rate"], self.batch_size,
                                                  self.train_size)
        return raw


def invariant_space(space: SearchSpace, optimizer: str, settings: set[str], batch_size: int,
                    train_size: int) -> InvariantSpace:
    """``space`` in batch-invariant coordinates: the half-life in beta2's place (added when beta2 is not tuned) for
    an optimizer with a beta2, tau in the weight decay's (added likewise) for one with a decoupled weight decay;
    a half-life or tau the space tunes or fixes is kept. An optimizer with neither is refused in one line."""
    wanted = {"beta2_half_life": half_life_dimension(train_size), "tau": TAU}
    wanted = {name: d for name, d in wanted.items() if RAW_OF[name] in settings}
    if not wanted:
        raise EdpsError(f"optimizer {optimizer} has no batch-invariant coordinates (no beta2, no decoupled weight "
                        f"decay): use --search-coordinates raw")
    given = {**{d.name: d.low for d in space.dimensions}, **dict(space.fixed)}
    for name in wanted.keys() & given.keys():
        if not given[name] > 0:
            raise EdpsError(f"the search space's {name} must be positive, got {given[name]}")
    # A space that tunes or fixes a coordinate (or fixes its raw value) keeps it as it is.
    by_raw = {RAW_OF[name]: d for name, d in wanted.items() if name not in given and RAW_OF[name] not in space.fixed}
    dimensions = [by_raw.pop(d.name, d) for d in space.dimensions] + list(by_raw.values())
    return InvariantSpace(tuple(dimensions), space.fixed, batch_size, train_size)
