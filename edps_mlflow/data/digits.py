"""scikit-learn's bundled 8x8 digits (1,797 images): the workload that always works offline."""

from __future__ import annotations

import numpy as np
from sklearn.datasets import load_digits

from edps_mlflow.data.splits import DataSplits, split_train_validation


def load_digits_splits() -> DataSplits:
    bunch = load_digits()
    images = (bunch.images / 16.0).astype(np.float32)[:, None, :, :]
    return split_train_validation(images, bunch.target.astype(np.int64))
