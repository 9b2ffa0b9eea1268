"""Plain records of what was measured (the engine makes them, the tracking layer stores them, the store's readers
reads them back), and the rules of a study's result, each written once: :func:`best_reached_step`,
:func:`training_limit` and :func:`trial_steps_lower_bound`. No torch, no MLflow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterable, Sequence

import numpy as np

from edps_mlflow.config import TrialSpec


class TrialStatus(str, Enum):
    """How a trial ended."""

    REACHED = "reached"
    NOT_REACHED = "not_reached"  # trained to the step cap without reaching the goal
    DIVERGED = "diverged"  # a non-finite training loss
    SUPERSEDED = "superseded"  # stopped at the best reached step of its study (exact early stopping)


class RunState(str, Enum):
    """The life-cycle state of a run in the store, as the store's readers report it."""

    RUNNING = "RUNNING"
    SCHEDULED = "SCHEDULED"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    KILLED = "KILLED"


class ScoreSource(str, Enum):
    """Where a trial's pruning scores came from."""

    NONE = "none"  # nothing pruned (sparsity 0): no scores at all
    COMPUTED = "computed"  # scored in this trial's process
    CACHED = "cached"  # kept from an earlier computation for the same data, method and initialisation


@dataclass(frozen=True)
class PruningRecord:
    """What one trial's pruning scores cost: where they came from, ``seconds`` spent on them here (computing, or
    waiting for and loading them), ``seconds_saved``: for cached scores, what computing them took less that."""

    source: ScoreSource
    seconds: float = 0.0
    seconds_saved: float = 0.0


def pruning_summary(records: Iterable[PruningRecord]) -> dict[str, object]:
    """What a study spent on pruning scores and what the cache saved it (``study.json``'s ``pruning.scores``)."""
    records = list(records)
    counts = {source.value: sum(1 for r in records if r.source is source) for source in ScoreSource}
    return {**counts, "seconds": round(sum(r.seconds for r in records), 3),
            "seconds_saved": round(sum(r.seconds_saved for r in records if r.source is ScoreSource.CACHED), 3)}


@dataclass(frozen=True)
class Check:
    """One validation check of one trial."""

    step: int
    train_loss: float  # mean over the steps since the previous check
    validation_error: float | None  # None when the pass was cut short by early abort
    learning_rate: float


@dataclass(frozen=True)
class TrialResult:
    """What the engine reports when a trial ends."""

    index: int
    status: TrialStatus
    steps_to_result: int | None
    steps_trained: int
    best_validation_error: float | None
    checks: int
    checks_cut_short: int
    seconds: float
    probe_seconds: float = 0.0
    # Seconds of the training steps alone (no checks, evaluation or probes). A packed trial's share: each
    # lockstep step's seconds divided by the trials in it; pack_size is that count, averaged over its steps.
    train_seconds: float = 0.0
    pack_size: float = 1.0
    # The first check at or below each goal of the study's ladder (None: not met), easiest first; the last is
    # steps_to_result.
    goal_steps: tuple[int | None, ...] = ()

    @property
    def seconds_per_step(self) -> float | None:
        return self.train_seconds / self.steps_trained if self.steps_trained > 0 else None

    @classmethod
    def superseded_before_start(cls, index: int, goals: int) -> "TrialResult":
        """A trial the study's best step had already ruled out before it was prepared."""
        return cls(index, TrialStatus.SUPERSEDED, None, 0, None, 0, 0, 0.0, goal_steps=(None,) * goals)


@dataclass(frozen=True)
class TrialRecord:
    """A trial of a study: trained here, or reused from the store."""

    trial: TrialSpec
    status: TrialStatus
    steps_to_result: int | None
    steps_trained: int
    best_validation_error: float | None
    run_id: str
    reused: bool
    seconds: float = 0.0
    probe_seconds: float = 0.0
    # As TrialResult measured them, and the device; None when unknown (no step trained, or an older run).
    seconds_per_step: float | None = None
    pack_size: float | None = None
    device: str | None = None
    goal_steps: tuple[int | None, ...] = ()  # at each goal of a ladder (TrialResult.goal_steps); () if unknown


@dataclass(frozen=True)
class ProbedTrials:
    """Which trials carried the probes (``mode``: ``all`` or ``best``) and the run that holds them along the
    best trial's whole run (None when no trial reached the goal)."""

    mode: str
    best_trial_index: int | None
    best_probe_run_id: str | None
    reused: bool = False  # an earlier study's probed run
    probe_seconds: float = 0.0  # in the probes of the best trial's run trained again

    def sentence(self) -> str:
        if self.best_probe_run_id is None:
            return "No trial reached the goal, so no trial's run was probed."
        which = "every trial probed along its whole run" if self.mode == "all" else \
            f"the best trial (trial {self.best_trial_index}) was trained again with the probes, to its goal"
        return f"Probes: {which}; the best trial's probed run is {self.best_probe_run_id}" + \
            (" (reused from an earlier study)." if self.reused else ".")


