"""scikit-learn's bundled 8x8 digits (1,797 images): the workload that always works offline."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from edps_mlflow.data.splits import DataSplits


def digits_table() -> np.ndarray:
    """scikit-learn's ``digits.csv.gz`` (64 pixels, then the label, a row per image) as ``load_digits`` reads
    it, without importing scikit-learn: its import costs a CPU-second in every process that trains."""
    path = digits_file()
    if path is not None:
        with gzip.open(path, "rt") as handle:
            return np.loadtxt(handle, delimiter=",")
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return np.column_stack([bunch.data, bunch.target])


def digits_file() -> Path | None:
    """scikit-learn's ``digits.csv.gz``, found without importing it; None where a release keeps it elsewhere."""
    spec = importlib.util.find_spec("sklearn")
    for location in list(spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(location) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            return path
    return None


def load_digits_splits() -> DataSplits:
    from edps_mlflow.data.splits import split_train_validation

    table = digits_table()
    images = (table[:, :-1].reshape(-1, 8, 8) / 16.0).astype(np.float32)[:, None, :, :]
    return split_train_validation(images, table[:, -1].astype(np.int64))
