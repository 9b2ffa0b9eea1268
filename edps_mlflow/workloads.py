"""The workload registry: name -> dataset, network, loss, error metric, input layout, goal, step cap,
protocol defaults, search spaces.

The workload owns its objective, as AlgoPerf's workload contract does: the engine, SNIP and the probes
ask it for its ``loss`` and for its ``errors`` (the error metric of the goal test), and lay out its
inputs channels-last only when its ``input_layout`` says they are images. It owns its target too: the
training loop asks ``allowed_errors`` and never hard-codes ``error <= goal``. It also owns its protocol defaults (trials per study, check interval, goal and
cap), which ``edps study``, ``edps sweep`` and the MLproject entries use unless told otherwise, and
it knows the sizes of its splits without loading any data, so that planning never loads a dataset.

Importing this module imports neither torch nor any dataset: networks and loaders are imported when
a workload builds or loads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

from edps_mlflow import goal
from edps_mlflow.errors import EdpsError
from edps_mlflow.search import (
    DECAY_STEPS,
    END_LEARNING_RATE_FACTOR,
    LEARNING_RATE,
    MOMENTUM,
    PAPER_SPACES,
    SearchSpace,
)

if TYPE_CHECKING:
    from torch import Tensor, nn

    from edps_mlflow.data.splits import DataSplits


# Trials per study in the paper (the original's `--nruns 100`).
PAPER_TRIALS = 100
# The paper's grid: its sparsities; batch sizes are the powers of two from 2 up to the split.
PAPER_SPARSITIES = (0.0, 0.5, 0.7, 0.9)


class InputLayout(Enum):
    """What a workload's input tensors are (``DataSplits.train_images`` and ``validation_images``, whatever
    they hold). Only images are laid out channels-last: it is a memory format of 4-D tensors."""

    IMAGES = "images"  # [N, C, H, W] floats
    TOKENS = "tokens"  # [N, T] integer token ids
    FEATURES = "features"  # [N, D] floats


# (network outputs, targets) -> a 0-d tensor. Both run under torch.func.vmap in the packed engine (and the
# loss under grad too), so they use torch operations only: no .item(), no branch on a tensor's value.
Loss = Callable[["Tensor", "Tensor"], "Tensor"]
ErrorCount = Callable[["Tensor", "Tensor"], "Tensor"]


def cross_entropy(logits: "Tensor", labels: "Tensor") -> "Tensor":
    """The mean cross-entropy of a batch: the paper's loss."""
    from torch.nn import functional as F

    return F.cross_entropy(logits, labels)


def argmax_errors(logits: "Tensor", labels: "Tensor") -> "Tensor":
    """How many examples of the batch are misclassified: their highest logit is not their label."""
    return (logits.argmax(-1) != labels).sum()


@dataclass(frozen=True)
class Workload:
    """One workload: what the engine, SNIP and the probes ask about the problem they train
    (docs/architecture.md, "Adding a workload")."""

    name: str
    description: str
    load_data: Callable[[str | Path | None], "DataSplits"]
    build_model: Callable[[], "nn.Module"]
    goal_error: float
    max_steps: int
    search_spaces: Mapping[str, SearchSpace]
    needs_data_dir: bool
    dataset: str
    # Split sizes of the official data (the loaders check the real ones): planning needs no data.
    train_size: int
    validation_size: int
    # What its inputs are: channels-last only for images.
    input_layout: InputLayout
    # The mean training loss of a batch; SNIP's sensitivities and the probes' gradients are of it too.
    loss: Loss = cross_entropy
    # The number of wrong examples in a batch, at most its size: the validation error is their count over
    # the validation split's size, and the goal test (allowed_errors) counts them, stopping early and exactly.
    errors: ErrorCount = argmax_errors
    # Protocol defaults of a study on this workload.
    default_trials: int = 32
    check_interval: int = 100
    # Steps between probe calls (the Lipschitz constant's interval in the paper: 1,000).
    probe_interval: int = 1000

    def allowed_errors(self, goal_error: float, validation_size: int) -> int:
        """Most misclassified validation examples that still meet ``error <= goal_error``.

        As the original computes the error (float32 mean accuracy), not in exact arithmetic: at
        goal 0.12 on 6,000 images that is 719, not 720.
        """
        return goal.allowed_errors(goal_error, validation_size)

    def search_space(self, optimizer: str) -> SearchSpace:
        try:
            return self.search_spaces[optimizer]
        except KeyError:
            known = ", ".join(sorted(self.search_spaces))
            raise EdpsError(f"workload {self.name} does not define optimizer {optimizer!r}; it defines: {known}") from None

    def require_data(self, data_dir: str | Path | None) -> None:
        """Refuse early, without loading anything, when the dataset's files are not there."""
        if self.needs_data_dir:
            from edps_mlflow.data.catalog import require_present

            require_present(self.dataset, data_dir)

    def data_fingerprint(self, data_dir: str | Path | None) -> str:
        """The fingerprint of the data this workload loads (data/fingerprint.py), cached for files."""
        from edps_mlflow.data.fingerprint import cached_fingerprint, splits_fingerprint

        if not self.needs_data_dir:
            return splits_fingerprint(self.load_data(data_dir))
        from edps_mlflow.data.catalog import dataset_files

        return cached_fingerprint(dataset_files(self.dataset, data_dir), lambda: self.load_data(data_dir))

    def largest_batch_size(self) -> int:
        """The largest power of two that fits the training split."""
        return 1 << (self.train_size.bit_length() - 1)

    def paper_grid(self) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """The paper's grid on this workload: (batch sizes, sparsities)."""
        return self.batch_size_range(), PAPER_SPARSITIES

    def batch_size_range(self) -> tuple[int, ...]:
        """The powers of two from 2 to the largest that fits the training split."""
        return tuple(2 ** e for e in range(1, self.largest_batch_size().bit_length()))


