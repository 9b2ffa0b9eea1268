"""Plain records of what was measured, and the two rules every part of the project shares.

Nothing here imports torch or MLflow: the engine produces these records, the tracking layer stores
them, the registry reads them back, and the sweep reports them.

The rules, each written once:
- :func:`training_limit`: under exact early stopping no trial trains past the best reached step
  minus one check interval, since it could then only tie or lose;
- :func:`best_reached_step`: a study's steps-to-result is the minimum over its reached trials;
- :func:`trial_steps_lower_bound`: the fewest trial-steps any exact method could have spent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable

from edps_mlflow.config import TrialSpec


class TrialStatus(str, Enum):
    """How a trial ended."""

    REACHED = "reached"
    NOT_REACHED = "not_reached"  # trained to the step cap without reaching the goal
    DIVERGED = "diverged"  # a non-finite training loss
    SUPERSEDED = "superseded"  # stopped at the best reached step of its study (exact early stopping)


class RunState(str, Enum):
    """The life-cycle state of a run in the store, as the registry reports it."""

    RUNNING = "RUNNING"
    SCHEDULED = "SCHEDULED"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    KILLED = "KILLED"

    @property
    def is_finished(self) -> bool:
        return self is RunState.FINISHED


class ScoreSource(str, Enum):
    """Where a trial's pruning scores came from."""

    NONE = "none"  # nothing pruned (sparsity 0): no scores at all
    COMPUTED = "computed"  # scored in this trial's process
    CACHED = "cached"  # kept from an earlier computation for the same data, method and initialisation


@dataclass(frozen=True)
class PruningRecord:
    """How one trial was pruned at initialisation: the method, what it may prune, where its scores came from,
    the seconds this trial spent on them (computing; or waiting for and loading them), and for cached scores
    the seconds their computation took less those: the time the cache saved this trial."""

    method: str
    prunes: str
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

    @property
    def seconds_per_step(self) -> float | None:
        """Measured training seconds per step (None: it trained no step)."""
        return self.train_seconds / self.steps_trained if self.steps_trained > 0 else None

    @classmethod
    def superseded_before_start(cls, index: int) -> "TrialResult":
        """A trial the study's best step had already ruled out before it was prepared."""
        return cls(index, TrialStatus.SUPERSEDED, None, 0, None, 0, 0, 0.0)


@dataclass(frozen=True)
class TrialRecord:
    """A trial of a study as the study records it: trained here, or reused from the store."""

    trial: TrialSpec
    status: TrialStatus
    steps_to_result: int | None
    steps_trained: int
    best_validation_error: float | None
    run_id: str
    reused: bool
    seconds: float = 0.0
    probe_seconds: float = 0.0
    # Its measured training seconds per step, the trials that shared those steps (TrialResult) and the device
    # they were measured on; None when unknown (no step trained, or reused from a run that did not record them).
    seconds_per_step: float | None = None
    pack_size: float | None = None
    device: str | None = None


@dataclass(frozen=True)
class ProbedTrials:
    """Which trials of a study carried its probes (``mode``: ``all`` or ``best``, as ProbeTrials), and
    the run that holds the probes along the best trial's whole run (None when no trial reached the goal)."""

    mode: str
    best_trial_index: int | None
    best_probe_run_id: str | None
    reused: bool = False  # the best trial's probed run came from the store (an earlier study measured it)
    seconds: float = 0.0  # training and probing the best trial again
    probe_seconds: float = 0.0  # of which in the probes

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
    """One trial of a finished study as readers need it (the bootstrap, the adaptive sweep)."""

    trial_index: int
    status: TrialStatus
    steps_to_result: int | None
    steps_trained: int


# A study run's trials in one line (tag edps.trial_outcomes), so that readers need not download its
# trials.csv: ``v1 0:r140@120 1:s120 2:n5000``, each trial's index, status (its letter), steps trained and,
# when it reached the goal, its steps-to-result. The leading version lets the format change later.
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


# One trial of the format, and a whole text of it (checked whole before its trials are read, so that a text
# in another format is refused, never half-read).
_OUTCOME = rf"([0-9]+):([{''.join(_LETTER_STATUSES)}])([0-9]+)(?:@([0-9]+))?"
_OUTCOMES_TEXT = re.compile(rf"{TRIAL_OUTCOMES_FORMAT}(?: {_OUTCOME})*")
_OUTCOME_PARTS = re.compile(_OUTCOME)


