"""Random pruning, layer-wise uniform: every prunable tensor keeps the same fraction, round(n (1 - sparsity))
of its n entries, chosen uniformly at random (OpenLTH's ``lottery/branch/randomly_prune.py``, strategy
'even'; Synaptic-Flow's ``Rand`` with ``--mask-scope local``).

The draw is the trial's own: a stream seeded by its initialisation seed (hence by the study seed and the
trial index), apart from the stream that drew its weights. Biases are kept.
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
