"""Fencing tokens: what a process wrote after its run was taken over (it stalled past its lease) counts nowhere
(docs/reliability.md, "Fencing"); MLflow has no conditional write, so such a write may land. A study run's token
is its epoch, and the current epoch of a key is the largest among its *planned* runs (those that logged their
start, after they adopted the trials they reuse); a sweep run's is its owner token, under which its owner
records its end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping

from edps_mlflow import names as n
from edps_mlflow.results import RunState

if TYPE_CHECKING:
    from edps_mlflow.store.read.runs import LeasedRun


def epoch_of(tags: Mapping[str, str]) -> int:
    """A study run's epoch (0: made before epochs)."""
    text = tags.get(n.TAG_EPOCH, "")
    return int(text) if text.isdigit() else 0


def trial_epochs(tags: Mapping[str, str]) -> list[tuple[int, str]]:
    """A trial run's (epoch, study key) pairs: its study run's and those of the runs that reused it; a trial run
    made before epochs has its study key's epoch 0."""
    found = [(int(name[len(n.TAG_EPOCH_PREFIX):]), key) for name, key in tags.items()
             if name.startswith(n.TAG_EPOCH_PREFIX) and name[len(n.TAG_EPOCH_PREFIX):].isdigit()]
    return found or [(0, tags.get(n.TAG_STUDY_KEY, ""))]


def next_epoch(runs: Iterable[LeasedRun]) -> int:
    """The epoch of a new study run of the key of ``runs`` (every run of it, planned or not, given way or not)."""
    return 1 + max((run.epoch for run in runs), default=0)


@dataclass(frozen=True)
class Fence:
    """The current epochs of study keys (``keys``) and of study keys in an early-stopping mode (``modes``)."""

    keys: Mapping[str, int]
    modes: Mapping[tuple[str, bool], int]

    @classmethod
    def of(cls, runs: Iterable[LeasedRun]) -> Fence:
        """From study runs: those of every key whose runs (or trial runs) are to be told apart."""
        keys: dict[str, int] = {}
        modes: dict[tuple[str, bool], int] = {}
        for run in runs:
            if run.kind == n.KIND_STUDY and run.planned:
                keys[run.key] = max(keys.get(run.key, 0), run.epoch)
                modes[(run.key, run.full_trials)] = max(modes.get((run.key, run.full_trials), 0), run.epoch)
        return cls(keys, modes)

    def counts(self, run: LeasedRun) -> bool:
        """Whether a study run is a finished study: FINISHED, and not by a process whose run was taken over."""
        return run.state is RunState.FINISHED and run.epoch >= self.modes.get((run.key, run.full_trials), 0)

    def counts_trial(self, epochs: Iterable[tuple[int, str]]) -> bool:
        """Whether a FINISHED trial run (its :func:`trial_epochs`) is a measurement: not one finished by a process
        that had lost its study."""
        return any(epoch >= self.keys.get(key, 0) for epoch, key in epochs)


# ---- a sweep run's ends, one per owner token -----------------------------------------------------------
def end_tags(token: str, status: str, end_time: int) -> dict[str, str]:
    return {n.TAG_END_PREFIX + token: f"{status} {end_time}"}


def owner_end(tags: Mapping[str, str]) -> tuple[str, int] | None:
    """(status, end time in ms) that the run's current owner (its token) recorded; None when it recorded none."""
    words = tags.get(n.TAG_END_PREFIX + tags.get(n.TAG_LEASE_OWNER, ""), "").split()
    return (words[0], int(words[1])) if len(words) == 2 and words[1].isdigit() else None