def trial_outcome_texts(text: str | None) -> list[tuple[str, str, str, str]] | None:
    """Each trial of :func:`encode_trial_outcomes` as the text of its fields: (index, status letter, steps
    trained, steps-to-result or ""), for a reader that converts many studies' trials at once. None when
    ``text`` is absent or not in that format."""
    if not text or not _OUTCOMES_TEXT.fullmatch(text):
        return None
    return _OUTCOME_PARTS.findall(text)


def status_of_letter(letter: str) -> TrialStatus:
    """The status that :func:`encode_trial_outcomes` writes as ``letter``."""
    return _LETTER_STATUSES[letter]


def trial_outcome_fields(text: str | None) -> list[tuple[int, str, int | None, int]] | None:
    """Each trial of :func:`encode_trial_outcomes` as (index, status value, steps-to-result or None, steps
    trained), converted one trial at a time (a reader of thousands of studies converts
    :func:`trial_outcome_texts` a column at a time instead). None when ``text`` is absent or not in that
    format."""
    texts = trial_outcome_texts(text)
    if texts is None:
        return None
    return [(int(index), _LETTER_STATUSES[letter].value, int(reached) if reached else None, int(trained))
            for index, letter, trained, reached in texts]


def decode_trial_outcomes(text: str | None) -> list[TrialOutcome] | None:
    """The trials of :func:`encode_trial_outcomes`; None when ``text`` is absent or not in that format
    (the reader then falls back to the study's trials.csv)."""
    fields = trial_outcome_fields(text)
    if fields is None:
        return None
    return [TrialOutcome(index, TrialStatus(status), reached, trained) for index, status, reached, trained in fields]


@dataclass(frozen=True)
class StudyReport:
    """One study of a sweep, as an executor reports it back to the sweep."""

    study_key: str
    steps_to_result: int | None
    trials: int
    trained: int
    seconds: float
    skipped: bool  # already done in the store: nothing was trained


def best_reached_step(outcomes: Iterable[tuple[TrialStatus, int | None]]) -> int | None:
    """A study's steps-to-result: the fewest steps over its reached trials (None: none reached)."""
    steps = [s for status, s in outcomes if status is TrialStatus.REACHED and s is not None]
    return min(steps) if steps else None


def training_limit(max_steps: int, check_interval: int, best_step: int | None, exact_early_stopping: bool = True) -> int:
    """The last step any trial of a study still needs to train to.

    Without a reached trial (or with full trials), the step cap. Otherwise the best reached step
    minus one check interval: a trial that has not reached the goal by then could only tie or lose.
    """
    if not exact_early_stopping or best_step is None:
        return max_steps
    return min(max_steps, best_step - check_interval)


def first_check_from(step: int, max_steps: int, check_interval: int) -> int:
    """The first check step at or after ``step`` (checks: every ``check_interval`` steps and at the cap)."""
    if step <= 0:
        return 0
    return min(max_steps, -(-step // check_interval) * check_interval)


def trial_steps_lower_bound(records: dict[int, TrialRecord]) -> int:
    """The fewest trial-steps in which any exact method could have trained the study's trained (not reused)
    trials, given what they showed.

    Every trial must train until it reaches the goal, fails (diverges or hits the cap), or passes the best
    step minus one check interval (the first check from there); the best trial must train to the best step
    itself. A superseded trial had not ended before the first check from that limit.
    """
    if not records:
        return 0
    spec = next(iter(records.values())).trial.study
    best = best_reached_step((r.status, r.steps_to_result) for r in records.values())
    stop = first_check_from(training_limit(spec.max_steps, spec.check_interval, best), spec.max_steps,
                            spec.check_interval)
    reached = [r for r in records.values() if r.status is TrialStatus.REACHED]
    best_index = min(reached, key=lambda r: (r.steps_to_result, r.trial.index)).trial.index if reached else None
    total = 0
    for index, record in records.items():
        if record.reused:
            continue
        if index == best_index:
            total += record.steps_trained
        elif record.status is TrialStatus.SUPERSEDED:
            total += stop
        else:
            total += min(record.steps_trained, stop)
    return total
