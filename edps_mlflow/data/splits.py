"""The seeded train/validation split shared by every workload."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from edps_mlflow.errors import EdpsError

# The paper (docs/protocol.md): 10% of the training set, chosen by a fixed seeded shuffle. The seed is part of the
# workload definition, not of a study: every study of a workload sees the same split.
VALIDATION_FRACTION = 0.1
SPLIT_SEED = 0


def _validation_count(count: int) -> int:
    return int(count * VALIDATION_FRACTION)


def _fewest_splittable() -> int:
    count = 1
    while _validation_count(count) < 1 or count - _validation_count(count) < 1:
        count += 1
    return count


# With fewer examples one split is empty, and its error rate a division by zero in the engine.
MIN_EXAMPLES = _fewest_splittable()


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
    validation_count = _validation_count(count)
    return order[validation_count:], order[:validation_count]


def split_train_validation(
    images: np.ndarray, labels: np.ndarray, mean: float | None = None, std: float | None = None,
    source: str = "the dataset",
) -> DataSplits:
    """Split off the validation 10% by a fixed shuffle, then normalise by (mean, std).

    ``images`` are NCHW floats in [0, 1]. Without a given mean/std, the training split's own
    global statistics are used.
    """
    train, validation = split_indices(labels.shape[0], source)
    train_images = images[train]
    if mean is None or std is None:
        mean, std = float(train_images.mean()), float(train_images.std())
    return _normalised_splits(images, labels, train, validation, np.float32(mean), np.float32(std))


def split_train_validation_per_channel(images: np.ndarray, labels: np.ndarray,
                                       source: str = "the dataset") -> DataSplits:
    """As :func:`split_train_validation`, normalised by the training split's per-channel mean/std."""
    train, validation = split_indices(labels.shape[0], source)
    train_images = images[train]
    mean = train_images.mean(axis=(0, 2, 3), keepdims=True, dtype=np.float64).astype(np.float32)
    std = train_images.std(axis=(0, 2, 3), keepdims=True, dtype=np.float64).astype(np.float32)
    return _normalised_splits(images, labels, train, validation, mean, std)


def _normalised_splits(images: np.ndarray, labels: np.ndarray, train: np.ndarray, validation: np.ndarray,
                       mean: np.ndarray | np.float32, std: np.ndarray | np.float32) -> DataSplits:
    def normalise(x: np.ndarray) -> Tensor:
        return torch.from_numpy(((x - mean) / std).astype(np.float32))
    return DataSplits(
        train_images=normalise(images[train]),
        train_labels=torch.from_numpy(labels[train].astype(np.int64)),
        validation_images=normalise(images[validation]),
        validation_labels=torch.from_numpy(labels[validation].astype(np.int64)),
    )
