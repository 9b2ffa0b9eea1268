"""The seeded train/validation split shared by every workload."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from edps_mlflow.errors import EdpsError

# The paper's split (docs/protocol.md): 10% of the training set by a fixed seeded shuffle. The seed belongs to the
# workload, not to a study: every study of a workload sees the same split.
VALIDATION_FRACTION = 0.1
SPLIT_SEED = 0
# With fewer examples one split is empty, and its error rate a division by zero in the engine.
MIN_EXAMPLES = math.ceil(1 / VALIDATION_FRACTION)


@dataclass(frozen=True)
class DataSplits:
    """Inputs and targets, on the CPU until the engine moves them: for the image workloads normalised NCHW
    float32 images and int64 labels; other workloads keep their inputs here too, laid out as their
    ``input_layout`` says."""

    train_images: Tensor
    train_labels: Tensor
    validation_images: Tensor
    validation_labels: Tensor

    @property
    def train_size(self) -> int:
        return int(self.train_labels.shape[0])

    @property
    def validation_size(self) -> int:
        return int(self.validation_labels.shape[0])

    def to(self, device: torch.device) -> "DataSplits":
        return DataSplits(*(t.to(device) for t in (self.train_images, self.train_labels,
                                                    self.validation_images, self.validation_labels)))


def split_indices(count: int, source: str = "the dataset") -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) indices: the original's split, numpy RandomState(0) shuffling the
    indices and the first 10% validating. ``source`` names the data in the error for too few."""
    if count < MIN_EXAMPLES:
        raise EdpsError(f"{source} has {count} images; at least {MIN_EXAMPLES} are needed so that the "
                        f"{VALIDATION_FRACTION:.0%} validation split and the training split each hold one")
    order = np.arange(count)
    np.random.RandomState(SPLIT_SEED).shuffle(order)
    validation_count = int(count * VALIDATION_FRACTION)
    return order[validation_count:], order[:validation_count]


def split_train_validation(images: np.ndarray, labels: np.ndarray, mean: float | None = None, std: float | None = None,
                           source: str = "the dataset", per_channel: bool = False) -> DataSplits:
    """Split off the validation 10% by a fixed shuffle, then normalise NCHW floats in [0, 1] by (mean, std):
    given, or the training split's own, global or ``per_channel``."""
    train, validation = split_indices(labels.shape[0], source)
    if per_channel:
        mean = images[train].mean(axis=(0, 2, 3), keepdims=True, dtype=np.float64).astype(np.float32)
        std = images[train].std(axis=(0, 2, 3), keepdims=True, dtype=np.float64).astype(np.float32)
    elif mean is None or std is None:
        mean, std = float(images[train].mean()), float(images[train].std())

    def normalise(x: np.ndarray) -> Tensor:
        return torch.from_numpy(((x - np.float32(mean)) / np.float32(std)).astype(np.float32))
    return DataSplits(normalise(images[train]), torch.from_numpy(labels[train].astype(np.int64)),
                      normalise(images[validation]), torch.from_numpy(labels[validation].astype(np.int64)))
