"""Adam and AdamW, as ``torch.optim.Adam`` and ``AdamW`` (foreach, no amsgrad): m = lerp(m, g, 1 - beta1); v = beta2 v
+ (1 - beta2) g^2; [AdamW: w *= 1 - lr wd]; w -= lr / (1 - beta1^t) m / (sqrt(v) / sqrt(1 - beta2^t) + eps). Their
default spaces (not the paper's) tune the learning rate, and AdamW's weight decay; the rest keep PyTorch's defaults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from edps_mlflow.errors import EdpsError
from edps_mlflow.optimizers.base import Optimizer, PackedState, TrialOptimizer, per_trial
from edps_mlflow.search import ADAM_LEARNING_RATE, WEIGHT_DECAY, SearchSpace

if TYPE_CHECKING:
    import torch
    from torch import Tensor


@dataclass(frozen=True)
class AdamSettings:
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8

    def __post_init__(self) -> None:
        if not (0.0 <= self.beta1 < 1.0 and 0.0 <= self.beta2 < 1.0 and self.epsilon > 0.0):
            raise EdpsError(f"Adam needs 0 <= beta1, beta2 < 1 and epsilon > 0, got beta1={self.beta1}, "
                            f"beta2={self.beta2}, epsilon={self.epsilon}")


@dataclass(frozen=True)
class AdamWSettings(AdamSettings):
    weight_decay: float = 0.0  # decoupled: each step multiplies the weights by 1 - learning_rate * weight_decay


class Adam(Optimizer):
    settings_type = AdamSettings
    space = SearchSpace((ADAM_LEARNING_RATE,))
    state_buffers = 2
    decoupled = False

    def torch_optimizer(self, parameters: list[Tensor], trial: TrialOptimizer) -> torch.optim.Optimizer:
        import torch

        s = trial.settings
        return torch.optim.Adam(parameters, lr=trial.schedule.learning_rate, betas=(s.beta1, s.beta2), eps=s.epsilon,
                                foreach=True)

    def packed_step(self, packed: PackedState, params: dict[str, Tensor], gradients: dict[str, Tensor]) -> None:
        # This update's bias corrections per trial, in double precision from Python floats as PyTorch's.
        packed.updates += 1
        t = packed.updates
        correction = packed.tensor([(1.0 - s.beta2 ** t) ** 0.5 for s in packed.settings])
        step_size = packed.tensor([-(rate / (1.0 - s.beta1 ** t)) for rate, s in zip(packed.rates, packed.settings)])
        decay = packed.column("decay", lambda rate, s: 1.0 - rate * s.weight_decay) if self.decoupled else None
        one_minus_beta1 = packed.column("1 - beta1", lambda rate, s: 1.0 - s.beta1)
        one_minus_beta2 = packed.column("1 - beta2", lambda rate, s: 1.0 - s.beta2)
        for name, gradient in gradients.items():
            first, second = packed.buffers[name]
            if decay is not None:
                params[name].mul_(per_trial(decay, gradient))
            first.lerp_(gradient, per_trial(one_minus_beta1, gradient))
            second.mul_(per_trial(packed.column("beta2"), gradient))
            second.addcmul_(per_trial(one_minus_beta2, gradient) * gradient, gradient)
            denominator = second.sqrt().div_(per_trial(correction, gradient))
            denominator.add_(per_trial(packed.column("epsilon"), gradient))
            # addcdiv's order: w + (step_size m) / denominator.
            params[name].add_(per_trial(step_size, gradient).mul(first).div_(denominator))


class AdamW(Adam):
    settings_type = AdamWSettings
    space = SearchSpace((ADAM_LEARNING_RATE, WEIGHT_DECAY))
    decoupled = True

    def torch_optimizer(self, parameters: list[Tensor], trial: TrialOptimizer) -> torch.optim.Optimizer:
        import torch

        s = trial.settings
        return torch.optim.AdamW(parameters, lr=trial.schedule.learning_rate, betas=(s.beta1, s.beta2),
                                 eps=s.epsilon, weight_decay=s.weight_decay, foreach=True)
