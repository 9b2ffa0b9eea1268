"""SNIP at initialisation (Lee et al. 2019) as in the paper: the sensitivity |theta * dL/dtheta| of every weight
*and bias*, dL summed over the training split in batches of 100, normalised to sum 1, cut by one global top-k.
Biases start at zero, so any real sparsity prunes them all, as the original does.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from edps_mlflow.pruning.base import Method, ScoreContext, Shapes, assemble, global_cut
from edps_mlflow.pruning.mask import Mask, dense_mask
from edps_mlflow.workloads import Loss

SNIP_BATCH_SIZE = 100


def snip_scores(model: nn.Module, images: Tensor, labels: Tensor, loss: Loss,
                batch_size: int = SNIP_BATCH_SIZE) -> dict[str, Tensor]:
    """|sum over batches of dL/dc| for every parameter (un-normalised), L the mean ``loss`` of a batch."""
    params = dict(model.named_parameters())
    gradient_sums = {name: torch.zeros_like(p) for name, p in params.items()}
    for start in range(0, labels.shape[0], batch_size):
        model.zero_grad(set_to_none=True)
        loss(model(images[start:start + batch_size]), labels[start:start + batch_size]).backward()
        for name, p in params.items():
            gradient_sums[name] += p.grad
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        return {name: (params[name] * gradient_sums[name]).abs() for name in params}


def snip_cut(scores: dict[str, Tensor], sparsity: float) -> dict[str, Tensor]:
    """The global top-k of the normalised sensitivities, ties where ``torch.topk`` puts them."""
    return global_cut(scores, sparsity, normalise=True, stable=False)


def snip_mask(model: nn.Module, images: Tensor, labels: Tensor, sparsity: float, loss: Loss) -> Mask:
    """Global top-k of the normalised SNIP sensitivities of ``loss``; exactly k = round(N (1 - sparsity)) kept."""
    if sparsity == 0.0:
        return dense_mask(model)
    return Mask(snip_cut(snip_scores(model, images, labels, loss), sparsity))


class Snip(Method):
    def scores(self, context: ScoreContext) -> dict[str, Tensor]:
        data = context.data
        scores = snip_scores(context.model, data.train_images, data.train_labels, context.workload.loss)
        return {name: score.cpu() for name, score in scores.items()}

    def mask(self, scores: dict[str, Tensor], shapes: Shapes, sparsity: float, init_seed: int) -> Mask:
        return assemble(shapes, snip_cut(scores, sparsity))
