"""``shuffle(<method>)``: the method's mask with its kept entries permuted uniformly within each tensor, so
that every tensor keeps the count the method gave it and nothing else of its choice (Frankle, Dziugaite,
Roy, Carbin, ICLR 2021, "Pruning neural networks at initialization: why are we missing the mark?"; OpenLTH's
``lottery/branch/randomly_prune.py``, strategy 'layerwise', which permutes each tensor of a mask).

A uniform permutation of a tensor's mask is a uniformly random subset of its kept count: the top-k of
uniform values drawn from the trial's own shuffle stream. It uses the method's scores (kept once for all
studies, ``cache.py``) and draws nothing else, so the shuffled mask of a trial is the same at every batch
size and optimizer. A tensor the method does not prune (a bias of a weights-only method) stays whole; one
it prunes entirely (SNIP's biases) stays empty.
"""

from __future__ import annotations

from torch import Tensor

from edps_mlflow.pruning import MethodInfo, get_method
from edps_mlflow.pruning.base import Method, ScoreContext, Shapes, assemble, layerwise_top_k, uniform_scores
from edps_mlflow.pruning.mask import Mask

SHUFFLE_STREAM = "edps.pruning.shuffle"


class Shuffle(Method):
    def __init__(self, info: MethodInfo) -> None:
        super().__init__(info)
        assert info.base is not None
        self.base = get_method(info.base)

    @property
    def scorer(self) -> str:
        return self.base.scorer

    def scores(self, context: ScoreContext) -> dict[str, Tensor]:
        return self.base.scores(context)

    def mask(self, scores: dict[str, Tensor], shapes: Shapes, sparsity: float, init_seed: int) -> Mask:
        original = self.base.mask(scores, shapes, sparsity, init_seed)
        names = self.base.prunable(shapes)
        counts = {name: int(original.tensors[name].sum().item()) for name in names}
        draws = uniform_scores(shapes, names, init_seed, SHUFFLE_STREAM)
        return assemble(shapes, layerwise_top_k(draws, counts))
