"""TensorFlow's ``variance_scaling(scale=1, mode="fan_in", distribution="truncated_normal")``."""

from __future__ import annotations

import math

import torch
from torch import nn

# Standard deviation of a unit normal truncated to [-2, 2]; TF divides by it so that the
# truncated distribution keeps the requested variance.
_TRUNCATED_STD = 0.87962566103423978


@torch.no_grad()
def init_fan_in_truncated_normal(module: nn.Module, generator: torch.Generator) -> None:
    """Weights: fan-in truncated normal (scale 1); biases: zero. Deterministic for a generator."""
    for layer in module.modules():
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            weight = layer.weight
            fan_in = weight[0].numel()
            truncated_normal_(weight, math.sqrt(1.0 / fan_in) / _TRUNCATED_STD, generator)
            if layer.bias is not None:
                layer.bias.zero_()


def truncated_normal_(weight: torch.Tensor, std: float, generator: torch.Generator) -> None:
    """``weight`` (on any device) drawn on the CPU from a normal truncated to two ``std`` either side of 0."""
    values = torch.empty(weight.shape, dtype=weight.dtype)
    nn.init.trunc_normal_(values, mean=0.0, std=std, a=-2 * std, b=2 * std, generator=generator)
    weight.copy_(values)
