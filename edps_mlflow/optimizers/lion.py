"""Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): c = beta1 m + (1 - beta1) g;
w <- w (1 - lr wd) - lr sign(c); m <- beta2 m + (1 - beta2) g. PyTorch has none: a lone trial's is a small
``torch.optim.Optimizer`` of foreach kernels (the interpolations as lerps, in packed_step's order)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edps_mlflow.optimizers.base import Optimizer, PackedState, TrialOptimizer, per_trial
from edps_mlflow.search import Dimension, Scale, SearchSpace

if TYPE_CHECKING:
    import torch
    from torch import Tensor


@dataclass(frozen=True)
class LionSettings:
    beta1: float = 0.9
    beta2: float = 0.99
    weight_decay: float = 0.0  # decoupled, as AdamW's


class Lion(Optimizer):
    settings_type = LionSettings
    # Each weight moves by lr per step, so the paper takes a learning rate 3-10x smaller than AdamW's and a weight
    # decay as much larger (lr wd unchanged): AdamW's ranges (search.py) moved half a decade, first point 3.2e-4, 0.032.
    space = SearchSpace((Dimension("learning_rate", 10 ** -5.5, 10 ** -1.5, Scale.LOG),
                         Dimension("weight_decay", 10 ** -3.5, 10 ** 0.5, Scale.LOG)))
    state_buffers = 1

    def torch_optimizer(self, parameters: list[Tensor], trial: TrialOptimizer) -> torch.optim.Optimizer:
        s = trial.settings
        return _lion_optimizer_class()(parameters, {"lr": trial.schedule.learning_rate, "betas": (s.beta1, s.beta2),
                                                    "weight_decay": s.weight_decay})

    def packed_step(self, packed: PackedState, params: dict[str, Tensor], gradients: dict[str, Tensor]) -> None:
        decay = packed.column("decay", lambda rate, s: 1.0 - rate * s.weight_decay)
        one_minus_beta1 = packed.column("1 - beta1", lambda rate, s: 1.0 - s.beta1)
        one_minus_beta2 = packed.column("1 - beta2", lambda rate, s: 1.0 - s.beta2)
        for name, gradient in gradients.items():
            (moment,) = packed.buffers[name]
            signs = moment.lerp(gradient, per_trial(one_minus_beta1, gradient)).sign_()
            params[name].mul_(per_trial(decay, gradient))
            params[name].addcmul_(per_trial(packed.column("rate"), gradient), signs, value=-1)
            moment.lerp_(gradient, per_trial(one_minus_beta2, gradient))


@functools.cache
def _lion_optimizer_class() -> type:
    """The lone trial's optimizer class, made on first use so that importing this module needs no torch."""
    import torch

    class LionOptimizer(torch.optim.Optimizer):
        @torch.no_grad()
        def step(self, closure: None = None) -> None:
            for group in self.param_groups:
                params = [p for p in group["params"] if p.grad is not None]
                gradients = [p.grad for p in params]
                moments = [self.state[p].setdefault("exp_avg", torch.zeros_like(p)) for p in params]
                lr, (beta1, beta2) = group["lr"], group["betas"]
                signs = torch._foreach_lerp(moments, gradients, 1.0 - beta1)
                torch._foreach_sign_(signs)
                torch._foreach_mul_(params, 1.0 - lr * group["weight_decay"])
                torch._foreach_add_(params, signs, alpha=-lr)
                torch._foreach_lerp_(moments, gradients, 1.0 - beta2)

    return LionOptimizer
