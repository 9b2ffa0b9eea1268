"""Random pruning, layer-wise uniform: every prunable tensor keeps round(n (1 - sparsity)) of its n entries,
uniformly at random from a stream seeded by the trial's initialisation seed (OpenLTH's 'even' random pruning;
Synaptic-Flow's ``Rand``, local scope). Biases are kept.
"""

from __future__ import annotations

from torch import Tensor

from edps_mlflow.pruning.base import Method, ScoreContext, Shapes, assemble, kept_count, layerwise_top_k, uniform_scores
from edps_mlflow.pruning.mask import Mask

RANDOM_STREAM = "edps.pruning.random"


class RandomLayerwise(Method):
    def scores(self, context: ScoreContext) -> dict[str, Tensor]:
        shapes = {name: p.shape for name, p in context.model.named_parameters()}
        return uniform_scores(shapes, self.prunable(shapes), context.init_seed, RANDOM_STREAM)

    def counts(self, shapes: Shapes, sparsity: float) -> dict[str, int]:
        """What each prunable tensor keeps: round(n (1 - sparsity))."""
        return {name: kept_count(shapes[name].numel(), sparsity) for name in self.prunable(shapes)}

    def mask(self, scores: dict[str, Tensor], shapes: Shapes, sparsity: float, init_seed: int) -> Mask:
        return assemble(shapes, layerwise_top_k(scores, self.counts(shapes, sparsity)))