@dataclass(frozen=True)
class StudyOutcome:
    """A finished study: its result and every trial's record."""

    study_run_id: str
    experiment_id: str
    steps_to_result: int | None
    records: dict[int, TrialRecord] = field(repr=False)
    trained: int
    reused: int
    trial_steps: int
    seconds: float

    def count(self, status: TrialStatus) -> int:
        return sum(1 for r in self.records.values() if r.status is status)

    def best_record(self) -> TrialRecord | None:
        """The reached trial with the fewest steps (the lowest index among ties)."""
        reached = [r for r in self.records.values() if r.status is TrialStatus.REACHED]
        return min(reached, key=lambda r: (r.steps_to_result, r.trial.index)) if reached else None

    @classmethod
    def from_records(cls, records: dict[int, TrialRecord], study_run_id: str, experiment_id: str,
                     seconds: float) -> "StudyOutcome":
        return cls(
            study_run_id=study_run_id, experiment_id=experiment_id,
            steps_to_result=best_reached_step((r.status, r.steps_to_result) for r in records.values()),
            records=dict(sorted(records.items())), trained=sum(1 for r in records.values() if not r.reused),
            reused=sum(1 for r in records.values() if r.reused),
            trial_steps=sum(r.steps_trained for r in records.values() if not r.reused), seconds=seconds)


@dataclass(frozen=True)
class TrialOutcome:
    """One trial of a finished study, as readers need it."""

    trial_index: int
    status: TrialStatus
    steps_to_result: int | None
    steps_trained: int


# A study run's trials in one tag (edps.trial_outcomes), so that readers need not download its trials.csv:
# ``v1 0:r140@120 1:s120 2:n5000``: index, status letter, steps trained and, if reached, steps-to-result.
TRIAL_OUTCOMES_FORMAT = "v1"
_STATUS_LETTERS = {TrialStatus.REACHED: "r", TrialStatus.NOT_REACHED: "n", TrialStatus.DIVERGED: "d",
                   TrialStatus.SUPERSEDED: "s"}
_LETTER_STATUSES = {letter: status for status, letter in _STATUS_LETTERS.items()}


def encode_trial_outcomes(outcomes: Iterable[TrialOutcome]) -> str:
    parts = [TRIAL_OUTCOMES_FORMAT]
    for outcome in sorted(outcomes, key=lambda o: o.trial_index):
        reached = f"@{outcome.steps_to_result}" if outcome.steps_to_result is not None else ""
        parts.append(f"{outcome.trial_index}:{_STATUS_LETTERS[outcome.status]}{outcome.steps_trained}{reached}")
    return " ".join(parts)


# A text is checked whole before its trials are read, so that one in another format is refused, never
# half-read. An index has at most 18 digits (a 64-bit integer holds them), a step count at most 15 (the columns
# hold steps as floats, exact below 2**53); no trial's numbers are longer.
_INDEX, _STEPS = "[0-9]{1,18}", "[0-9]{1,15}"
_OUTCOME = rf"({_INDEX}):([{''.join(_LETTER_STATUSES)}])({_STEPS})(?:@({_STEPS}))?"
_OUTCOMES_TEXT = re.compile(rf"{TRIAL_OUTCOMES_FORMAT}(?: {_OUTCOME})*")
_OUTCOME_PARTS = re.compile(_OUTCOME)


def _is_outcomes_text(text: str | None) -> bool:
    return bool(text) and _OUTCOMES_TEXT.fullmatch(text) is not None


@dataclass(frozen=True)
class TrialOutcomeColumns:
    """The trials of many texts of :func:`encode_trial_outcomes` as numpy columns: per text whether it is
    ``readable`` and its trial count (0 if not); per trial its index, status (a code into ``statuses``), steps
    trained and steps-to-result (NaN: not reached)."""

    readable: Any
    counts: Any
    trial_index: Any
    status_codes: Any
    statuses: tuple[TrialStatus, ...]
    steps_trained: Any
    steps_to_result: Any


_CODE_LETTERS = tuple(sorted(_LETTER_STATUSES))  # a status's code is its letter's place here
_SEPARATORS = bytes.maketrans(b":@" + "".join(_CODE_LETTERS).encode("ascii"), b" " * (2 + len(_CODE_LETTERS)))


