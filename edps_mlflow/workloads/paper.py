"""The paper's workloads (Lee et al. 2021): MNIST and Fashion-MNIST with Simple-CNN, CIFAR-10 with ResNet-8; their
data come from the data catalog (a data directory)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

from edps_mlflow.search import DECAY_STEPS, END_LEARNING_RATE_FACTOR, LEARNING_RATE, MOMENTUM, SearchSpace
from edps_mlflow.workloads.contract import InputLayout, Workload

if TYPE_CHECKING:
    from torch import nn

    from edps_mlflow.data.splits import DataSplits

PAPER_TRIALS = 100  # the original's `--nruns 100`


def _mnist_model() -> "nn.Module":
    from edps_mlflow.models import SimpleCNN

    return SimpleCNN(in_channels=1, image_size=28, channels=(32, 64), kernel_size=5, padding=0)


def _resnet8() -> "nn.Module":
    from edps_mlflow.models.resnet8 import ResNet8

    return ResNet8()


def catalog_data(dataset: str) -> Callable[[str | Path | None], "DataSplits"]:
    """The loader of a data catalog dataset, from a data directory."""
    def load(data_dir: str | Path | None) -> "DataSplits":
        from edps_mlflow.data.catalog import load_dataset

        return load_dataset(dataset, data_dir)

    return load


def _paper_workload(name: str, dataset: str, description: str, build_model: Callable[[], "nn.Module"],
                    goal_error: float, max_steps: int, train_size: int, validation_size: int,
                    search_spaces: Mapping[str, SearchSpace] | None = None) -> Workload:
    """A workload of the paper, with the original's protocol: 100 trials per study, a check every 100 steps."""
    return Workload(name=name, description=description, load_data=catalog_data(dataset), build_model=build_model,
                    goal_error=goal_error, max_steps=max_steps, search_spaces=search_spaces or {}, needs_data_dir=True,
                    dataset=dataset, train_size=train_size, validation_size=validation_size,
                    input_layout=InputLayout.IMAGES, default_trials=PAPER_TRIALS, check_interval=100)


MNIST = _paper_workload(
    "mnist-simple-cnn", "mnist", "MNIST (54,000 / 6,000), Simple-CNN (62,346 parameters)", _mnist_model,
    goal_error=0.02, max_steps=40_000, train_size=54_000, validation_size=6_000)
# 0.12 is not confirmed from the paper's text (Shallue et al. used 0.10).
FASHION_MNIST = _paper_workload(
    "fashion-mnist-simple-cnn", "fashion-mnist", "Fashion-MNIST (54,000 / 6,000), Simple-CNN (62,346 parameters)",
    _mnist_model, goal_error=0.12, max_steps=40_000, train_size=54_000, validation_size=6_000)
# The paper: the CIFAR-10 Nesterov workload also tunes the linear learning-rate decay.
CIFAR10 = _paper_workload(
    "cifar10-resnet8", "cifar10", "CIFAR-10 (45,000 / 5,000), ResNet-8 without batch norm (75,050 parameters)",
    _resnet8, goal_error=0.40, max_steps=100_000, train_size=45_000, validation_size=5_000,
    search_spaces={"nesterov": SearchSpace((LEARNING_RATE, MOMENTUM, DECAY_STEPS, END_LEARNING_RATE_FACTOR))})
