"""SNIP at initialisation (Lee et al. 2019) as in the paper, unchanged since it was the only method.

1. A multiplicative mask c = 1 on every weight *and bias* tensor.
2. One pass over the training split in batches of 100, summing the signed dL/dc of the batch-mean
   loss (the workload's training loss). Since the loss sees w * c, dL/dc at c = 1 is w * dL/dw, so
   the sum is w * (sum of grads).
3. Sensitivity |sum|, normalised to sum 1 (which does not change the ranking).
4. Keep the global top-k, k = round(N (1 - sparsity)).

Biases start at zero, so their sensitivity is zero and any real sparsity prunes every bias, as the
original does; the mask summary shows it. Steps 1-3 are the scores (``cache.py`` keeps them: they do not
depend on the sparsity), step 4 the cut.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from edps_mlflow.pruning.base import Method, ScoreContext, Shapes, assemble, global_top_k, kept_count
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
    """Step 4: the global top-k of the normalised sensitivities."""
    total = sum(score.numel() for score in scores.values())
    return global_top_k(scores, kept_count(total, sparsity), normalise=True)


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
