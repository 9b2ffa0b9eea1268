"""The datasets of the built-in workloads: where their files live (a folder each under the data directory, or
the data directory itself: docs/workloads.md), their published checksums, status and download.

    edps data list
    edps data download mnist
"""

from __future__ import annotations

import hashlib
import http.client
import os
import socket
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import BinaryIO, Callable

from edps_mlflow.data.bounded import describe
from edps_mlflow.data.cifar import ARCHIVE, ARCHIVE_FOLDER, TRAIN_BATCHES, load_cifar10_splits
from edps_mlflow.data.idx import MNIST_TRAIN_FILES, load_idx_splits, resolve_data_dir
from edps_mlflow.data.shakespeare import FILE as SHAKESPEARE_FILE
from edps_mlflow.data.shakespeare import load_shakespeare_splits
from edps_mlflow.data.splits import DataSplits
from edps_mlflow.errors import EdpsError
from edps_mlflow.uris import redact_uri

# A base URL that replaces the official hosts (an institutional mirror, or a test server).
MIRROR_ENV = "EDPS_DATA_MIRROR"
# Per file: far above the largest real one (CIFAR-10's, 170 MB), so that no server can fill the disk.
MAX_DOWNLOAD_BYTES = 256 * 1024 * 1024
# Per file, for the whole transfer (the socket timeout only bounds each single wait).
DOWNLOAD_DEADLINE_S = 600.0
DOWNLOAD_CHUNK = 1 << 20


@dataclass(frozen=True)
class RemoteFile:
    """One file of a dataset with the checksum published for it: md5 (the paper's datasets publish md5) or
    sha256 (where that is what was published); both are checked when both are given."""

    name: str
    urls: tuple[str, ...]
    md5: str | None  # as published with the dataset
    sha256: str | None = None

    def matches(self, path: Path) -> bool:
        """Whether the file at ``path`` has the published checksum(s)."""
        return (self.md5 is None or md5_of(path) == self.md5) and \
            (self.sha256 is None or sha256_of(path) == self.sha256)

    @property
    def checksum(self) -> str:
        """The published checksum in words: ``md5 <hex>`` or ``sha256 <hex>``."""
        return f"md5 {self.md5}" if self.md5 is not None else f"sha256 {self.sha256}"

    def actual(self, path: Path) -> str:
        return f"md5 {md5_of(path)}" if self.md5 is not None else f"sha256 {sha256_of(path)}"


@dataclass(frozen=True)
class DatasetSource:
    name: str
    title: str
    files: tuple[RemoteFile, ...]
    # The files that, when present, make the dataset usable (any one group is enough).
    alternatives: tuple[tuple[str, ...], ...]
    load: Callable[[Path], DataSplits]


def _idx_files(base_urls: tuple[str, ...], md5s: tuple[str, str]) -> tuple[RemoteFile, ...]:
    names = [f"{stem}.gz" for stem in MNIST_TRAIN_FILES]
    return tuple(RemoteFile(name, tuple(base + name for base in base_urls), md5) for name, md5 in zip(names, md5s))


