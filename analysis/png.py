"""PNG files of rendered figures, written without a filter search.

Pillow, which matplotlib writes its PNGs with, tries the five PNG filters on every row and keeps the best:
on a report's figures (white, with thin lines and text) that search was four fifths of the time spent
encoding, for files no smaller than the unfiltered rows give at zlib's fastest level. So a figure already
drawn is written here as the PNG standard's plainest file: the rows unfiltered (filter type 0), deflated
at zlib's fastest level, RGB when every pixel is opaque (a quarter fewer bytes to deflate), else RGBA,
with the resolution (pHYs) and the Software text that matplotlib's own PNGs carry."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

SIGNATURE = b"\x89PNG\r\n\x1a\n"
METRES_PER_INCH = 0.0254
# zlib's fastest level: the files are a tenth larger than at its default level, written several times faster
COMPRESS_LEVEL = 1
_COLOUR_TYPES = {3: 2, 4: 6}  # channels -> PNG colour type: truecolour, truecolour with alpha


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def encode(pixels: np.ndarray, dpi: float, software: str) -> bytes:
    """The PNG file of ``pixels`` (rows of RGBA or RGB, uint8), at ``dpi``; RGB when every pixel is opaque."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] not in _COLOUR_TYPES \
            or 0 in pixels.shape[:2]:
        raise ValueError(f"a PNG is made of rows of RGB or RGBA bytes, not an array of {pixels.dtype} "
                         f"shaped {pixels.shape}")
    if pixels.shape[2] == 4 and bool((pixels[:, :, 3] == 255).all()):
        pixels = pixels[:, :, :3]
    height, width, channels = pixels.shape
    rows = np.empty((height, 1 + width * channels), dtype=np.uint8)
    rows[:, 0] = 0  # filter type 0: the row as it is
    rows[:, 1:] = pixels.reshape(height, width * channels)
    per_metre = round(dpi / METRES_PER_INCH)
    return b"".join((
        SIGNATURE,
        _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, _COLOUR_TYPES[channels], 0, 0, 0)),
        _chunk(b"pHYs", struct.pack(">IIB", per_metre, per_metre, 1)),  # unit 1: the metre
        _chunk(b"tEXt", b"Software\x00" + software.encode("latin-1", "replace")),
        _chunk(b"IDAT", zlib.compress(rows.tobytes(), COMPRESS_LEVEL)),
        _chunk(b"IEND", b""),
    ))


def write(path: Path, pixels: np.ndarray, dpi: float, software: str) -> None:
    """``pixels`` as the PNG file ``path`` (see :func:`encode`)."""
    Path(path).write_bytes(encode(pixels, dpi, software))
