"""Magnitude at initialisation: the global top-k of |theta| over the weights (Synaptic-Flow's ``Mag``, global
scope). Data-free; biases are kept.
"""

from __future__ import annotations

from torch import Tensor

from edps_mlflow.pruning.base import Method, ScoreContext, parameter_shapes


class Magnitude(Method):
    def scores(self, context: ScoreContext) -> dict[str, Tensor]:
        parameters = dict(context.model.named_parameters())
        return {name: parameters[name].detach().abs().cpu() for name in self.prunable(parameter_shapes(context.model))}
