"""Reading files we did not write: reads bounded by what the format allows, errors as one line.

A header or an archive's size field is a claim, not a fact: memory must follow the bytes that are
actually there, and never grow past what the format can legitimately hold.
"""

from __future__ import annotations

import struct
import tarfile
import zlib
from typing import BinaryIO

READ_CHUNK = 1 << 20

# What damaged input makes the standard readers raise: a bad gzip header is gzip.BadGzipFile (an
# OSError), a cut gzip stream EOFError, a damaged deflate stream zlib.error; tarfile has its own
# errors, and malformed header fields surface as struct.error or ValueError.
DECODE_ERRORS: tuple[type[BaseException], ...] = (
    OSError, EOFError, zlib.error, tarfile.TarError, struct.error, ValueError,
)


def read_at_most(handle: BinaryIO, limit: int) -> bytearray:
    """Up to ``limit`` bytes (fewer at the end of the stream).

    Read in chunks, so that memory grows with the data actually present rather than being
    allocated up front for a size that a header merely claims.
    """
    data = bytearray()
    while len(data) < limit:
        chunk = handle.read(min(READ_CHUNK, limit - len(data)))
        if not chunk:
            break
        data += chunk
    return data


def describe(error: BaseException) -> str:
    """An exception as one line: some messages span lines, some are empty."""
    return " ".join(str(error).split()) or type(error).__name__


class LimitExceeded(Exception):
    """A stream went past the number of bytes its format can hold."""


class BoundedReader:
    """A read-only stream that raises :class:`LimitExceeded` once more than ``limit`` bytes were read.

    For readers we cannot bound ourselves (tarfile walking an archive): whatever they do, they
    never see more than ``limit`` decompressed bytes.
    """

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