def trial_outcome_columns(texts: Sequence[str | None]) -> TrialOutcomeColumns:
    """The trials of ``texts`` converted all at once, not a trial at a time: the analysis reads 150,000 of
    them. Every trial has one letter and at most one ``@``: with those and ``:`` made spaces, the joined texts
    are one string of numbers, two per trial and a third after each ``@``."""
    readable = np.array([_is_outcomes_text(text) for text in texts], dtype=bool)
    texts = [text for text, ok in zip(texts, readable) if ok]
    start = len(TRIAL_OUTCOMES_FORMAT)
    counts = np.zeros(len(readable), dtype=np.int64)
    counts[readable] = [text.count(":") for text in texts]
    joined = " ".join(text[start:] for text in texts).encode("ascii")
    raw = np.frombuffer(joined, dtype=np.uint8)
    letters = np.flatnonzero(raw >= ord("a"))  # digits, ":", "@" and spaces are all below "a"
    reached = np.searchsorted(letters, np.flatnonzero(raw == ord("@"))) - 1  # the trial of each "@"
    numbers_per_trial = np.full(len(letters), 2, dtype=np.int64)
    numbers_per_trial[reached] = 3
    first = np.cumsum(numbers_per_trial) - numbers_per_trial
    numbers = (np.fromstring(joined.translate(_SEPARATORS).decode("ascii"), dtype=np.int64, sep=" ")
               if len(letters) else np.zeros(0, dtype=np.int64))  # every number fits (_INDEX, _STEPS)
    steps_to_result = np.full(len(letters), np.nan)
    steps_to_result[reached] = numbers[first[reached] + 2]
    return TrialOutcomeColumns(readable=readable, counts=counts, trial_index=numbers[first].astype(np.int64),
                               status_codes=np.searchsorted(np.frombuffer("".join(_CODE_LETTERS).encode(), np.uint8),
                                                            raw[letters]).astype(np.int8),
                               statuses=tuple(_LETTER_STATUSES[letter] for letter in _CODE_LETTERS),
                               steps_trained=numbers[first + 1].astype(float), steps_to_result=steps_to_result)


def trial_outcome_fields(text: str | None) -> list[tuple[int, str, int | None, int]] | None:
    """Each trial of ``text`` as (index, status value, steps-to-result or None, steps trained); None when
    ``text`` is absent or not wholly in the format."""
    if not _is_outcomes_text(text):
        return None
    return [(int(index), _LETTER_STATUSES[letter].value, int(reached) if reached else None, int(trained))
            for index, letter, trained, reached in _OUTCOME_PARTS.findall(text)]


def decode_trial_outcomes(text: str | None) -> list[TrialOutcome] | None:
    """The trials of :func:`encode_trial_outcomes`; None when ``text`` is absent or in another format (the
    reader then falls back to the study's trials.csv)."""
    fields = trial_outcome_fields(text)
    if fields is None:
        return None
    return [TrialOutcome(index, TrialStatus(status), reached, trained) for index, status, reached, trained in fields]


@dataclass(frozen=True)
class StudyReport:
    """One study of a sweep, as an executor reports it back to the sweep."""

    study_key: str
    steps_to_result: int | None
    skipped: bool  # already done in the store: nothing was trained


def best_reached_step(outcomes: Iterable[tuple[TrialStatus, int | None]]) -> int | None:
    """A study's steps-to-result: the fewest steps over its reached trials (None: none reached)."""
    steps = [s for status, s in outcomes if status is TrialStatus.REACHED and s is not None]
    return min(steps) if steps else None


def training_limit(max_steps: int, check_interval: int, best_step: int | None, exact_early_stopping: bool = True) -> int:
    """The last step any trial of a study still needs to train to: the best reached step minus one check
    interval (a trial that has not reached the goal by then could only tie or lose); without a reached trial
    (or with full trials), the step cap."""
    if not exact_early_stopping or best_step is None:
        return max_steps
    return min(max_steps, best_step - check_interval)


def trial_steps_lower_bound(records: dict[int, TrialRecord]) -> int:
    """The fewest trial-steps in which any exact method could have trained the study's trained (not reused)
    trials: each until it reaches the goal, fails, or reaches the first check from the training limit (where
    a superseded trial stopped); the best trial to the best step itself."""
    if not records:
        return 0
    spec = next(iter(records.values())).trial.study
    best = best_reached_step((r.status, r.steps_to_result) for r in records.values())
    limit = training_limit(spec.max_steps, spec.check_interval, best)
    # The first check at or after the limit (checks: every check interval and at the cap).
    stop = min(spec.max_steps, -(-limit // spec.check_interval) * spec.check_interval) if limit > 0 else 0
    reached = [r for r in records.values() if r.status is TrialStatus.REACHED]
    best_index = min(reached, key=lambda r: (r.steps_to_result, r.trial.index)).trial.index if reached else None
    return sum(r.steps_trained if i == best_index else stop if r.status is TrialStatus.SUPERSEDED
               else min(r.steps_trained, stop) for i, r in records.items() if not r.reused)
