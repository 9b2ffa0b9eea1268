"""SμPar's rules on a masked network (docs/parameterization.md), at fixed width with the dense network as the
base: each convolution's and linear layer's weight, of density rho in the study's mask, starts at its standard
initialisation times rho^-1/2 (variance sigma^2 / rho) and trains at the learning rate times 1 / rho, whatever the
optimizer. Biases, normalisations' scales and embeddings (a lookup sums no inputs) keep SP's rules."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from torch import Tensor, nn

from edps_mlflow.errors import EdpsError
from edps_mlflow.optimizers.base import PackedState
from edps_mlflow.pruning.mask import Mask

# A weight that sums its fan-in: SμPar's fan-in -> density x fan-in.
_SCALED = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)
_UNSCALED = (nn.Embedding,)  # one row per input: masking removes no term of a sum


def check_network(model: nn.Module) -> None:
    """Refuse, in one line, a network with a weight SμPar defines no rule for: two dimensions or more in a layer
    that is neither a convolution, a linear layer nor an embedding (its fan-in is not known here)."""
    for prefix, layer in model.named_modules():
        for short, parameter in layer.named_parameters(recurse=False):
            if parameter.dim() >= 2 and not isinstance(layer, _SCALED + _UNSCALED):
                raise EdpsError(f"--parameterization supar defines no rule for the {type(layer).__name__} weight "
                                f"{prefix}.{short} of this network: only convolutions, linear layers and embeddings "
                                f"(docs/parameterization.md)")


def weight_densities(model: nn.Module, mask: Mask) -> dict[str, float]:
    """Each convolution's and linear layer's weight's density in ``mask`` (kept / all)."""
    densities: dict[str, float] = {}
    for prefix, layer in model.named_modules():
        if isinstance(layer, _SCALED):
            name = f"{prefix}.weight" if prefix else "weight"
            kept = mask.tensors[name]
            densities[name] = float(kept.sum()) / kept.numel()
    return densities


def learning_rate_scales(densities: dict[str, float]) -> dict[str, float]:
    """1 / density per weight below density 1; a weight pruned whole has nothing to train and keeps 1."""
    return {name: 1.0 / density for name, density in densities.items() if 0.0 < density < 1.0}


def rescale_initial(initial: dict[str, Tensor], scales: dict[str, float]) -> None:
    """The masked initial weights' variance divided by each density (std times sqrt(1 / density)), in place: the
    same draw as SP's, so that sp and supar trials of a seed share their mask and their direction."""
    for name, scale in scales.items():
        initial[name].mul_(math.sqrt(scale))


def parameter_groups(names: list[str], parameters: list[Tensor], scales: dict[str, float],
                     learning_rate: float) -> list[dict[str, Any]]:
    """A lone trial's torch parameter groups: the unscaled parameters, then one group per scaled weight with its
    ``lr_scale`` (the schedule's rate times it is the group's rate)."""
    plain = [p for n, p in zip(names, parameters) if n not in scales]
    scaled = [{"params": [p], "lr": learning_rate * scales[n], "lr_scale": scales[n]}
              for n, p in zip(names, parameters) if n in scales]
    return ([{"params": plain}] if plain else []) + scaled


@dataclass
class PackedGroup:
    """Parameters of packed trials that train at one learning-rate multiplier per trial, with their optimizer's
    packed state: the schedule's rates times the multipliers (under SP one group, every multiplier 1)."""

    names: list[str]
    scales: list[float]
    state: PackedState

    def set_rates(self, rates: Sequence[float]) -> None:
        self.state.set_rates([rate * scale for rate, scale in zip(rates, self.scales)])
