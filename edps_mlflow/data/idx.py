"""MNIST-style IDX files (gzipped or raw), read without any third-party loader.

Format: big-endian magic (two zero bytes, a type code, the number of dimensions), then one
big-endian uint32 per dimension, then the data. Images are 0x08 (unsigned byte) of rank 3,
labels 0x08 of rank 1.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from edps_mlflow.data.splits import DataSplits, split_train_validation
from edps_mlflow.errors import EdpsError

MNIST_TRAIN_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte")
DATA_DIR_ENV = "EDPS_DATA_DIR"


def resolve_data_dir(data_dir: str | Path | None) -> Path:
    """--data-dir wins, then EDPS_DATA_DIR, then a per-user cache directory."""
    if data_dir:
        return Path(data_dir).expanduser()
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "edps-mlflow" / "data"


def find_file(directory: Path, stem: str) -> Path | None:
    for candidate in (directory / stem, directory / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    return None


def read_idx(path: Path, expected_rank: int) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            raw = handle.read()
    except (OSError, EOFError) as error:
        raise EdpsError(f"cannot read {path}: {error}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise EdpsError(f"{path} is not an IDX file (bad magic number)")
    if raw[2] != 0x08:
        raise EdpsError(f"{path}: expected unsigned-byte data (type 0x08), found type 0x{raw[2]:02x}")
    rank = raw[3]
    if rank != expected_rank:
        raise EdpsError(f"{path}: expected an IDX array of rank {expected_rank}, found rank {rank}")
    header = 4 + 4 * rank
    if len(raw) < header:
        raise EdpsError(f"{path} is truncated (incomplete header)")
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(rank))
    expected = int(np.prod(shape))
    if len(raw) - header != expected:
        raise EdpsError(
            f"{path} is truncated or corrupt: header says {expected} bytes of data, file has {len(raw) - header}"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def load_idx_pair(directory: Path, files: tuple[str, str], dataset: str) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, H, W) uint8 and labels (N,) uint8, checked against each other."""
    if not directory.is_dir():
        raise EdpsError(
            f"{dataset} data directory {directory} does not exist; put {files[0]}[.gz] and {files[1]}[.gz] "
            f"there, or pass --data-dir / set {DATA_DIR_ENV}"
        )
    paths = [find_file(directory, stem) for stem in files]
    missing = [stem for stem, path in zip(files, paths) if path is None]
    if missing:
        raise EdpsError(
            f"{dataset} files missing in {directory}: expected " + " and ".join(f"{stem}[.gz]" for stem in missing)
        )
    images = read_idx(paths[0], 3)
    labels = read_idx(paths[1], 1)
    if images.shape[0] != labels.shape[0]:
        raise EdpsError(
            f"{dataset}: {paths[0].name} has {images.shape[0]} images but {paths[1].name} has {labels.shape[0]} labels"
        )
    if labels.size and labels.max() > 9:
        raise EdpsError(f"{dataset}: {paths[1].name} has label {int(labels.max())}, expected 0..9")
    return images, labels


def load_idx_splits(directory: Path, dataset: str, mean: float, std: float) -> DataSplits:
    """MNIST-format training files (MNIST, Fashion-MNIST): /255, one global mean/std, 10% validation."""
    images, labels = load_idx_pair(directory, MNIST_TRAIN_FILES, dataset)
    if images.shape[1:] != (28, 28):
        raise EdpsError(f"{dataset} images must be 28x28 for Simple-CNN, found {images.shape[1]}x{images.shape[2]}")
    scaled = (images.astype(np.float32) / 255.0)[:, None, :, :]
    return split_train_validation(scaled, labels.astype(np.int64), mean=mean, std=std)


def load_mnist_splits(data_dir: str | Path | None, mean: float, std: float) -> DataSplits:
    """MNIST from ``data_dir`` itself (kept for callers that point straight at the files)."""
    return load_idx_splits(resolve_data_dir(data_dir), "MNIST", mean, std)
