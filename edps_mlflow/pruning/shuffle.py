"""``shuffle(<method>)``: the method's mask with its kept entries permuted uniformly within each tensor (Frankle
et al., ICLR 2021; OpenLTH's 'layerwise' random pruning): the top-k of uniform draws from the trial's own
shuffle stream, k the method's count in that tensor. It uses the method's (cached) scores, so a trial's
shuffled mask is the same at every batch size and optimizer.
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
