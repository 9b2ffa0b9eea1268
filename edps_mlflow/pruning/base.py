"""What every pruning method shares: the strategy interface, the prunable tensors, the two cuts (one global
top-k, one top-k per tensor) and the seeded random streams of the methods that draw.

A method's ``scores`` depend on the initialisation, the data and the method only, never on the batch size
or the optimizer, so cache.py keeps them and every study of a grid derives its ``mask`` from them. Counts
are exact: ties at the threshold are settled by position (SNIP's by ``torch.topk``, as they always were).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor, nn

from edps_mlflow.pruning import MethodInfo, Prunes
from edps_mlflow.pruning.mask import Mask

if TYPE_CHECKING:
    from edps_mlflow.data.splits import DataSplits
    from edps_mlflow.workloads import Workload

Shapes = dict[str, torch.Size]


@dataclass(frozen=True)
class ScoreContext:
    """What a method may look at: the network initialised with the trial's seed (on the data's device), the
    data, the workload (its loss), the trial's initialisation seed and the sparsity."""

    model: nn.Module
    data: "DataSplits"
    workload: "Workload"
    init_seed: int
    sparsity: float


class Method:
    """A pruning method: its registry line, its scores, its cut."""

    def __init__(self, info: MethodInfo) -> None:
        self.info = info

    @property
    def scorer(self) -> str:
        """The method whose scores this one uses (a shuffle uses its base's): the name its scores are kept under."""
        return self.info.name

    def prunable(self, shapes: Shapes) -> list[str]:
        """The parameters it may prune, in the network's order: all, or those of two or more dimensions."""
        if self.info.prunes is Prunes.WEIGHTS_AND_BIASES:
            return list(shapes)
        return [name for name, shape in shapes.items() if len(shape) >= 2]

    def scores(self, context: ScoreContext) -> dict[str, Tensor]:
        """One score tensor per prunable parameter, on the CPU."""
        raise NotImplementedError

    def mask(self, scores: dict[str, Tensor], shapes: Shapes, sparsity: float, init_seed: int) -> Mask:
        """The mask at ``sparsity`` (in (0, 1)) from this method's ``scores``: by default their global top-k."""
        return assemble(shapes, global_cut(scores, sparsity))


def parameter_shapes(model: nn.Module) -> Shapes:
    return {name: p.shape for name, p in model.named_parameters()}


def kept_count(total: int, sparsity: float) -> int:
    """round(N (1 - sparsity)): the entries a cut at ``sparsity`` keeps of ``total`` (the paper's k)."""
    return int(round(total * (1.0 - sparsity)))


def global_top_k(scores: dict[str, Tensor], keep: int, normalise: bool = False, stable: bool = False
                 ) -> dict[str, Tensor]:
    """Keep the ``keep`` highest scores over every tensor together: a {0, 1} float tensor per name.

    ``normalise`` divides by the scores' sum first (when positive), as SNIP's original does: it can make two
    scores equal floats, so SNIP's masks stay bit for bit what they were (its ties fall where ``torch.topk``
    puts them). ``stable``: of tied scores the first in parameter order is kept, as every later method cuts.
    """
    names = list(scores)
    flat = torch.cat([scores[name].flatten() for name in names])
    if normalise:
        total = flat.sum()
        if total > 0:
            flat = flat / total
    selected = torch.zeros_like(flat)
    if stable:
        selected[torch.sort(flat, descending=True, stable=True).indices[:keep]] = 1.0
    else:
        selected[torch.topk(flat, keep, sorted=False).indices] = 1.0
    tensors, offset = {}, 0
    for name in names:
        size = scores[name].numel()
        tensors[name] = selected[offset:offset + size].reshape(scores[name].shape).cpu()
        offset += size
    return tensors


def global_cut(scores: dict[str, Tensor], sparsity: float, normalise: bool = False, stable: bool = True
               ) -> dict[str, Tensor]:
    """The global top-k at ``sparsity``: k = round(N (1 - sparsity)) of the N scored entries."""
    total = sum(score.numel() for score in scores.values())
    return global_top_k(scores, kept_count(total, sparsity), normalise=normalise, stable=stable)


def layerwise_top_k(scores: dict[str, Tensor], counts: dict[str, int]) -> dict[str, Tensor]:
    """Keep ``counts[name]`` highest scores within each tensor (of tied ones, the first: a stable sort)."""
    tensors = {}
    for name, score in scores.items():
        flat = score.flatten()
        selected = torch.zeros(flat.numel(), dtype=torch.float32)
        selected[torch.sort(flat, descending=True, stable=True).indices[:counts[name]]] = 1.0
        tensors[name] = selected.reshape(score.shape)
    return tensors


def assemble(shapes: Shapes, kept: dict[str, Tensor]) -> Mask:
    """The mask of every parameter, in the network's order: the cut's tensors, ones where nothing is pruned."""
    return Mask({name: kept[name].to(torch.float32) if name in kept else torch.ones(shape)
                 for name, shape in shapes.items()})


def stream_seed(init_seed: int, stream: str) -> int:
    """A seed for one named random stream of a trial, apart from the one that drew its weights (a mask drawn
    from that one would follow the weights' values)."""
    return int(np.random.SeedSequence([init_seed, zlib.crc32(stream.encode())]).generate_state(1)[0])


def uniform_scores(shapes: Shapes, names: list[str], init_seed: int, stream: str) -> dict[str, Tensor]:
    """Independent uniform [0, 1) values per entry, drawn in ``names`` order from the trial's ``stream``: their
    top-k within a tensor is a uniformly random subset of that size."""
    generator = torch.Generator().manual_seed(stream_seed(init_seed, stream))
    return {name: torch.rand(shapes[name], generator=generator) for name in names}
