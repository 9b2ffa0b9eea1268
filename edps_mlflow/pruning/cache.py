"""Score once, prune anywhere: pruning scores kept on disk, keyed by what they depend on.

A trial's initialisation depends only on the study seed and the trial index (its init seed), so its scores
(SNIP's pass over the training split, GraSP's Hessian-vector product, SynFlow's 100 rounds) are the same at
every batch size and optimizer of a grid, and SNIP's and GraSP's at every sparsity too: only the top-k cut
changes. The key of an entry is the sha256 of

    the workload (its network and loss), the data fingerprint, the method that scores, the init seed,
    the network's parameter names and shapes, the results version, and the sparsity for a method whose
    scores depend on it (SynFlow: its schedule ends at the sparsity),

so an entry is found again only for exactly the computation that made it. The entry holds the scores as
float32 arrays (``.npz``, no pickle) and the seconds they took, so that a trial that loads them can say
what the cache saved it.

Where: ``$EDPS_SCORE_CACHE`` (a directory, or ``off``), else ``$XDG_CACHE_HOME/edps-mlflow/pruning-scores``
(``~/.cache/...``). Every process of a machine shares it: a study's trial workers, a sweep's study processes,
the runs of the mlflow-project executor; a Ray cluster or Kubernetes jobs on other machines each keep their
own (each computes a trial's scores once per machine). Entries are written whole (a temporary file moved
into place) and a process that finds another computing an entry waits for it (a lock file per entry, where
the platform has ``fcntl``) rather than computing it twice. An unreadable or mismatched entry is computed
again; an unwritable directory costs the computation, nothing else.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import zipfile
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch import Tensor

from edps_mlflow.config import RESULTS_VERSION

ENVIRONMENT = "EDPS_SCORE_CACHE"
OFF = "off"
_SCHEME = "edps-pruning-scores-v1"
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
        """Hold the entry's lock while computing it: a second process waits here, then finds the entry."""
        try:
            import fcntl
        except ImportError:  # no POSIX locks here: both compute, the later write wins, the result is the same
            yield
            return
        path = self._path(key).with_suffix(".lock")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(path, "a")
        except OSError:
            yield
            return
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