def _digits_model() -> "nn.Module":
    from edps_mlflow.models import SimpleCNN

    return SimpleCNN(in_channels=1, image_size=8, channels=(16, 32), kernel_size=3, padding=1)


def _mnist_model() -> "nn.Module":
    from edps_mlflow.models import SimpleCNN

    return SimpleCNN(in_channels=1, image_size=28, channels=(32, 64), kernel_size=5, padding=0)


def _resnet8() -> "nn.Module":
    from edps_mlflow.models.resnet8 import ResNet8

    return ResNet8()


def _digits_data(data_dir: str | Path | None) -> "DataSplits":
    from edps_mlflow.data.digits import load_digits_splits

    return load_digits_splits()


def _catalog_data(dataset: str) -> Callable[[str | Path | None], "DataSplits"]:
    def load(data_dir: str | Path | None) -> "DataSplits":
        from edps_mlflow.data.catalog import load_dataset

        return load_dataset(dataset, data_dir)

    return load


def _paper_workload(name: str, dataset: str, description: str, build_model: Callable[[], "nn.Module"],
                    goal_error: float, max_steps: int, train_size: int, validation_size: int,
                    search_spaces: Mapping[str, SearchSpace] = PAPER_SPACES) -> Workload:
    """A workload of the paper: its dataset comes from the data catalog (a data directory)."""
    # The original's protocol: 100 trials per study (`--nruns 100`), a check every 100 steps.
    return Workload(name=name, description=description, load_data=_catalog_data(dataset), build_model=build_model,
                    goal_error=goal_error, max_steps=max_steps, search_spaces=search_spaces, needs_data_dir=True,
                    dataset=dataset, train_size=train_size, validation_size=validation_size,
                    input_layout=InputLayout.IMAGES, default_trials=PAPER_TRIALS, check_interval=100)


WORKLOADS: dict[str, Workload] = {
    "digits-simple-cnn": Workload(
        name="digits-simple-cnn",
        description="scikit-learn's 8x8 digits (bundled, offline), a 6,090-parameter Simple-CNN variant",
        load_data=_digits_data,
        build_model=_digits_model,
        # 179 validation images: 0.03 allows 5 errors. Checks every 20 steps: dense studies reach the goal
        # in 60-80 steps from batch 64 on, so checks every 100 could not resolve the plateau; 32 trials,
        # because at sparsity 0.9 (609 weights left) only a few learning rates reach the goal at all and
        # 8 trials made the curve follow one noisy trajectory (docs/digits-workload.md).
        goal_error=0.03,
        max_steps=5000,
        search_spaces=PAPER_SPACES,
        needs_data_dir=False,
        dataset="digits",
        train_size=1618,
        validation_size=179,
        input_layout=InputLayout.IMAGES,
        default_trials=32,
        check_interval=20,
        # Best trials reach the goal within 60-300 steps: a probe every 10 steps (about 1 s for the
        # Lipschitz constant here) gives each of them several values along its run.
        probe_interval=10,
    ),
    "mnist-simple-cnn": _paper_workload(
        "mnist-simple-cnn", "mnist", "MNIST (54,000 / 6,000), Simple-CNN (62,346 parameters)", _mnist_model,
        goal_error=0.02, max_steps=40_000, train_size=54_000, validation_size=6_000),
    # 0.12 is not confirmed from the paper's text (Shallue et al. used 0.10).
    "fashion-mnist-simple-cnn": _paper_workload(
        "fashion-mnist-simple-cnn", "fashion-mnist", "Fashion-MNIST (54,000 / 6,000), Simple-CNN (62,346 parameters)",
        _mnist_model, goal_error=0.12, max_steps=40_000, train_size=54_000, validation_size=6_000),
    # The paper: the CIFAR-10 Nesterov workload also tunes the linear learning-rate decay.
    "cifar10-resnet8": _paper_workload(
        "cifar10-resnet8", "cifar10", "CIFAR-10 (45,000 / 5,000), ResNet-8 without batch norm (75,050 parameters)",
        _resnet8, goal_error=0.40, max_steps=100_000, train_size=45_000, validation_size=5_000,
        search_spaces={**PAPER_SPACES, "nesterov": SearchSpace(
            (LEARNING_RATE, MOMENTUM, DECAY_STEPS, END_LEARNING_RATE_FACTOR))}),
}


def get_workload(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        known = ", ".join(sorted(WORKLOADS))
        raise EdpsError(f"unknown workload {name!r}; known workloads: {known}") from None
