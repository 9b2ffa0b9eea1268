"""GraSP (Wang, Zhang, Grosse, ICLR 2020, "Picking winning tickets before training by preserving gradient
flow"), as the authors' code computes it: alecwangcq/GraSP, ``pruner/GraSP.py`` (function ``GraSP`` with its
defaults T=200, num_iters=1, and samples_per_class=10 from the CIFAR-10 configs).

1. A class-balanced sample of the training split: the first 10 examples of each class in an order drawn
   from the trial's own random stream (``GraSP_fetch_data`` takes them from a shuffled loader), concatenated
   class by class, and split into two halves (``[:N//2]``, ``[N//2:]``) as the authors do.
2. g = the sum over the two halves of the gradient of the batch-mean loss (the workload's) of the logits
   divided by the temperature T = 200, with respect to the weights.
3. Hg = the sum over the halves of the gradient of z = sum(g . dL_half/dw) (g held constant): the
   Hessian-vector product of each half's loss with g.
4. Score = -theta * Hg (the authors' "-theta_q Hg"), normalised by |sum| + 1e-10; the highest scores are
   pruned, i.e. the k = round(N (1 - sparsity)) lowest are kept. Pruning the highest -theta Hg keeps the
   weights whose removal would reduce the gradient flow most (the authors' sign; Synaptic-Flow's port keeps
   the highest theta Hg, the same mask). Frankle et al. (ICLR 2021) found pruning by |score| works better;
   that variant is not this method.

Differences from the authors' code, all deliberate: scores are of the weights only (conv and linear, as
theirs), but of the network as initialised: their ``reinit=True`` re-draws the linear layers with Xavier
normal from torch's global random state before scoring (and then masks the original weights), which would
make a mask depend on that state; the kept count is exactly k (theirs keeps every score tied with the
threshold, and removes int(N sparsity)). Biases are kept.
"""

from __future__ import annotations

import torch
from torch import Tensor

from edps_mlflow.errors import EdpsError
from edps_mlflow.pruning.base import Method, ScoreContext, Shapes, assemble, global_top_k, kept_count, stream_seed
from edps_mlflow.pruning.mask import Mask
from edps_mlflow.workloads import Loss

SAMPLES_PER_CLASS = 10
TEMPERATURE = 200.0
EPSILON = 1e-10
SAMPLE_STREAM = "edps.pruning.grasp.sample"


def class_balanced_sample(images: Tensor, labels: Tensor, per_class: int, init_seed: int) -> tuple[Tensor, Tensor]:
    """``per_class`` examples of every class of ``labels``, class by class (each class's in the order of a
    permutation drawn from the trial's own stream)."""
    if labels.dim() != 1 or labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise EdpsError("grasp needs a class label per example (a 1-D integer tensor of targets); this workload's "
                        f"targets are {labels.dtype} of shape {tuple(labels.shape)}")
    generator = torch.Generator().manual_seed(stream_seed(init_seed, SAMPLE_STREAM))
    order = torch.randperm(labels.shape[0], generator=generator)
    shuffled = labels.cpu()[order]
    picks = []
    for label in torch.unique(shuffled).tolist():
        chosen = order[shuffled == label][:per_class]
        if chosen.numel() < per_class:
            raise EdpsError(f"grasp samples {per_class} examples of each class; class {label} has only "
                            f"{chosen.numel()} in the training split")
        picks.append(chosen)
    index = torch.cat(picks).to(labels.device)
    return images[index], labels[index]


def grasp_scores(model: torch.nn.Module, names: list[str], images: Tensor, labels: Tensor, loss: Loss,
                 temperature: float = TEMPERATURE) -> dict[str, Tensor]:
    """-theta * Hg for the parameters ``names`` on the sample (``images``, ``labels``), steps 2-4 above (before
    the normalisation)."""
    parameters = dict(model.named_parameters())
    weights = [parameters[name] for name in names]
    count = images.shape[0]
    halves = [(images[:count // 2], labels[:count // 2]), (images[count // 2:], labels[count // 2:])]
    gradient: list[Tensor] | None = None
    for inputs, targets in halves:
        grads = torch.autograd.grad(loss(model(inputs) / temperature, targets), weights)
        gradient = list(grads) if gradient is None else [a + b for a, b in zip(gradient, grads)]
    assert gradient is not None
    product: list[Tensor] | None = None
    for inputs, targets in halves:
        grads = torch.autograd.grad(loss(model(inputs) / temperature, targets), weights, create_graph=True)
        z = sum((g.detach() * f).sum() for g, f in zip(gradient, grads))
        hessian_gradient = torch.autograd.grad(z, weights)
        product = list(hessian_gradient) if product is None else [a + b for a, b in zip(product, hessian_gradient)]
    assert product is not None
    return {name: (-w.detach() * hg).cpu() for name, w, hg in zip(names, weights, product)}


def grasp_cut(scores: dict[str, Tensor], sparsity: float) -> dict[str, Tensor]:
    """Step 4's cut: normalise by |sum| + eps, keep the k lowest."""
    norm = torch.cat([score.flatten() for score in scores.values()]).sum().abs() + EPSILON
    total = sum(score.numel() for score in scores.values())
    return global_top_k({name: -(score / norm) for name, score in scores.items()}, kept_count(total, sparsity),
                        stable=True)


class GraSP(Method):
    def scores(self, context: ScoreContext) -> dict[str, Tensor]:
        names = self.prunable({name: p.shape for name, p in context.model.named_parameters()})
        data = context.data
        images, labels = class_balanced_sample(data.train_images, data.train_labels, SAMPLES_PER_CLASS,
                                               context.init_seed)
        return grasp_scores(context.model, names, images, labels, context.workload.loss)

    def mask(self, scores: dict[str, Tensor], shapes: Shapes, sparsity: float, init_seed: int) -> Mask:
        return assemble(shapes, grasp_cut(scores, sparsity))
