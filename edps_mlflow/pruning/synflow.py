"""SynFlow (Tanaka et al., NeurIPS 2020) as ganguli-lab/Synaptic-Flow computes it: |theta * dR/dtheta|, R the
output sum of the network with |theta| on an all-ones input, pruned over 100 rounds on the exponential schedule,
each round keeping exactly round(N d^(r/100)) (docs/pruning.md). Biases are kept. Its scores depend on the
sparsity (the schedule ends there), so what cache.py keeps is the final mask, per sparsity.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn
from torch.func import functional_call

from edps_mlflow.errors import EdpsError
from edps_mlflow.pruning.base import Method, ScoreContext, global_top_k, kept_count, parameter_shapes

ROUNDS = 100


def synflow_masks(model: nn.Module, names: list[str], input_shape: tuple[int, ...], sparsity: float,
                  rounds: int = ROUNDS) -> dict[str, Tensor]:
    """The {0, 1} masks of the weights ``names`` after ``rounds`` rounds, in float64 on the CPU (100 rounds of
    products of |theta| must neither overflow nor depend on the device); a pruned weight stays pruned."""
    network = copy.deepcopy(model).to(device="cpu", dtype=torch.float64).eval()
    with torch.no_grad():
        magnitudes = {name: p.detach().abs() for name, p in network.named_parameters()}
        buffers = {name: b.abs() if b.is_floating_point() else b for name, b in network.named_buffers()}
    masks = {name: torch.ones_like(magnitudes[name]) for name in names}
    ones = torch.ones((1, *input_shape), dtype=torch.float64)
    total = sum(mask.numel() for mask in masks.values())
    density = 1.0 - sparsity
    for round_index in range(1, rounds + 1):
        parameters = {name: (value * masks[name] if name in masks else value).requires_grad_(name in masks)
                      for name, value in magnitudes.items()}
        flow = functional_call(network, {**parameters, **buffers}, (ones,)).sum()
        gradients = torch.autograd.grad(flow, [parameters[name] for name in names])
        scores = {name: torch.where(masks[name] > 0, (gradient * parameters[name]).detach().abs(),
                                    torch.tensor(-1.0, dtype=torch.float64))
                  for name, gradient in zip(names, gradients)}
        keep = (kept_count(total, sparsity) if round_index == rounds
                else int(round(total * density ** (round_index / rounds))))
        masks = {name: mask.to(torch.float64) for name, mask in global_top_k(scores, keep, stable=True).items()}
    return {name: mask.to(torch.float32) for name, mask in masks.items()}


class SynFlow(Method):
    def scores(self, context: ScoreContext) -> dict[str, Tensor]:
        images = context.data.train_images
        if not images.is_floating_point():
            raise EdpsError(f"synflow feeds the network an all-ones input; workload {context.workload.name}'s inputs "
                            f"are {images.dtype}, not numbers it could take one of")
        names = self.prunable(parameter_shapes(context.model))
        return synflow_masks(context.model, names, tuple(images.shape[1:]), context.sparsity)
