"""The data loaders are total and bounded: every damaged file is one clear line, never a traceback.

Generated files in the real formats (IDX raw and gzipped, CIFAR-10 binary loose and in tar.gz),
damaged in one known way per category. The property for a damaged file: loading raises EdpsError
whose message is one line naming the file, and nothing else escapes. Where a kind of damage can
happen to leave the file valid (a flipped bit in gzip padding, a tar cut inside its end padding),
the alternative is loading exactly what the undamaged file holds. Valid files load the same in
every spelling. Then decompression bombs under a memory limit, downloads from misbehaving
servers, and one run of the real command line.
"""

from __future__ import annotations

import gzip
import hashlib
import http.server
import math
import os
import resource
import socket
import struct
import subprocess
import sys
import tarfile
import threading
import time
import zlib
from dataclasses import replace
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Callable, Iterator

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from edps_mlflow.data import catalog
from edps_mlflow.data.cifar import ARCHIVE, ARCHIVE_FOLDER, BATCH_MAX_BYTES, RECORD_BYTES, TRAIN_BATCHES, \
    load_cifar10_splits
from edps_mlflow.data.idx import MAX_IDX_BYTES, load_idx_splits, read_idx
from edps_mlflow.data.splits import DataSplits
from edps_mlflow.errors import EdpsError

from conftest import REPO, run_edps

# Per property; every example is a few small files, so each property runs in about a second.
FUZZ = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Loading whole datasets builds tensors: fewer examples.
FUZZ_DATASETS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])

MEAN, STD = 0.1307, 0.3081


# ---- checks ---------------------------------------------------------------------------------------
def refusal(load: Callable[[], object], named: Path) -> str:
    """Loading raises EdpsError, one line, naming ``named``; any other exception fails the test."""
    with pytest.raises(EdpsError) as caught:
        load()
    message = str(caught.value)
    assert "\n" not in message and "\r" not in message, message
    assert named.name in message, message
    return message


def refused_or_loaded(load: Callable[[], object], named: Path) -> object | None:
    """For damage that may leave a file valid: a one-line refusal (None), or what it loaded."""
    try:
        loaded = load()
    except EdpsError as error:
        message = str(error)
        assert "\n" not in message and "\r" not in message, message
        assert named.name in message, message
        event("refused")
        return None
    event("loaded (damage left the file valid)")
    return loaded


def same_splits(a: DataSplits, b: DataSplits) -> bool:
    return all(torch.equal(x, y) for x, y in zip(
        (a.train_images, a.train_labels, a.validation_images, a.validation_labels),
        (b.train_images, b.train_labels, b.validation_images, b.validation_labels)))


# ---- IDX builders ---------------------------------------------------------------------------------
def idx_bytes(array: np.ndarray) -> bytes:
    """The real IDX layout: 0, 0, type 0x08, rank, big-endian sizes, then the bytes."""
    return bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


def random_array(seed: int, shape: tuple[int, ...], high: int = 256) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, high, size=shape, dtype=np.uint8)


def gzipped(payload: bytes, level: int = 6, split: int | None = None) -> bytes:
    """One gzip member, or two (cut at ``split``): gzip readers must join members."""
    if split is None:
        return gzip.compress(payload, compresslevel=level, mtime=0)
    return gzip.compress(payload[:split], compresslevel=level, mtime=0) + \
        gzip.compress(payload[split:], compresslevel=level, mtime=0)


def place(directory: Path, stem: str, payload: bytes, compress: bool) -> Path:
    path = directory / (f"{stem}.gz" if compress else stem)
    path.write_bytes(gzipped(payload) if compress else payload)
    return path


small_shapes = st.tuples(st.integers(0, 12), st.integers(1, 5), st.integers(1, 5))
seeds = st.integers(0, 2**32 - 1)


# ---- IDX: malformed headers and payloads ----------------------------------------------------------
HEADER_FAULTS = ("magic", "type", "rank", "overflowing_sizes", "zero_item_size", "truncated", "extended")


