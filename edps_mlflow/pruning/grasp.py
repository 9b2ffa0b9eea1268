"""GraSP (Wang, Zhang, Grosse, ICLR 2020) as the authors' ``pruner/GraSP.py`` computes it (T=200, 10 samples per
class): score -theta * Hg on a class-balanced sample drawn from the trial's own stream, the highest pruned.
docs/pruning.md gives the steps and the deliberate differences (the network as initialised, exactly k kept).
Biases are kept.
"""

from __future__ import annotations

import torch
from torch import Tensor

from edps_mlflow.errors import EdpsError
from edps_mlflow.pruning.base import Method, ScoreContext, Shapes, assemble, global_cut, parameter_shapes, stream_seed
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
    """-theta * Hg for the parameters ``names`` on the sample, before the normalisation: g the sum over the
    sample's two halves of the gradient of the loss of logits / ``temperature``, Hg the sum over the halves of
    the gradient of g . dL_half/dw (g held constant)."""
    parameters = dict(model.named_parameters())
    weights = [parameters[name] for name in names]
    count = images.shape[0]
    halves = [(images[:count // 2], labels[:count // 2]), (images[count // 2:], labels[count // 2:])]

    def gradient_of(inputs: Tensor, targets: Tensor, create_graph: bool = False) -> tuple[Tensor, ...]:
        return torch.autograd.grad(loss(model(inputs) / temperature, targets), weights, create_graph=create_graph)

    gradient = [a + b for a, b in zip(*(gradient_of(*half) for half in halves))]

    def hessian_gradient(inputs: Tensor, targets: Tensor) -> tuple[Tensor, ...]:
        z = sum((g.detach() * f).sum() for g, f in zip(gradient, gradient_of(inputs, targets, create_graph=True)))
        return torch.autograd.grad(z, weights)

    product = [a + b for a, b in zip(*(hessian_gradient(*half) for half in halves))]
    return {name: (-w.detach() * hg).cpu() for name, w, hg in zip(names, weights, product)}


class GraSP(Method):
    def scores(self, context: ScoreContext) -> dict[str, Tensor]:
        names = self.prunable(parameter_shapes(context.model))
        data = context.data
        images, labels = class_balanced_sample(data.train_images, data.train_labels, SAMPLES_PER_CLASS,
                                               context.init_seed)
        return grasp_scores(context.model, names, images, labels, context.workload.loss)

    def mask(self, scores: dict[str, Tensor], shapes: Shapes, sparsity: float, init_seed: int) -> Mask:
        """Normalised by |sum| + eps, the k lowest kept (the highest scores are pruned, the authors' sign)."""
        norm = torch.cat([score.flatten() for score in scores.values()]).sum().abs() + EPSILON
        return assemble(shapes, global_cut({name: -(score / norm) for name, score in scores.items()}, sparsity))
