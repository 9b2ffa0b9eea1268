"""Score once, prune anywhere: pruning scores kept on disk, keyed by the sha256 of all they depend on (the
workload, the data fingerprint, the scoring method, the init seed, the parameters' names and shapes, the
results version, and the sparsity for a method whose scores depend on it): never batch size or optimizer.

Where: ``$EDPS_SCORE_CACHE`` (a directory, or ``off``), else ``$XDG_CACHE_HOME/edps-mlflow/pruning-scores``, shared
by every process of a machine (docs/pruning.md). Entries (``.npz``, no pickle, with the seconds they took) are
written whole, and a process that finds another computing one waits for it (bounded and said, and not for a stopped
one); an unreadable entry is computed again, an unwritable directory costs the computation, nothing else.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import zipfile
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch import Tensor

from edps_mlflow.config import RESULTS_VERSION
from edps_mlflow.locks import LockWait, describe_holders, is_stopped, lock_holders

ENVIRONMENT = "EDPS_SCORE_CACHE"
OFF = "off"
_SCHEME = "edps-pruning-scores-v1"
# How long a process waits for another that computes the same entry (a live one: scoring can take minutes).
WAIT_SECONDS = 600.0
# The entry's computing seconds, beside the score arrays (a parameter name never starts with a dunder).
_SECONDS = "__seconds__"


def default_score_cache() -> str | None:
    """The cache directory of this process's environment, or None when it is turned off."""
    value = os.environ.get(ENVIRONMENT)
    if value is not None:
        return None if value.strip().lower() in ("", OFF) else value
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(cache) / "edps-mlflow" / "pruning-scores")


def score_key(workload: str, data_fingerprint: str, scorer: str, init_seed: int, shapes: dict[str, torch.Size],
              sparsity: float | None) -> str:
    """The entry's key (``sparsity`` only for a method whose scores depend on it)."""
    identity = {"scheme": _SCHEME, "results_version": RESULTS_VERSION, "workload": workload,
                "data_fingerprint": data_fingerprint, "scorer": scorer, "init_seed": int(init_seed),
                "parameters": [[name, list(shape)] for name, shape in shapes.items()],
                "sparsity": None if sparsity is None else repr(float(sparsity))}
    return hashlib.sha256(json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class ScoreCache:
    """A directory of score entries (see the module's docstring)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory).expanduser()

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.npz"

    def load(self, key: str, shapes: dict[str, torch.Size]) -> tuple[dict[str, Tensor], float] | None:
        """The entry's scores (one per name of ``shapes``, of that shape) and computing seconds; None when
        there is none, or it cannot be read, or it holds other tensors."""
        try:
            with np.load(self._path(key), allow_pickle=False) as arrays:
                if set(arrays.files) != set(shapes) | {_SECONDS}:
                    return None
                scores = {name: torch.from_numpy(arrays[name].copy()) for name in shapes}
                seconds = float(arrays[_SECONDS])
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError):
            return None
        if any(tuple(scores[name].shape) != tuple(shape) for name, shape in shapes.items()):
            return None
        return scores, seconds

    def store(self, key: str, scores: dict[str, Tensor], seconds: float) -> None:
        """Write an entry whole (another process sees it complete or not at all); never raises for the disk."""
        path = self._path(key)
        temporary = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npz")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            np.savez_compressed(temporary, **{name: score.detach().cpu().numpy() for name, score in scores.items()},
                                **{_SECONDS: np.float64(seconds)})
            os.replace(temporary, path)
        except OSError:
            with contextlib.suppress(OSError):
                temporary.unlink()

    @contextlib.contextmanager
    def computing(self, key: str) -> Iterator[None]:
        """Hold the entry's lock while computing it: a second process waits here, then finds the entry. Where
        there is no lock (no fcntl, an unwritable directory), or its holder is stopped or still computing after
        :data:`WAIT_SECONDS`, both compute, and the later write wins (the same scores)."""
        path = self._path(key).with_suffix(".lock")
        try:
            import fcntl

            path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(path, "a")
        except (ImportError, OSError):
            yield
            return
        with handle:
            wait = LockWait(f"pruning scores {key[:12]} that another process computes", WAIT_SECONDS)
            while True:
                with contextlib.suppress(BlockingIOError):
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                holders = lock_holders(path)
                if any(is_stopped(pid) for pid in holders) or not wait.pause(lambda: lock_holders(path)):
                    print(f"edps-mlflow: computing pruning scores {key[:12]} here too: {describe_holders(holders)} "
                          f"holds their lock {path}", file=sys.stderr, flush=True)
                    break
            yield  # the lock ends with the file
