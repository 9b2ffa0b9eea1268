"""CIFAR-10 in its binary distribution (no pickle): ``data_batch_1..5.bin``, each record a label byte and
3,072 pixel bytes (red, green, blue planes, row major), read from the ``.tar.gz`` or the extracted files."""

from __future__ import annotations

import gzip
import tarfile
from pathlib import Path

import numpy as np

from edps_mlflow.data.bounded import DECODE_ERRORS, BoundedReader, LimitExceeded, describe, read_at_most, read_file
from edps_mlflow.data.splits import DataSplits, split_train_validation
from edps_mlflow.errors import EdpsError

ARCHIVE = "cifar-10-binary.tar.gz"
ARCHIVE_FOLDER = "cifar-10-batches-bin"
TRAIN_BATCHES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
RECORD_BYTES = 1 + 32 * 32 * 3
# Each published batch holds exactly 10,000 records; smaller whole batches are accepted (test data).
BATCH_RECORDS = 10_000
BATCH_MAX_BYTES = BATCH_RECORDS * RECORD_BYTES
# The published archive decompresses to about 184 MB: walking it may read that and a margin, never more.
ARCHIVE_MAX_BYTES = 8 * BATCH_MAX_BYTES
# The published archive has nine entries; a stream of millions of tiny ones is not CIFAR-10.
ARCHIVE_MAX_MEMBERS = 1000


def parse_batch(raw: bytes, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(images N x 3 x 32 x 32 uint8, labels N uint8) from one binary batch file."""
    if len(raw) > BATCH_MAX_BYTES:
        raise EdpsError(_oversize(name))
    if len(raw) == 0 or len(raw) % RECORD_BYTES != 0:
        raise EdpsError(f"CIFAR-10 file {name} is truncated or corrupt: {len(raw)} bytes is not a whole "
                        f"number of {RECORD_BYTES}-byte records")
    records = np.frombuffer(raw, dtype=np.uint8).reshape(-1, RECORD_BYTES)
    labels = records[:, 0]
    if labels.max() > 9:
        raise EdpsError(f"CIFAR-10 file {name} has label {int(labels.max())}, expected 0..9")
    return records[:, 1:].reshape(-1, 3, 32, 32), labels


def _oversize(name: str) -> str:
    return (f"CIFAR-10 file {name} is corrupt: it holds more than a batch's {BATCH_RECORDS} records "
            f"({BATCH_MAX_BYTES} bytes)")


def _read_batches(directory: Path) -> tuple[list[tuple[bytes, str]], Path]:
    """The five training batches with the names to report them by, and where they were found."""
    for folder in (directory / ARCHIVE_FOLDER, directory):
        paths = [folder / name for name in TRAIN_BATCHES]
        if all(path.is_file() for path in paths):
            return [(read_file(path, BATCH_MAX_BYTES), str(path)) for path in paths], folder
    archive = directory / ARCHIVE
    if archive.is_file():
        return _read_archive(archive), archive
    raise EdpsError(f"CIFAR-10 files missing in {directory}: expected {ARCHIVE} or "
                    f"{ARCHIVE_FOLDER}/data_batch_1..5.bin (the binary version)")


def _read_archive(archive: Path) -> list[tuple[bytes, str]]:
    """The batches from the tar.gz, walked once as a stream (counting members and bytes as they come) with
    every read bounded. Later copies of a member win, as they would on extraction."""
    found: dict[str, bytes] = {}
    try:
        with gzip.open(archive, "rb") as unzipped:
            stream = BoundedReader(unzipped, ARCHIVE_MAX_BYTES)
            with tarfile.open(fileobj=stream, mode="r|") as bundle:
                for count, member in enumerate(bundle, start=1):
                    if count > ARCHIVE_MAX_MEMBERS:
                        raise EdpsError(f"{archive} is not the CIFAR-10 archive: more than "
                                        f"{ARCHIVE_MAX_MEMBERS} entries")
                    folder, _, name = member.name.partition("/")
                    if folder == ARCHIVE_FOLDER and name in TRAIN_BATCHES:
                        found[name] = _read_member(bundle, member, f"{archive}:{name}")
            # To the end of the gzip stream, so that its checksum refuses damage after the batches too.
            read_at_most(stream, ARCHIVE_MAX_BYTES)
    except LimitExceeded:
        raise EdpsError(f"{archive} is corrupt: it decompresses to more than {ARCHIVE_MAX_BYTES} bytes, "
                        f"far more than CIFAR-10 holds") from None
    except DECODE_ERRORS as error:
        raise EdpsError(f"{archive} is truncated or corrupt: {describe(error)}") from None
    missing = [name for name in TRAIN_BATCHES if name not in found]
    if missing:
        raise EdpsError(f"{archive} does not contain " + ", ".join(f"{ARCHIVE_FOLDER}/{name}" for name in missing))
    return [(found[name], f"{archive}:{name}") for name in TRAIN_BATCHES]


def _read_member(bundle: tarfile.TarFile, member: tarfile.TarInfo, label: str) -> bytes:
    # The declared size first, so that an oversized member is refused before any of it is read.
    if member.size > BATCH_MAX_BYTES:
        raise EdpsError(_oversize(label))
    handle = bundle.extractfile(member) if member.isreg() else None
    if handle is None:
        raise EdpsError(f"{label} is not a regular file in the archive")
    return bytes(read_at_most(handle, BATCH_MAX_BYTES + 1))


def load_cifar10_splits(directory: Path) -> DataSplits:
    """45,000 / 5,000 split of the 50,000 training images, per-channel normalised."""
    batches, where = _read_batches(directory)
    parts = [parse_batch(raw, name) for raw, name in batches]
    images = np.concatenate([p[0] for p in parts]).astype(np.float32) / 255.0
    labels = np.concatenate([p[1] for p in parts]).astype(np.int64)
    return split_train_validation(images, labels, source=f"CIFAR-10 training data in {where}", per_channel=True)
