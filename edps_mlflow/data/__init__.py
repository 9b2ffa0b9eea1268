"""Datasets as tensors: loaders, the seeded validation split and normalisation."""

from edps_mlflow.data.splits import DataSplits, split_train_validation

__all__ = ["DataSplits", "split_train_validation"]
