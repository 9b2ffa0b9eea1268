"""A workload of one's own for edps-mlflow: steps-to-result of an MLP on scikit-learn's breast-cancer data.

    pip install ./examples/breast-cancer-workload
    edps workloads                                          # lists breast-cancer-mlp
    edps study --workload breast-cancer-mlp --bs 64 --optimizer adam
    edps sweep --workload breast-cancer-mlp --optimizers adam --batch-sizes 8..256

The package declares the workload in the entry-point group ``edps_mlflow.workloads`` (pyproject.toml); without
installing it, ``--workload edps_breast_cancer:WORKLOAD`` finds it on the import path.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from edps_mlflow.workloads import DataSplits, InputLayout, Workload, split_indices


def load_data(data_dir: str | Path | None) -> DataSplits:
    """569 tumours, 30 features each, standardised by the training split's statistics; benign or malignant.
    The validation 10% by the project's seeded split (split_indices)."""
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    features, labels = bunch.data.astype(np.float32), bunch.target.astype(np.int64)
    train, validation = split_indices(len(labels), "the breast-cancer data")
    mean, std = features[train].mean(axis=0), features[train].std(axis=0)
    inputs = torch.from_numpy((features - mean) / std)
    targets = torch.from_numpy(labels)
    return DataSplits(inputs[train], targets[train], inputs[validation], targets[validation])


def build_model() -> nn.Module:
    """30 -> 16 -> 2. The trial's seed initialises it (the default initialisation: fan-in truncated normal
    weights, zero biases)."""
    return nn.Sequential(nn.Linear(30, 16), nn.Tanh(), nn.Linear(16, 2))


WORKLOAD = Workload(
    name="breast-cancer-mlp",
    description="scikit-learn's breast-cancer data (513 / 56), an MLP 30-16-2 (530 parameters)",
    load_data=load_data,
    build_model=build_model,
    goal_error=0.08,  # at most 4 of the 56 validation tumours misclassified
    max_steps=2000,
    needs_data_dir=False,  # the data come with scikit-learn: nothing to download
    dataset="breast-cancer",
    train_size=513,
    validation_size=56,
    input_layout=InputLayout.FEATURES,
    default_trials=8,
    check_interval=10,
)
