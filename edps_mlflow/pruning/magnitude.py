"""Magnitude at initialisation: keep the global top-k of |theta| over the weights (Synaptic-Flow's ``Mag``
with ``--mask-scope global``). Data-free; it follows the initialiser's per-layer scale (fan-in: the layers
with the fewest inputs per unit keep the most). Biases are kept.
"""

from __future__ import annotations

from torch import Tensor

from edps_mlflow.pruning.base import Method, ScoreContext, Shapes, assemble, global_top_k, kept_count
from edps_mlflow.pruning.mask import Mask


class Magnitude(Method):
    def scores(self, context: ScoreContext) -> dict[str, Tensor]:
        parameters = dict(context.model.named_parameters())
        names = self.prunable({name: p.shape for name, p in parameters.items()})
        return {name: parameters[name].detach().abs().cpu() for name in names}

    def mask(self, scores: dict[str, Tensor], shapes: Shapes, sparsity: float, init_seed: int) -> Mask:
        total = sum(score.numel() for score in scores.values())
        return assemble(shapes, global_top_k(scores, kept_count(total, sparsity), stable=True))
