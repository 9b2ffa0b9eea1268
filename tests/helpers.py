"""Small builders shared by the engine and pruning tests (real torch, real digits data)."""

from __future__ import annotations

from dataclasses import replace

import torch

from edps_mlflow.config import StudySpec, TrialSpec
from edps_mlflow.engine import EngineSettings
from edps_mlflow.resources import uses_channels_last
from edps_mlflow.trials import TrialSetup, prepare_trial
from edps_mlflow.workloads import get_workload

DIGITS = get_workload("digits-simple-cnn")
_DATA = None


def digits_data():
    global _DATA
    if _DATA is None:
        _DATA = DIGITS.load_data(None)
    return _DATA


def study_spec(optimizer: str = "sgd", sparsity: float = 0.0, batch_size: int = 64, trials: int = 4,
               goal_error: float = 0.05, max_steps: int = 1000, check_interval: int = 100, seed: int = 0) -> StudySpec:
    return StudySpec("digits-simple-cnn", optimizer, sparsity, batch_size, trials, goal_error,
                     max_steps, check_interval, seed)


class SmoothNet(torch.nn.Module):
    """A digits-sized convnet without max-pool or ReLU: no tie that float rounding could flip, so
    two equivalent computations stay within rounding of each other for many steps."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.avg_pool2d(torch.tanh(self.conv(x)), 2)
        return self.fc(x.reshape(x.shape[0], -1))


SMOOTH = replace(DIGITS, build_model=SmoothNet)


def setups_for(spec: StudySpec, points: list[dict[str, float]], workload=DIGITS, data=None) -> list[TrialSetup]:
    data = data or digits_data()
    return [prepare_trial(workload, data, TrialSpec(spec, index, point)) for index, point in enumerate(points)]


def engine_settings(spec: StudySpec, early_abort: bool = True) -> EngineSettings:
    data = digits_data()
    return EngineSettings(spec.batch_size, spec.max_steps, spec.check_interval,
                          tuple(DIGITS.allowed_errors(goal, data.validation_size) for goal in spec.ladder), spec.seed,
                          early_abort_evaluation=early_abort,
                          channels_last=uses_channels_last(DIGITS.input_layout, spec.batch_size))


def noise_data():
    """Digits-shaped Gaussian images with random labels: no exactly tied pixels, so max-pool and ReLU
    never sit on a tie that float rounding could flip between two equivalent computations."""
    from edps_mlflow.data.splits import DataSplits

    generator = torch.Generator().manual_seed(7)
    images = torch.randn(600, 1, 8, 8, generator=generator)
    labels = torch.randint(0, 10, (600,), generator=generator)
    return DataSplits(images[:500], labels[:500], images[500:], labels[500:])


def reference_torch_run(setup: TrialSetup, batch_size: int, steps: int, seed: int, data=None,
                      workload=DIGITS) -> dict[str, torch.Tensor]:
    """Separate single-trial training of a plain module with the optimizer's torch optimizer: the ground truth for
    packed trials, whose vmapped gradients agree with its backward's within rounding."""
    from torch.nn import functional as F

    from edps_mlflow.engine import BatchStream

    data = data or digits_data()
    model = workload.build_model()
    model.load_state_dict(setup.initial_parameters)
    trial = setup.optimizer
    optimizer = trial.kind.torch_optimizer(list(model.parameters()), trial)
    masks = [setup.mask.tensors[name] for name, _ in model.named_parameters()]
    stream = BatchStream(data.train_size, batch_size, seed, torch.device("cpu"))
    for step in range(steps):
        optimizer.param_groups[0]["lr"] = trial.schedule.learning_rate_at(step)
        batch = stream.next()
        loss = F.cross_entropy(model(data.train_images[batch]), data.train_labels[batch])
        optimizer.zero_grad()
        loss.backward()
        for parameter, mask in zip(model.parameters(), masks):
            parameter.grad.mul_(mask)
        optimizer.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def packed_parameters(trainer, position: int) -> dict[str, torch.Tensor]:
    """One trial's weights out of a PackedTrainer's stacked parameters."""
    return {name: stacked[position].clone() for name, stacked in trainer.params.items()}
