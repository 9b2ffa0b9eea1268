"""The paper's optimizers, as ``torch.optim.SGD``: plain SGD (w -= lr g), heavy-ball momentum as in TensorFlow and
PyTorch (buf = m buf + g; w -= lr buf) and Nesterov's (w -= lr (g + m buf)). Their default spaces are the paper's
(docs/protocol.md): the learning rate (a constant schedule), and for momentum and Nesterov the momentum."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from edps_mlflow.optimizers.base import Optimizer, PackedState, TrialOptimizer, per_trial
from edps_mlflow.search import LEARNING_RATE, MOMENTUM, SearchSpace

if TYPE_CHECKING:
    import torch
    from torch import Tensor


@dataclass(frozen=True)
class SgdSettings:
    """Plain SGD has no metaparameter but the schedule's."""


@dataclass(frozen=True)
class MomentumSettings:
    momentum: float = 0.0


class Sgd(Optimizer):
    settings_type = SgdSettings
    space = SearchSpace((LEARNING_RATE,))

    def torch_optimizer(self, parameters: list[Tensor], trial: TrialOptimizer) -> torch.optim.Optimizer:
        import torch

        return torch.optim.SGD(parameters, lr=trial.schedule.learning_rate, foreach=True)

    def packed_step(self, packed: PackedState, params: dict[str, Tensor], gradients: dict[str, Tensor]) -> None:
        for name, gradient in gradients.items():
            # SGD's w += (-lr) g is one fused multiply-add on CPU, as addcmul's is.
            params[name].addcmul_(per_trial(packed.column("rate"), gradient), gradient, value=-1)


class Momentum(Sgd):
    settings_type = MomentumSettings
    space = SearchSpace((LEARNING_RATE, MOMENTUM))
    state_buffers = 1
    nesterov = False

    def torch_optimizer(self, parameters: list[Tensor], trial: TrialOptimizer) -> torch.optim.Optimizer:
        import torch

        return torch.optim.SGD(parameters, lr=trial.schedule.learning_rate, momentum=trial.settings.momentum,
                               nesterov=self.nesterov, foreach=True)

    def packed_step(self, packed: PackedState, params: dict[str, Tensor], gradients: dict[str, Tensor]) -> None:
        for name, gradient in gradients.items():
            momentum, (buffer,) = per_trial(packed.column("momentum"), gradient), packed.buffers[name]
            buffer.mul_(momentum).add_(gradient)
            step = gradient.addcmul(momentum, buffer) if self.nesterov else buffer
            params[name].addcmul_(per_trial(packed.column("rate"), gradient), step, value=-1)


class Nesterov(Momentum):
    nesterov = True
