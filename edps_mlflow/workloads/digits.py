"""scikit-learn's 8x8 digits with a small Simple-CNN: the workload that runs anywhere, offline."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from edps_mlflow.workloads.contract import InputLayout, Workload

if TYPE_CHECKING:
    from torch import nn

    from edps_mlflow.data.splits import DataSplits


def _digits_model() -> "nn.Module":
    from edps_mlflow.models import SimpleCNN

    return SimpleCNN(in_channels=1, image_size=8, channels=(16, 32), kernel_size=3, padding=1)


def _digits_data(data_dir: str | Path | None) -> "DataSplits":
    from edps_mlflow.data.digits import load_digits_splits

    return load_digits_splits()


DIGITS = Workload(
    name="digits-simple-cnn",
    description="scikit-learn's 8x8 digits (bundled, offline), a 6,090-parameter Simple-CNN variant",
    load_data=_digits_data,
    build_model=_digits_model,
    # 0.03 allows 5 of 179 errors; checks every 20 steps resolve dense studies that reach in 60-80 steps, and
    # 32 trials find the few learning rates that reach at sparsity 0.9 (docs/digits-workload.md).
    goal_error=0.03,
    max_steps=5000,
    needs_data_dir=False,
    dataset="digits",
    train_size=1618,
    validation_size=179,
    input_layout=InputLayout.IMAGES,
    default_trials=32,
    check_interval=20,
    # Best trials reach within 60-300 steps: several probe values along each run.
    probe_interval=10,
)
