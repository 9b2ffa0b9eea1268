"""SynFlow (Tanaka, Kunin, Yamins, Ganguli, NeurIPS 2020, "Pruning neural networks without any data by
iteratively conserving synaptic flow"), as ganguli-lab/Synaptic-Flow computes it (``Pruners/pruners.py``,
class ``SynFlow``; ``prune.py``, ``prune_loop`` with the exponential schedule; ``--prune-epochs 100``, the
paper's setting):

1. Every parameter replaced by its absolute value (``linearize``); the network in eval mode.
2. R = the sum of the network's output on one all-ones input of the data's shape.
3. Score = |theta * dR/dtheta| of the weights, with the current mask applied (pruned weights score 0).
4. Prune to the density d^(r/100) at round r = 1 .. 100 (d = 1 - sparsity: the exponential schedule), by a
   global top-k of the scores recomputed each round; the last round keeps exactly k = round(N d).

Differences from the reference, all deliberate: a round keeps exactly round(N d^(r/100)) (the reference
prunes every weight tied with its threshold, e.g. every zero score at once, and counts int(N (1 - d^(r/100)))
pruned), and a weight once pruned stays pruned (its score sits below every kept one, where the reference's
zero could tie); the arithmetic is in float64 on the CPU (the reference's commented-out ``model.double()``),
so that 100 rounds of products of |theta| neither overflow nor depend on the device. Biases are kept (the
reference's ``--prune-bias`` is off by default). The scores depend on the sparsity (the schedule ends
there), so what ``cache.py`` keeps is the final mask, per sparsity.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn
from torch.func import functional_call

from edps_mlflow.errors import EdpsError
from edps_mlflow.pruning.base import Method, ScoreContext, Shapes, assemble, global_top_k, kept_count
from edps_mlflow.pruning.mask import Mask

ROUNDS = 100


def synflow_masks(model: nn.Module, names: list[str], input_shape: tuple[int, ...], sparsity: float,
                  rounds: int = ROUNDS) -> dict[str, Tensor]:
    """The {0, 1} masks of the weights ``names`` after ``rounds`` rounds of steps 1-4."""
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
        names = self.prunable({name: p.shape for name, p in context.model.named_parameters()})
        return synflow_masks(context.model, names, tuple(images.shape[1:]), context.sparsity)

    def mask(self, scores: dict[str, Tensor], shapes: Shapes, sparsity: float, init_seed: int) -> Mask:
        total = sum(score.numel() for score in scores.values())
        kept = global_top_k(scores, kept_count(total, sparsity), stable=True)
        return assemble(shapes, kept)
