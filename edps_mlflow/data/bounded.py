"""Reading files we did not write: reads bounded by what the format can hold (a header's or an archive's size
is a claim, not a fact, so memory follows the bytes actually there), errors as one line."""

from __future__ import annotations

import struct
import tarfile
import zlib
from pathlib import Path
from typing import BinaryIO

from edps_mlflow.errors import EdpsError

READ_CHUNK = 1 << 20

# What damaged input makes the standard readers raise: gzip.BadGzipFile (an OSError), EOFError for a cut
# gzip stream, zlib.error, tarfile's errors, and struct.error or ValueError for malformed header fields.
DECODE_ERRORS: tuple[type[BaseException], ...] = (
    OSError, EOFError, zlib.error, tarfile.TarError, struct.error, ValueError,
)


def read_at_most(handle: BinaryIO, limit: int) -> bytearray:
    """Up to ``limit`` bytes (fewer at the end of the stream), read in chunks."""
    data = bytearray()
    while len(data) < limit:
        chunk = handle.read(min(READ_CHUNK, limit - len(data)))
        if not chunk:
            break
        data += chunk
    return data


def read_file(path: Path, limit: int) -> bytearray:
    """At most ``limit`` + 1 bytes of ``path`` (one more than the format holds, to notice a file with more);
    an unreadable file is one EdpsError line."""
    try:
        with path.open("rb") as handle:
            return read_at_most(handle, limit + 1)
    except DECODE_ERRORS as error:
        raise EdpsError(f"cannot read {path}: {describe(error)}") from None


def describe(error: BaseException) -> str:
    """An exception as one line: some messages span lines, some are empty."""
    return " ".join(str(error).split()) or type(error).__name__


class LimitExceeded(Exception):
    """A stream went past the number of bytes its format can hold."""


class BoundedReader:
    """A read-only stream that raises :class:`LimitExceeded` once more than ``limit`` bytes were read: for
    readers we cannot bound ourselves (tarfile walking an archive)."""

    def __init__(self, raw: BinaryIO, limit: int) -> None:
        self._raw = raw
        self._limit = limit
        self.consumed = 0

    def read(self, size: int = -1) -> bytes:
        allowed = self._limit + 1 - self.consumed
        size = allowed if size is None or size < 0 else min(size, allowed)
        data = self._raw.read(size) if size > 0 else b""
        self.consumed += len(data)
        if self.consumed > self._limit:
            raise LimitExceeded(f"more than {self._limit} bytes")
        return data