def damage_idx(payload: bytes, fault: str, data: st.DataObject) -> bytes:
    broken = bytearray(payload)
    if fault == "magic":
        broken[data.draw(st.sampled_from([0, 1]))] = data.draw(st.integers(1, 255))
    elif fault == "type":
        broken[2] = data.draw(st.integers(0, 255).filter(lambda code: code != 0x08))
    elif fault == "rank":
        broken[3] = data.draw(st.integers(0, 255).filter(lambda rank: rank != 3))
    elif fault == "overflowing_sizes":
        sizes = data.draw(st.lists(st.integers(1, 2**32 - 1), min_size=3, max_size=3))
        big = data.draw(st.integers(0, 2))
        others = math.prod(sizes) // sizes[big]
        sizes[big] = data.draw(st.integers(MAX_IDX_BYTES // others + 1, 2**32 - 1))  # product > 10^9
        broken[4:16] = struct.pack(">3I", *sizes)
    elif fault == "zero_item_size":
        offset = data.draw(st.sampled_from([8, 12]))  # height or width
        broken[offset:offset + 4] = bytes(4)
    elif fault == "truncated":
        del broken[data.draw(st.integers(0, len(broken) - 1)):]
    elif fault == "extended":
        broken += data.draw(st.binary(min_size=1, max_size=64))
    return bytes(broken)


@pytest.mark.parametrize("fault", HEADER_FAULTS)
@FUZZ
@given(seed=seeds, shape=small_shapes, compress=st.booleans(), data=st.data())
def test_malformed_idx_is_refused_in_one_line(fault, seed, shape, compress, data):
    payload = idx_bytes(random_array(seed, shape))
    with TemporaryDirectory() as tmp:
        path = place(Path(tmp), "train-images-idx3-ubyte", damage_idx(payload, fault, data), compress)
        refusal(lambda: read_idx(path, 3), path)


@FUZZ
@given(header=st.binary(min_size=0, max_size=20), body=st.binary(max_size=64), compress=st.booleans())
def test_random_idx_header_is_refused_or_read_as_declared(header, body, compress):
    with TemporaryDirectory() as tmp:
        path = place(Path(tmp), "train-images-idx3-ubyte", header + body, compress)
        loaded = refused_or_loaded(lambda: read_idx(path, 3), path)
    if loaded is not None:  # then it was a valid rank-3 file, and holds exactly what it says
        raw = header + body
        shape = struct.unpack(">3I", raw[4:16])
        assert loaded.shape == shape and loaded.tobytes() == raw[16:]


# ---- IDX: damaged gzip streams --------------------------------------------------------------------
@FUZZ
@given(noise=st.binary(max_size=512), gzip_magic=st.booleans())
def test_random_bytes_as_gzip_are_refused(noise, gzip_magic):
    with TemporaryDirectory() as tmp:
        path = Path(tmp) / "train-images-idx3-ubyte.gz"
        path.write_bytes((b"\x1f\x8b\x08" if gzip_magic else b"") + noise)
        refused_or_loaded(lambda: read_idx(path, 3), path)


@FUZZ
@given(seed=seeds, shape=small_shapes, level=st.integers(0, 9), data=st.data())
def test_truncated_gzip_is_refused(seed, shape, level, data):
    compressed = gzipped(idx_bytes(random_array(seed, shape)), level)
    cut = data.draw(st.integers(0, len(compressed) - 1))
    with TemporaryDirectory() as tmp:
        path = Path(tmp) / "train-images-idx3-ubyte.gz"
        path.write_bytes(compressed[:cut])
        refusal(lambda: read_idx(path, 3), path)


@FUZZ
@given(seed=seeds, shape=small_shapes, first=st.integers(1, 255), rest=st.binary(max_size=63))
def test_gzip_with_trailing_garbage_is_refused(seed, shape, first, rest):
    # Zero bytes after the last member are padding that gzip readers accept; anything else is not.
    with TemporaryDirectory() as tmp:
        path = Path(tmp) / "train-images-idx3-ubyte.gz"
        path.write_bytes(gzipped(idx_bytes(random_array(seed, shape))) + bytes([first]) + rest)
        refusal(lambda: read_idx(path, 3), path)


@FUZZ
@given(seed=seeds, shape=small_shapes, data=st.data())
def test_gzip_with_damaged_bytes_is_refused_or_unchanged(seed, shape, data):
    array = random_array(seed, shape)
    compressed = bytearray(gzipped(idx_bytes(array)))
    # Anywhere from the deflate stream on (the header's time stamp and OS byte are free to change).
    start = data.draw(st.integers(10, len(compressed) - 1))
    for offset, flip in enumerate(data.draw(st.lists(st.integers(1, 255), min_size=1, max_size=8))):
        if start + offset < len(compressed):
            compressed[start + offset] ^= flip
    with TemporaryDirectory() as tmp:
        path = Path(tmp) / "train-images-idx3-ubyte.gz"
        path.write_bytes(bytes(compressed))
        loaded = refused_or_loaded(lambda: read_idx(path, 3), path)
    if loaded is not None:
        assert np.array_equal(loaded, array)


@FUZZ
@given(seed=seeds, shape=small_shapes, extra=st.integers(1, 5000), level=st.integers(1, 9))
def test_gzip_longer_than_its_header_is_refused(seed, shape, extra, level):
    payload = idx_bytes(random_array(seed, shape)) + bytes(extra)
    with TemporaryDirectory() as tmp:
        path = Path(tmp) / "train-images-idx3-ubyte.gz"
        path.write_bytes(gzipped(payload, level))
        assert "decompresses to more than" in refusal(lambda: read_idx(path, 3), path)


# ---- IDX: the dataset loader (images and labels together) -----------------------------------------
PAIR_FAULTS = ("few_images", "count_mismatch", "bad_label", "wrong_image_size")


@pytest.mark.parametrize("fault", PAIR_FAULTS)
@FUZZ
@given(seed=seeds, compress=st.booleans(), data=st.data())
def test_malformed_mnist_directory_is_refused_in_one_line(fault, seed, compress, data):
    count = data.draw(st.integers(0, 9) if fault == "few_images" else st.integers(10, 20))
    side = data.draw(st.sampled_from([27, 29, 32, 1])) if fault == "wrong_image_size" else 28
    images = random_array(seed, (count, side, side))
    labels = random_array(seed + 1, (count,), high=10)
    if fault == "count_mismatch":
        labels = random_array(seed + 1, (count + data.draw(st.sampled_from([-1, 1, 7])),), high=10)
    if fault == "bad_label":
        labels[data.draw(st.integers(0, count - 1))] = data.draw(st.integers(10, 255))
    with TemporaryDirectory() as tmp:
        directory = Path(tmp)
        images_path = place(directory, "train-images-idx3-ubyte", idx_bytes(images), compress)
        labels_path = place(directory, "train-labels-idx1-ubyte", idx_bytes(labels), compress)
        named = labels_path if fault == "bad_label" else images_path
        message = refusal(lambda: load_idx_splits(Path(directory), "MNIST", MEAN, STD), named)
    if fault == "few_images":
        assert f"has {count} images; at least 10 are needed" in message


# ---- IDX: valid files load the same in every spelling ---------------------------------------------
@FUZZ
@given(seed=seeds, shape=small_shapes, level=st.integers(0, 9), data=st.data())
def test_valid_idx_loads_the_same_raw_gzipped_and_in_gzip_members(seed, shape, level, data):
    array = random_array(seed, shape)
    payload = idx_bytes(array)
    split = data.draw(st.integers(0, len(payload)))
    with TemporaryDirectory() as tmp:
        raw, one, two = (Path(tmp) / name for name in ("a-idx3-ubyte", "b-idx3-ubyte.gz", "c-idx3-ubyte.gz"))
        raw.write_bytes(payload)
        one.write_bytes(gzipped(payload, level))
        two.write_bytes(gzipped(payload, level, split))
        for path in (raw, one, two):
            assert np.array_equal(read_idx(path, 3), array)


@FUZZ_DATASETS
@given(seed=seeds, count=st.integers(10, 40))
def test_valid_mnist_directory_loads_the_same_raw_and_gzipped(seed, count):
    images, labels = random_array(seed, (count, 28, 28)), random_array(seed + 1, (count,), high=10)
    with TemporaryDirectory() as tmp:
        loaded = []
        for compress in (False, True):
            directory = Path(tmp) / str(compress)
            directory.mkdir()
            place(directory, "train-images-idx3-ubyte", idx_bytes(images), compress)
            place(directory, "train-labels-idx1-ubyte", idx_bytes(labels), compress)
            loaded.append(load_idx_splits(Path(directory), "MNIST", MEAN, STD))
    assert same_splits(*loaded)
    assert loaded[0].train_size + loaded[0].validation_size == count and loaded[0].validation_size >= 1


# ---- CIFAR-10 builders ----------------------------------------------------------------------------
def cifar_batches(seed: int, counts: list[int]) -> dict[str, bytes]:
    rng = np.random.default_rng(seed)
    batches = {}
    for name, count in zip(TRAIN_BATCHES, counts):
        records = rng.integers(0, 256, size=(count, RECORD_BYTES), dtype=np.uint8)
        records[:, 0] = rng.integers(0, 10, count)
        batches[name] = records.tobytes()
    return batches


def write_loose(directory: Path, batches: dict[str, bytes], folder: bool) -> Path:
    target = directory / ARCHIVE_FOLDER if folder else directory
    target.mkdir(parents=True, exist_ok=True)
    for name, raw in batches.items():
        (target / name).write_bytes(raw)
    return target


def tar_entry(name: str, raw: bytes | None = None, kind: bytes = tarfile.REGTYPE,
              declared: int | None = None) -> bytes:
    """One tar entry: its header (size ``declared`` if given) and its data padded to 512 bytes."""
    info = tarfile.TarInfo(name)
    info.type = kind
    raw = raw or b""
    info.size = len(raw) if declared is None else declared
    if kind == tarfile.SYMTYPE:
        info.linkname = f"{ARCHIVE_FOLDER}/readme.html"
    return info.tobuf(format=tarfile.USTAR_FORMAT) + raw + bytes(-len(raw) % 512)


def tar_bytes(entries: list[bytes]) -> bytes:
    """The entries, then the end-of-archive blocks and padding to tar's 10,240-byte records."""
    body = b"".join(entries) + bytes(1024)
    return body + bytes(-len(body) % 10240)


def cifar_entries(batches: dict[str, bytes], order: list[int], extras: bool) -> list[bytes]:
    names = list(batches)
    entries = [tar_entry(f"{ARCHIVE_FOLDER}/{names[i]}", batches[names[i]]) for i in order]
    if extras:  # what the published archive holds besides the training batches
        entries.insert(0, tar_entry(ARCHIVE_FOLDER, kind=tarfile.DIRTYPE))
        entries.insert(2, tar_entry(f"{ARCHIVE_FOLDER}/batches.meta.txt", b"airplane\nautomobile\n"))
        entries.append(tar_entry(f"{ARCHIVE_FOLDER}/test_batch.bin", next(iter(batches.values()))))
        entries.append(tar_entry(f"{ARCHIVE_FOLDER}/readme.html", b"<html></html>"))
    return entries


counts_strategy = st.lists(st.integers(2, 6), min_size=5, max_size=5)
orders = st.permutations(range(5))


# ---- CIFAR-10: damaged loose batches --------------------------------------------------------------
LOOSE_FAULTS = ("truncated_batch", "empty_batch", "bad_label", "oversize_batch", "few_images")


@pytest.mark.parametrize("fault", LOOSE_FAULTS)
@FUZZ
@given(seed=seeds, counts=counts_strategy, folder=st.booleans(), data=st.data())
def test_malformed_cifar_batches_are_refused_in_one_line(fault, seed, counts, folder, data):
    if fault == "few_images":
        counts = [1] * 5
    batches = cifar_batches(seed, counts)
    victim = data.draw(st.sampled_from(TRAIN_BATCHES))
    raw = bytearray(batches[victim])
    with TemporaryDirectory() as tmp:
        target = write_loose(Path(tmp), batches, folder)
        path = target / victim
        if fault == "truncated_batch":
            path.write_bytes(raw[:data.draw(st.integers(1, len(raw) - 1).filter(lambda n: n % RECORD_BYTES))])
        elif fault == "empty_batch":
            path.write_bytes(b"")
        elif fault == "bad_label":
            raw[RECORD_BYTES * data.draw(st.integers(0, len(raw) // RECORD_BYTES - 1))] = data.draw(
                st.integers(10, 255))
            path.write_bytes(raw)
        elif fault == "oversize_batch":
            # A sparse file: as big as it claims, at no cost on disk.
            os.truncate(path, BATCH_MAX_BYTES + data.draw(st.integers(1, 10 * RECORD_BYTES)))
        message = refusal(lambda: load_cifar10_splits(Path(tmp)), target if fault == "few_images" else path)
    if fault == "few_images":
        assert "has 5 images; at least 10 are needed" in message


# ---- CIFAR-10: damaged archives -------------------------------------------------------------------
ARCHIVE_FAULTS = ("missing_members", "oversize_member", "not_a_regular_file", "truncated_archive",
                  "random_bytes")


def damage_archive(batches: dict[str, bytes], fault: str, order: list[int], extras: bool,
                   data: st.DataObject) -> bytes:
    entries = cifar_entries(batches, order, extras)
    names = list(batches)
    position = {f"{ARCHIVE_FOLDER}/{names[i]}": index for index, i in enumerate(order)}
    if extras:
        position = {name: index + (2 if index >= 1 else 1) for name, index in position.items()}
    victim = f"{ARCHIVE_FOLDER}/{data.draw(st.sampled_from(names))}"
    if fault == "missing_members":
        gone = data.draw(st.sets(st.sampled_from(names), min_size=1))
        entries = [e for e in entries if not any(e.startswith(f"{ARCHIVE_FOLDER}/{g}".encode()) for g in gone)]
    elif fault == "oversize_member":
        declared = data.draw(st.integers(BATCH_MAX_BYTES + 1, 8**11 - 1))
        entries[position[victim]] = tar_entry(victim, b"\0" * 512, declared=declared)[:1024]
    elif fault == "not_a_regular_file":
        kind = data.draw(st.sampled_from([tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.FIFOTYPE]))
        entries[position[victim]] = tar_entry(victim, kind=kind)
    compressed = gzipped(tar_bytes(entries), data.draw(st.integers(1, 9)))
    if fault == "truncated_archive":
        compressed = compressed[:data.draw(st.integers(0, len(compressed) - 1))]
    elif fault == "random_bytes":
        compressed = data.draw(st.sampled_from([b"", b"\x1f\x8b\x08"])) + data.draw(st.binary(max_size=2048))
    return compressed


@pytest.mark.parametrize("fault", ARCHIVE_FAULTS)
@FUZZ
@given(seed=seeds, counts=counts_strategy, order=orders, extras=st.booleans(), data=st.data())
def test_malformed_cifar_archive_is_refused_in_one_line(fault, seed, counts, order, extras, data):
    batches = cifar_batches(seed, counts)
    with TemporaryDirectory() as tmp:
        archive = Path(tmp) / ARCHIVE
        archive.write_bytes(damage_archive(batches, fault, order, extras, data))
        message = refusal(lambda: load_cifar10_splits(Path(tmp)), archive)
    if fault == "missing_members":
        assert "does not contain" in message
    if fault == "oversize_member":
        assert "more than a batch's 10000 records" in message


@pytest.mark.parametrize("damage", ["cut_tar", "flipped_bytes"])
@FUZZ
@given(seed=seeds, counts=counts_strategy, order=orders, extras=st.booleans(), data=st.data())
def test_damaged_cifar_archive_is_refused_or_unchanged(damage, seed, counts, order, extras, data):
    batches = cifar_batches(seed, counts)
    tar = tar_bytes(cifar_entries(batches, order, extras))
    if damage == "cut_tar":  # a tar cut short, then compressed: gzip itself is intact
        compressed = gzipped(tar[:data.draw(st.integers(0, len(tar) - 1))])
    else:
        compressed = bytearray(gzipped(tar))
        start = data.draw(st.integers(10, len(compressed) - 1))
        for offset, flip in enumerate(data.draw(st.lists(st.integers(1, 255), min_size=1, max_size=8))):
            if start + offset < len(compressed):
                compressed[start + offset] ^= flip
    with TemporaryDirectory() as tmp:
        expected = load_cifar10_splits(write_loose(Path(tmp) / "extracted", batches, folder=True).parent)
        archive = Path(tmp) / ARCHIVE
        archive.write_bytes(bytes(compressed))
        loaded = refused_or_loaded(lambda: load_cifar10_splits(Path(tmp)), archive)
    if loaded is not None:
        assert same_splits(loaded, expected)


@FUZZ_DATASETS
@given(seed=seeds, counts=counts_strategy, order=orders, extras=st.booleans(), level=st.integers(0, 9))
def test_valid_cifar_loads_the_same_from_archive_folder_and_loose_files(seed, counts, order, extras, level):
    batches = cifar_batches(seed, counts)
    with TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "tar").mkdir()
        (root / "tar" / ARCHIVE).write_bytes(gzipped(tar_bytes(cifar_entries(batches, order, extras)), level))
        write_loose(root / "folder", batches, folder=True)
        write_loose(root / "loose", batches, folder=False)
        loaded = [load_cifar10_splits(root / layout) for layout in ("tar", "folder", "loose")]
    assert same_splits(loaded[0], loaded[1]) and same_splits(loaded[0], loaded[2])
    assert loaded[0].train_size + loaded[0].validation_size == sum(counts)


def test_archive_with_too_many_entries_is_refused(tmp_path):
    entries = [tar_entry(f"{ARCHIVE_FOLDER}/junk{i}", b"x") for i in range(1001)]
    (tmp_path / ARCHIVE).write_bytes(gzipped(tar_bytes(entries)))
    assert "more than 1000 entries" in refusal(lambda: load_cifar10_splits(tmp_path), tmp_path / ARCHIVE)


# ---- decompression bombs, under a memory limit ----------------------------------------------------
MEMORY_LIMIT = 3 << 30  # the loaders' imports (torch, numpy) need about 2 GiB of address space
ZERO_CHUNK = 64 << 20
BOMB_CHUNKS = 64  # 64 x 64 MiB = 4 GiB of zeros


@pytest.fixture(scope="module")
def zero_member() -> bytes:
    """64 MiB of zeros as one gzip member (about 64 KB). Members concatenate into one gzip stream,
    so repeating it builds a 4 GiB stream in milliseconds instead of compressing 4 GiB."""
    return gzip.compress(bytes(ZERO_CHUNK), compresslevel=9, mtime=0)


def write_bomb(path: Path, head: bytes, zero_member: bytes) -> None:
    with path.open("wb") as out:
        out.write(gzip.compress(head, mtime=0))
        for _ in range(BOMB_CHUNKS):
            out.write(zero_member)


LOAD_DRIVER = """
import sys
from edps_mlflow.data.catalog import load_dataset
from edps_mlflow.errors import EdpsError
try:
    load_dataset(sys.argv[1], sys.argv[2])
except EdpsError as error:
    print(f"edps: error: {error}", file=sys.stderr)
    sys.exit(2)
"""


def load_under_memory_limit(dataset: str, data_dir: Path) -> subprocess.CompletedProcess:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    return subprocess.run([sys.executable, "-c", LOAD_DRIVER, dataset, str(data_dir)], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, preexec_fn=limit,
                          capture_output=True, text=True, timeout=120)


def assert_one_line_exit_2(result: subprocess.CompletedProcess, *expected: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert all(text in lines[0] for text in expected), lines[0]


def test_memory_limit_leaves_room_for_a_normal_load(tmp_path):
    images, labels = random_array(0, (60, 28, 28)), random_array(1, (60,), high=10)
    place(tmp_path, "train-images-idx3-ubyte", idx_bytes(images), True)
    place(tmp_path, "train-labels-idx1-ubyte", idx_bytes(labels), True)
    result = load_under_memory_limit("mnist", tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]


def test_idx_gzip_bomb_is_refused_within_the_memory_limit(tmp_path, zero_member):
    # The header promises MNIST's 60,000 x 28 x 28; the stream goes on for 4 GiB.
    bomb = tmp_path / "train-images-idx3-ubyte.gz"
    write_bomb(bomb, bytes([0, 0, 8, 3]) + struct.pack(">3I", 60_000, 28, 28), zero_member)
    assert bomb.stat().st_size < 8 << 20
    place(tmp_path, "train-labels-idx1-ubyte", idx_bytes(np.zeros(60_000, np.uint8)), True)
    result = load_under_memory_limit("mnist", tmp_path)
    assert_one_line_exit_2(result, str(bomb), "decompresses to more than the header's 47040000 bytes")


def test_cifar_member_bomb_is_refused_within_the_memory_limit(tmp_path, zero_member):
    # A training batch whose header declares 4 GiB, and whose data really are 4 GiB of zeros.
    header = tar_entry(f"{ARCHIVE_FOLDER}/data_batch_1.bin", declared=BOMB_CHUNKS * ZERO_CHUNK)
    write_bomb(tmp_path / ARCHIVE, header, zero_member)
    result = load_under_memory_limit("cifar10", tmp_path)
    assert_one_line_exit_2(result, ARCHIVE, "data_batch_1.bin", "more than a batch's 10000 records")


def test_cifar_archive_bomb_is_refused_within_the_memory_limit(tmp_path, zero_member):
    # An entry we skip (the test batch) that decompresses to 4 GiB: walking past it is bounded too.
    header = tar_entry(f"{ARCHIVE_FOLDER}/test_batch.bin", declared=BOMB_CHUNKS * ZERO_CHUNK)
    write_bomb(tmp_path / ARCHIVE, header, zero_member)
    started = time.monotonic()
    result = load_under_memory_limit("cifar10", tmp_path)
    assert_one_line_exit_2(result, ARCHIVE, "decompresses to more than")
    assert time.monotonic() - started < 60


# ---- downloads from misbehaving servers ----------------------------------------------------------
BODY = b"0123456789" * 100  # 1,000 bytes


class Misbehaving(http.server.BaseHTTPRequestHandler):
    """Serves /<behaviour>.bin: what a broken or hostile server does."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        behaviour = self.path.strip("/").removesuffix(".bin")
        try:
            getattr(self, f"serve_{behaviour}")()
        except OSError:
            pass  # the client gave up on us: that is the point
        self.close_connection = True

    def _headers(self, length: int | None) -> None:
        self.send_response(200)
        if length is not None:
            self.send_header("Content-Length", str(length))
        else:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.flush()

    def serve_good(self) -> None:
        self._headers(len(BODY))
        self.wfile.write(BODY)

    def serve_truncated(self) -> None:
        self._headers(len(BODY))
        self.wfile.write(BODY[:400])

    def serve_reset(self) -> None:
        self._headers(len(BODY))
        self.wfile.write(BODY[:400])
        self.wfile.flush()
        time.sleep(0.1)
        # Linger 0: closing sends a reset instead of an orderly end.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()

    def serve_drip(self) -> None:
        self._headers(len(BODY))
        for byte in BODY[:100]:  # a byte every 0.1 s: never silent long enough for a timeout
            self.wfile.write(bytes([byte]))
            self.wfile.flush()
            time.sleep(0.1)

    def serve_silent(self) -> None:
        self._headers(len(BODY))
        time.sleep(3)

    def serve_announced_big(self) -> None:
        self._headers(10 * len(BODY))
        self.wfile.write(BODY)

    def serve_unannounced_big(self) -> None:
        self._headers(None)
        for _ in range(10):
            self.wfile.write(BODY)


class QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass


@pytest.fixture
def misbehaving_server(monkeypatch) -> Iterator[str]:
    server = QuietServer(("127.0.0.1", 0), Misbehaving)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    monkeypatch.setenv(catalog.MIRROR_ENV, url)
    yield url
    server.shutdown()
    server.server_close()


def one_file_source(behaviour: str) -> catalog.DatasetSource:
    remote = catalog.RemoteFile(f"{behaviour}.bin", ("http://unused.invalid/",), hashlib.md5(BODY).hexdigest())
    return replace(catalog.SOURCES["mnist"], name="misbehaving", files=(remote,))


@pytest.mark.parametrize("behaviour,expected", [
    ("truncated", "truncated download"),
    ("reset", "the server reset the connection|truncated download"),
    ("drip", "took longer than the 1 s limit"),
    ("silent", "timed out"),
    ("announced_big", "announces 10000 bytes, more than the 5000-byte limit"),
    ("unannounced_big", "more than the 5000-byte limit"),
])
def test_misbehaving_server_is_one_line_and_leaves_nothing(behaviour, expected, misbehaving_server, tmp_path):
    started = time.monotonic()
    with pytest.raises(EdpsError, match=expected) as caught:
        catalog.download(one_file_source(behaviour), tmp_path, timeout=1, deadline=1, max_bytes=5000,
                         report=lambda line: None)
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert "\n" not in message and f"{behaviour}.bin" in message
    assert not (tmp_path / "misbehaving").exists()


@pytest.mark.parametrize("umask", [0o022, 0o027], ids=["umask022", "umask027"])
def test_downloaded_file_gets_the_users_normal_permissions(umask, misbehaving_server, tmp_path):
    previous = os.umask(umask)
    try:
        directory = catalog.download(one_file_source("good"), tmp_path, timeout=5, report=lambda line: None)
    finally:
        os.umask(previous)
    target = directory / "good.bin"
    assert target.read_bytes() == BODY
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


# ---- the real command line ------------------------------------------------------------------------
def test_study_on_a_corrupt_gzip_is_one_line_and_touches_no_store(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    images = random_array(0, (50, 28, 28))
    compressed = bytearray(gzipped(idx_bytes(images)))
    compressed[10] |= 0b110  # the first deflate block's type becomes 3, which deflate reserves
    (data_dir / "train-images-idx3-ubyte.gz").write_bytes(bytes(compressed))
    with pytest.raises(zlib.error, match="invalid block type"):
        gzip.decompress(bytes(compressed))
    place(data_dir, "train-labels-idx1-ubyte", idx_bytes(random_array(1, (50,), high=10)), True)
    store = tmp_path / "mlflow.db"
    result = run_edps(["study", "--workload", "mnist-simple-cnn", "--data-dir", str(data_dir),
                       "--accept-unverified-data", "true"], cwd=tmp_path,
                      timeout=120, MLFLOW_TRACKING_URI=f"sqlite:///{store}")
    assert_one_line_exit_2(result, "train-images-idx3-ubyte.gz")
    assert result.stderr.startswith("edps: error: ")
    assert not store.exists()