SOURCES: dict[str, DatasetSource] = {
    "mnist": DatasetSource(
        name="mnist", title="MNIST",
        files=_idx_files(("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/"),
                         ("f68b3c2dcbeaaa9fbdd348bbdeb94873", "d53e105ee54ea40749a09fcbcd1e9432")),
        alternatives=(tuple(f"{s}.gz" for s in MNIST_TRAIN_FILES), MNIST_TRAIN_FILES),
        load=lambda directory: load_idx_splits(directory, "MNIST", 0.1307, 0.3081),
    ),
    "fashion-mnist": DatasetSource(
        name="fashion-mnist", title="Fashion-MNIST",
        files=_idx_files(("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
                         ("8d4fb7e6c68d591d4c3dfef9ec88bf0d", "25c81989df183df01b3e8a0aad5dffbe")),
        alternatives=(tuple(f"{s}.gz" for s in MNIST_TRAIN_FILES), MNIST_TRAIN_FILES),
        load=lambda directory: load_idx_splits(directory, "Fashion-MNIST", 0.2860, 0.3530),
    ),
    "cifar10": DatasetSource(
        name="cifar10", title="CIFAR-10 (binary version)",
        files=(RemoteFile(ARCHIVE, ("https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",),
                          "c32a1d4ab5d03f1284b67883e8d87530"),),
        alternatives=((ARCHIVE,), tuple(f"{ARCHIVE_FOLDER}/{n}" for n in TRAIN_BATCHES), TRAIN_BATCHES),
        load=load_cifar10_splits,
    ),
    # Karpathy's char-rnn file, as nanoGPT fetches it; its sha256 as TensorFlow Datasets publishes it (no md5).
    "tiny-shakespeare": DatasetSource(
        name="tiny-shakespeare", title="Tiny Shakespeare (char-rnn input.txt)",
        files=(RemoteFile(SHAKESPEARE_FILE,
                          ("https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",),
                          None, sha256="86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"),),
        alternatives=((SHAKESPEARE_FILE,),),
        load=load_shakespeare_splits,
    ),
}


class DatasetStatus(str, Enum):
    PRESENT = "present"
    MISSING = "missing"
    CORRUPT = "corrupt"


@dataclass(frozen=True)
class DatasetReport:
    status: DatasetStatus
    directory: Path
    detail: str


def get_source(name: str) -> DatasetSource:
    try:
        return SOURCES[name]
    except KeyError:
        raise EdpsError(f"unknown dataset {name!r}; known datasets: {', '.join(SOURCES)}") from None


def _present(source: DatasetSource, directory: Path) -> tuple[str, ...] | None:
    """The first group of files that makes the dataset usable, when all of its files are in ``directory``."""
    return next((group for group in source.alternatives if all((directory / f).is_file() for f in group)), None)


def dataset_directory(source: DatasetSource, data_dir: str | Path | None) -> Path:
    """``<data dir>/<dataset>``, or the data directory itself when the files lie there."""
    root = resolve_data_dir(data_dir)
    return next((d for d in (root / source.name, root) if _present(source, d)), root / source.name)


def _not_there(source: DatasetSource, directory: Path) -> EdpsError:
    expected = " or ".join(", ".join(group) for group in source.alternatives[:2])
    where = "does not exist" if not directory.is_dir() else "lacks the files"
    return EdpsError(f"{source.title} data directory {directory} {where}; put {expected} there "
                     f"(`edps data download {source.name}` fetches them), or pass --data-dir / set EDPS_DATA_DIR")


def require_present(name: str, data_dir: str | Path | None) -> Path:
    """The dataset's directory, or a one-line error when its files are not there (nothing is read)."""
    source = get_source(name)
    directory = dataset_directory(source, data_dir)
    if _present(source, directory) is None:
        raise _not_there(source, directory)
    return directory


def dataset_files(name: str, data_dir: str | Path | None) -> list[Path]:
    """The files the dataset is loaded from (the first complete group present)."""
    directory = require_present(name, data_dir)
    return [directory / f for f in _present(get_source(name), directory) or ()]


def load_dataset(name: str, data_dir: str | Path | None) -> DataSplits:
    """The dataset's splits; a directory without its files gets the loader's own, finer error."""
    source = get_source(name)
    directory = dataset_directory(source, data_dir)
    if not directory.is_dir():
        raise _not_there(source, directory)
    return source.load(directory)


# Hashed on every study, not cached: MNIST's files take milliseconds, CIFAR-10's archive (170 MB) under a second,
# beside its loading. Keys need no more: the data fingerprint hashes the tensors loaded, so other data share no key.
def unverified_files(name: str, data_dir: str | Path | None) -> list[str]:
    """Each file the dataset loads from that is not a published one, with why; [] when every one is, when the
    files are not there (the loader says so) or when the catalog does not know the dataset (a user's own)."""
    source = SOURCES.get(name)
    if source is None:
        return []
    directory = dataset_directory(source, data_dir).absolute()  # as the runs record it
    published = {remote.name: remote for remote in source.files}
    found = []
    for file in _present(source, directory) or ():
        path, remote = directory / file, published.get(file)
        if remote is None:
            found.append(f"{path} (extracted: no published checksum; the published files: "
                         f"{', '.join(f'{r.name} {r.checksum}' for r in source.files)})")
        elif not remote.matches(path):
            found.append(f"{path} (expected {remote.checksum}, found {remote.actual(path)})")
    return found


def require_verified(name: str, data_dir: str | Path | None, accept: bool) -> str | None:
    """Before any training: None when the dataset's files are the published ones; else, when ``accept``, which
    are not (every run records it: names.TAG_UNVERIFIED_DATA); without it, one line naming the first."""
    found = unverified_files(name, data_dir)
    if found and not accept:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise EdpsError(f"unverified data: {found[0]}{more}; put the published files there (`edps data download "
                        f"{name}`), or pass --accept-unverified-data true to train on these (every run records it)")
    return "; ".join(found) or None


def md5_of(path: Path) -> str:
    return _digest_of(path, hashlib.md5(usedforsecurity=False))


def sha256_of(path: Path) -> str:
    return _digest_of(path, hashlib.sha256())


def _digest_of(path: Path, digest: "hashlib._Hash") -> str:
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def dataset_report(name: str, data_dir: str | Path | None) -> DatasetReport:
    """Missing, corrupt (does not load) or present; present says whether checksums were verified."""
    source = get_source(name)
    directory = dataset_directory(source, data_dir)
    if _present(source, directory) is None:
        return DatasetReport(DatasetStatus.MISSING, directory, "no files")
    try:
        splits = source.load(directory)
    except EdpsError as error:
        return DatasetReport(DatasetStatus.CORRUPT, directory, str(error))
    published = [f for f in source.files if (directory / f.name).is_file()]
    differing = [f.name for f in published if not f.matches(directory / f.name)]
    if differing:
        one = len(differing) == 1
        check = (f"loads, but {', '.join(differing)} {'differs' if one else 'differ'} from the published "
                 f"{'file' if one else 'files'} (checksum)")
    elif published:
        check = "published checksums verified"
    else:
        check = "extracted files, structure checked (no published checksum to compare)"
    return DatasetReport(DatasetStatus.PRESENT, directory,
                         f"{splits.train_size} train / {splits.validation_size} validation; {check}")


def _urls(remote: RemoteFile) -> tuple[str, ...]:
    mirror = os.environ.get(MIRROR_ENV)
    if mirror:
        if not mirror.lower().startswith(("http://", "https://")):
            raise EdpsError(f"{MIRROR_ENV} must be an http:// or https:// URL, got {redact_uri(mirror)!r}")
        return (mirror.rstrip("/") + "/" + remote.name,)
    return remote.urls


def download(source: DatasetSource, data_dir: str | Path | None, timeout: float = 60.0,
             report: Callable[[str], None] = print, deadline: float = DOWNLOAD_DEADLINE_S,
             max_bytes: int = MAX_DOWNLOAD_BYTES) -> Path:
    """Fetch the official files into ``<data dir>/<dataset>``, each moved into place only after its checksum
    matched. ``timeout`` bounds each wait for the server, ``deadline`` (seconds) a whole file's transfer and
    ``max_bytes`` its size."""
    directory = resolve_data_dir(data_dir) / source.name
    created = not directory.exists()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise EdpsError(f"cannot create the data directory {directory}: {describe(error)}") from None
    try:  # writable, said before any server is asked
        tempfile.TemporaryFile(dir=directory).close()
    except OSError as error:
        raise EdpsError(f"cannot write in {directory}: {describe(error)}") from None
    limits = _Limits(timeout=timeout, deadline=deadline, max_bytes=max_bytes)
    try:
        for remote in source.files:
            _download_file(remote, directory / remote.name, limits, report)
    except EdpsError:
        if created and not any(directory.iterdir()):
            directory.rmdir()
        raise
    return directory


@dataclass(frozen=True)
class _Limits:
    timeout: float  # seconds for any one wait on the server (connect, each read)
    deadline: float  # seconds for the whole transfer of one file
    max_bytes: int


class _TransferFailed(Exception):
    """One URL failed; the message says why, in one line."""


def _download_file(remote: RemoteFile, target: Path, limits: _Limits, report: Callable[[str], None]) -> None:
    if target.is_file() and remote.matches(target):
        report(f"{remote.name}: already present, checksum verified")
        return
    errors = []
    for url in _urls(remote):
        report(f"{remote.name}: downloading {redact_uri(url)}")  # a mirror URL may carry credentials
        try:
            _fetch_verified(url, remote, target, limits)
        except _TransferFailed as error:
            errors.append(redact_uri(f"{url}: {error}"))
            continue
        report(f"{remote.name}: checksum verified")
        return
    raise EdpsError(f"could not fetch {remote.name} ({'; '.join(errors)}); download it by hand from "
                    f"{remote.urls[0]} ({remote.checksum}) and put it in {target.parent}")


def _fetch_verified(url: str, remote: RemoteFile, target: Path, limits: _Limits) -> None:
    """``url`` into ``target`` through a partial file (created as any file of the user's is) that only a
    matching checksum moves into place."""
    partial = target.with_name(f".{remote.name}.{os.getpid()}.part")
    try:
        _fetch(url, partial, limits)
        if not remote.matches(partial):
            raise _TransferFailed(f"checksum mismatch (expected {remote.checksum}, got {remote.actual(partial)})")
        partial.replace(target)
    except OSError as error:
        raise _TransferFailed(_reason(error, limits)) from None
    finally:
        partial.unlink(missing_ok=True)


def _fetch(url: str, destination: Path, limits: _Limits) -> None:
    """Copy ``url`` to ``destination``, refusing more than ``max_bytes`` or longer than ``deadline``: the socket
    timeout bounds each wait only, so a server that drips a byte at a time would never trip it."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=limits.timeout) as response, destination.open("wb") as out:
            announced = _announced_length(response)
            if announced is not None and announced > limits.max_bytes:
                raise _TransferFailed(f"the server announces {announced} bytes, more than the "
                                      f"{limits.max_bytes}-byte limit for a dataset file")
            received = _copy_bounded(response, out, started, limits)
    except urllib.error.HTTPError as error:
        raise _TransferFailed(describe(error)) from None
    except urllib.error.URLError as error:
        raise _TransferFailed(_reason(error.reason, limits)) from None
    except (http.client.HTTPException, ValueError) as error:
        raise _TransferFailed(_reason(error, limits)) from None
    if announced is not None and received < announced:
        raise _TransferFailed(f"connection closed after {received} of {announced} bytes (truncated download)")


def _copy_bounded(response: BinaryIO, out: BinaryIO, started: float, limits: _Limits) -> int:
    # read1: one read of the socket, so that the deadline is checked while data trickles in (a redirect to
    # another scheme may give a response without it).
    read = getattr(response, "read1", response.read)
    received = 0
    while True:
        chunk = read(min(DOWNLOAD_CHUNK, limits.max_bytes + 1 - received))
        if not chunk:
            return received
        received += len(chunk)
        if received > limits.max_bytes:
            raise _TransferFailed(f"more than the {limits.max_bytes}-byte limit for a dataset file; stopped")
        if time.monotonic() - started > limits.deadline:
            raise _TransferFailed(f"took longer than the {limits.deadline:g} s limit for one file "
                                  f"({received} bytes received); stopped")
        out.write(chunk)


def _announced_length(response: BinaryIO) -> int | None:
    try:
        return int(response.headers["Content-Length"])  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError):
        return None


def _reason(error: BaseException | str, limits: _Limits) -> str:
    if isinstance(error, http.client.IncompleteRead):
        return "the connection closed before the whole file arrived (truncated download)"
    if isinstance(error, (TimeoutError, socket.timeout)):
        return f"no answer from the server for {limits.timeout:g} s (timed out)"
    if isinstance(error, ConnectionResetError):
        return "the server reset the connection"
    return describe(error) if isinstance(error, BaseException) else " ".join(str(error).split())
