"""CIFAR-10 in its binary distribution: no pickle needed.

Each record is 1 label byte followed by 3,072 pixel bytes (1,024 red, 1,024 green, 1,024 blue, row
major). The training set is ``data_batch_1.bin`` .. ``data_batch_5.bin``, read from
``cifar-10-binary.tar.gz`` directly or from the extracted files (in ``cifar-10-batches-bin/`` or
loose in the dataset directory).
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np

from edps_mlflow.data.splits import DataSplits, split_train_validation_per_channel
from edps_mlflow.errors import EdpsError

ARCHIVE = "cifar-10-binary.tar.gz"
ARCHIVE_FOLDER = "cifar-10-batches-bin"
TRAIN_BATCHES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
RECORD_BYTES = 1 + 32 * 32 * 3


def parse_batch(raw: bytes, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(images N x 3 x 32 x 32 uint8, labels N uint8) from one binary batch file."""
    if len(raw) == 0 or len(raw) % RECORD_BYTES != 0:
        raise EdpsError(f"CIFAR-10 file {name} is truncated or corrupt: {len(raw)} bytes is not a whole "
                        f"number of {RECORD_BYTES}-byte records")
    records = np.frombuffer(raw, dtype=np.uint8).reshape(-1, RECORD_BYTES)
    labels = records[:, 0]
    if labels.max() > 9:
        raise EdpsError(f"CIFAR-10 file {name} has label {int(labels.max())}, expected 0..9")
    return records[:, 1:].reshape(-1, 3, 32, 32), labels


def _read_batches(directory: Path) -> list[tuple[bytes, str]]:
    for folder in (directory / ARCHIVE_FOLDER, directory):
        paths = [folder / name for name in TRAIN_BATCHES]
        if all(path.is_file() for path in paths):
            return [(path.read_bytes(), str(path)) for path in paths]
    archive = directory / ARCHIVE
    if archive.is_file():
        try:
            with tarfile.open(archive, "r:gz") as bundle:
                batches = []
                for name in TRAIN_BATCHES:
                    member = bundle.extractfile(f"{ARCHIVE_FOLDER}/{name}")
                    if member is None:
                        raise KeyError(name)
                    batches.append((member.read(), f"{archive}:{name}"))
                return batches
        except KeyError as missing:
            raise EdpsError(f"{archive} does not contain {ARCHIVE_FOLDER}/{missing.args[0]}") from None
        except (tarfile.TarError, OSError, EOFError) as error:
            raise EdpsError(f"{archive} is truncated or corrupt: {error}") from None
    raise EdpsError(f"CIFAR-10 files missing in {directory}: expected {ARCHIVE} or "
                    f"{ARCHIVE_FOLDER}/data_batch_1..5.bin (the binary version)")


def load_cifar10_splits(directory: Path) -> DataSplits:
    """45,000 / 5,000 split of the 50,000 training images, per-channel normalised."""
    parts = [parse_batch(raw, name) for raw, name in _read_batches(directory)]
    images = np.concatenate([p[0] for p in parts]).astype(np.float32) / 255.0
    labels = np.concatenate([p[1] for p in parts]).astype(np.int64)
    return split_train_validation_per_channel(images, labels)
