"""The fingerprint of the data a study trains and validates on, part of every study and trial key: sha256 of
the tensors actually loaded (after the split and normalisation), so two copies of a dataset never share keys.
Cached per workload and file set by (path, size, mtime), so that a sweep plans without loading data or torch.
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from edps_mlflow import __version__

if TYPE_CHECKING:  # the data module loads torch: a cached fingerprint is read without it
    from edps_mlflow.data.splits import DataSplits

# Bump when the way of hashing changes: it is part of the cache's file names, not of the keys.
_SCHEME = "sha256-tensors-v1"


def splits_fingerprint(data: DataSplits) -> str:
    digest = hashlib.sha256(_SCHEME.encode())
    for tensor in (data.train_images, data.train_labels, data.validation_images, data.validation_labels):
        array = tensor.detach().cpu().contiguous().numpy()
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _cache_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "edps-mlflow" / "fingerprints"


def cached_fingerprint(files: list[Path], load: Callable[[], DataSplits], scope: str = "") -> str:
    """The fingerprint of what ``load`` returns, remembered for these files, ``scope`` (the workload: it may
    split or normalise them its own way) and this version of the package."""
    stats = [(str(path.resolve()), path.stat().st_size, path.stat().st_mtime_ns) for path in sorted(files)]
    entry = _cache_dir() / (hashlib.sha256(json.dumps([_SCHEME, scope, __version__, stats]).encode()).hexdigest()
                            + ".txt")
    with suppress(OSError):
        text = entry.read_text().strip()
        if len(text) == 64:
            return text
    value = splits_fingerprint(load())
    with suppress(OSError):  # an unwritable cache costs a reload next time, nothing else
        entry.parent.mkdir(parents=True, exist_ok=True)
        temporary = entry.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(value + "\n")
        os.replace(temporary, entry)
    return value
