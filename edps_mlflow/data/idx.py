"""MNIST-style IDX files (gzipped or raw), read without any third-party loader: a big-endian magic (two zero
bytes, a type code, the rank), a big-endian uint32 per dimension, then the data."""

from __future__ import annotations

import gzip
import math
import os
import struct
from pathlib import Path
from typing import BinaryIO

import numpy as np

from edps_mlflow.data.bounded import DECODE_ERRORS, describe, read_at_most
from edps_mlflow.data.splits import DataSplits, split_train_validation
from edps_mlflow.errors import EdpsError

MNIST_TRAIN_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte")
DATA_DIR_ENV = "EDPS_DATA_DIR"


def resolve_data_dir(data_dir: str | Path | None) -> Path:
    """--data-dir wins, then EDPS_DATA_DIR, then a per-user cache directory."""
    if data_dir:
        return _directory(Path(data_dir).expanduser(), "--data-dir")
    if os.environ.get(DATA_DIR_ENV):
        return _directory(Path(os.environ[DATA_DIR_ENV]).expanduser(), DATA_DIR_ENV)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "edps-mlflow" / "data"


def _directory(path: Path, source: str) -> Path:
    # A data directory may not exist yet (a download creates it), but a file in its place is a mistake
    # the user should hear about once, not as "dataset missing" from every command.
    if path.exists() and not path.is_dir():
        raise EdpsError(f"{source} {path} is not a directory")
    return path


def find_file(directory: Path, stem: str) -> Path | None:
    return next((path for path in (directory / stem, directory / f"{stem}.gz") if path.is_file()), None)


# The only element type the paper's files use: one unsigned byte per value.
IDX_UNSIGNED_BYTE = 0x08
# Far above any real IDX file (MNIST's images: 47,040,000 bytes): a header claiming more is damaged or hostile.
MAX_IDX_BYTES = 10**9


def read_idx(path: Path, expected_rank: int) -> np.ndarray:
    """The array in an IDX file, refused with a one-line :class:`EdpsError` if anything is off. The data are
    read only up to the size the header implies (and a byte, to notice more): a bomb costs no memory."""
    compressed = path.suffix == ".gz"
    opener = gzip.open if compressed else open
    try:
        with opener(path, "rb") as handle:
            shape = _read_shape(handle, path, expected_rank)
            expected = _data_bytes(shape, path)
            data = read_at_most(handle, expected + 1)
    except DECODE_ERRORS as error:
        raise EdpsError(f"cannot read {path}: {describe(error)}") from None
    if len(data) < expected:
        found = f"it decompresses to {len(data)}" if compressed else f"file has {len(data)}"
        raise EdpsError(f"{path} is truncated or corrupt: header says {expected} bytes of data, {found}")
    if len(data) > expected:
        verb = "decompresses to" if compressed else "holds"
        raise EdpsError(f"{path} is corrupt: it {verb} more than the header's {expected} bytes of data")
    return np.frombuffer(data, dtype=np.uint8).reshape(shape)


def _read_shape(handle: BinaryIO, path: Path, expected_rank: int) -> tuple[int, ...]:
    """Magic (0, 0, type, rank), then one big-endian uint32 size per dimension."""
    magic = read_at_most(handle, 4)
    if len(magic) < 4 or magic[0] != 0 or magic[1] != 0:
        raise EdpsError(f"{path} is not an IDX file (bad magic number)")
    if magic[2] != IDX_UNSIGNED_BYTE:
        raise EdpsError(f"{path}: expected unsigned-byte data (type 0x08), found type 0x{magic[2]:02x}")
    rank = magic[3]
    if rank != expected_rank:
        raise EdpsError(f"{path}: expected an IDX array of rank {expected_rank}, found rank {rank}")
    sizes = read_at_most(handle, 4 * rank)
    if len(sizes) < 4 * rank:
        raise EdpsError(f"{path} is truncated (incomplete header)")
    return struct.unpack(f">{rank}I", sizes)


def _data_bytes(shape: tuple[int, ...], path: Path) -> int:
    """Bytes of data the header implies, checked before anything is allocated (Python ints: no wrap-around).
    Zero items pass here (the split says how many are needed); an item of zero size does not."""
    if 0 in shape[1:]:
        raise EdpsError(f"{path}: header gives items of shape {_spelled(shape[1:])}; no size may be 0")
    total = math.prod(shape)  # one byte per value (type 0x08)
    if total > MAX_IDX_BYTES:
        raise EdpsError(f"{path}: header sizes {_spelled(shape)} come to {total} bytes of data, more than the "
                        f"{MAX_IDX_BYTES} an IDX file may hold here (damaged header?)")
    return total


def _spelled(shape: tuple[int, ...]) -> str:
    return "x".join(str(n) for n in shape)


def load_idx_splits(directory: Path, dataset: str, mean: float, std: float) -> DataSplits:
    """MNIST-format training files (MNIST, Fashion-MNIST): /255, one global mean/std, 10% validation."""
    paths = [find_file(directory, stem) for stem in MNIST_TRAIN_FILES]
    missing = [stem for stem, path in zip(MNIST_TRAIN_FILES, paths) if path is None]
    if missing:
        raise EdpsError(f"{dataset} files missing in {directory}: expected "
                        + " and ".join(f"{stem}[.gz]" for stem in missing))
    images, labels = read_idx(paths[0], 3), read_idx(paths[1], 1)
    if images.shape[0] != labels.shape[0]:
        raise EdpsError(f"{dataset}: {paths[0].name} has {images.shape[0]} images but {paths[1].name} has "
                        f"{labels.shape[0]} labels")
    if labels.size and labels.max() > 9:
        raise EdpsError(f"{dataset}: {paths[1].name} has label {int(labels.max())}, expected 0..9")
    if images.shape[1:] != (28, 28):
        raise EdpsError(f"{dataset} images must be 28x28 for Simple-CNN, found {images.shape[1]}x{images.shape[2]} "
                        f"in {paths[0]}")
    scaled = (images.astype(np.float32) / 255.0)[:, None, :, :]
    return split_train_validation(scaled, labels.astype(np.int64), mean=mean, std=std,
                                  source=f"{dataset} file {paths[0]}")
