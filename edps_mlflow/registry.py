"""MLflow reads for training: finished trials by key (reuse), neighbouring studies (trial order),
study and sweep runs (the sweep's plan), and the grid that ``edps status`` shows.

It reads through the store client (store.py); only the store, the writers (tracking.py, sweep_run.py,
ownership.py), this module and mlproject.py import mlflow on the training side. What it returns is plain
records with enums and booleans, never MLflow's own entities or status strings. It imports no torch.
"""

from __future__ import annotations

import csv
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from mlflow.entities import Run
from mlflow.exceptions import MlflowException

from edps_mlflow.config import StudySpec, study_family
from edps_mlflow.curves import CurveId
from edps_mlflow.errors import EdpsError
from edps_mlflow.filters import filter_string
from edps_mlflow.names import (
    ARTIFACT_TRIALS_CSV,
    KIND_STUDY,
    KIND_SWEEP,
    KIND_TRIAL,
    METRIC_BEST_VALIDATION_ERROR,
    METRIC_PACK_SIZE,
    METRIC_SECONDS_PER_STEP,
    METRIC_STEPS_TO_RESULT,
    METRIC_STEPS_TRAINED,
    METRIC_STUDIES_DONE,
    MLFLOW_PARENT_RUN_ID,
    PARAM_BEST_PREFIX,
    PARAM_DEVICE,
    PARAM_SPEC_TRIALS,
    STOPPING_FULL_TRIALS,
    TAG_BATCH_SIZE,
    TAG_ERROR,
    TAG_HEARTBEAT,
    TAG_KIND,
    TAG_LEASE_OWNER,
    TAG_STATUS,
    TAG_STOPPING,
    TAG_STUDY_FAMILY,
    TAG_STUDY_KEY,
    TAG_SWEEP_KEY,
    TAG_TRIAL_KEY,
    TAG_VERSION,
    TAG_WORKLOAD,
    TAG_YIELDED_TO,
)
from edps_mlflow.results import RunState, TrialStatus
from edps_mlflow.store import StoreClient, open_store, resolve_tracking_uri, search_all, store_error
from edps_mlflow.uris import redact_uri, require_existing_store


@dataclass(frozen=True)
class StoredTrial:
    """A finished trial found in the store."""

    run_id: str
    trial_key: str
    status: TrialStatus
    steps_to_result: int | None
    steps_trained: int
    best_validation_error: float | None
    # How fast it trained, where (None: a run from before these were recorded, or one that trained no step).
    seconds_per_step: float | None = None
    pack_size: float | None = None
    device: str | None = None


def finished_trials(client: StoreClient, experiment_id: str, spec: StudySpec) -> dict[str, StoredTrial]:
    """trial_key -> the latest finished trial run with that key, from any study of the same family."""
    runs = search_all(
        client, experiment_id,
        filter_string(tags={TAG_KIND: KIND_TRIAL, TAG_STUDY_FAMILY: study_family(spec)},
                      status=RunState.FINISHED.value),
    )
    found: dict[str, StoredTrial] = {}
    for run in sorted(runs, key=lambda r: r.info.start_time or 0):
        tags, metrics = run.data.tags, run.data.metrics
        key = tags.get(TAG_TRIAL_KEY)
        status_name = tags.get(TAG_STATUS)
        if key is None or status_name is None:
            continue  # later runs replace earlier ones: the latest measurement of a key wins
        steps = metrics.get(METRIC_STEPS_TO_RESULT)
        found[key] = StoredTrial(
            run_id=run.info.run_id, trial_key=key, status=TrialStatus(status_name),
            steps_to_result=int(steps) if steps is not None else None,
            steps_trained=int(metrics.get(METRIC_STEPS_TRAINED, 0)),
            best_validation_error=metrics.get(METRIC_BEST_VALIDATION_ERROR),
            seconds_per_step=metrics.get(METRIC_SECONDS_PER_STEP), pack_size=metrics.get(METRIC_PACK_SIZE),
            device=run.data.params.get(PARAM_DEVICE),
        )
    return found


def neighbour_best_point(client: StoreClient, experiment_id: str,
                         spec: StudySpec) -> tuple[int, dict[str, float]] | None:
    """(batch size, best metaparameters) of the finished study on the same curve (curves.CurveId) at the
    nearest batch size, if any.

    Used only to order trials (promising ones first); it changes the cost, never the result.
    """
    curve = CurveId.of(spec)
    runs = search_all(
        client, experiment_id,
        filter_string(tags={TAG_KIND: KIND_STUDY, **curve.search_tags()}, status=RunState.FINISHED.value),
    )
    candidates = []
    for run in runs:
        if METRIC_STEPS_TO_RESULT not in run.data.metrics:
            continue
        try:
            batch_size = int(run.data.tags[TAG_BATCH_SIZE])
            if CurveId.from_tags(run.data.tags) != curve:
                continue
        except (KeyError, ValueError):
            continue
        point = {k[len(PARAM_BEST_PREFIX):]: float(v) for k, v in run.data.params.items()
                 if k.startswith(PARAM_BEST_PREFIX)}
        if point and batch_size > 0:
            candidates.append((abs(math.log2(batch_size) - math.log2(spec.batch_size)), batch_size, point))
    if not candidates:
        return None
    _, batch_size, point = min(candidates, key=lambda c: (c[0], c[1]))
    return batch_size, point


@dataclass(frozen=True)
class StoredStudy:
    run_id: str
    study_key: str
    state: RunState
    parent_run_id: str | None
    steps_to_result: int | None
    full_trials: bool  # measured with every trial run to its own end

    @property
    def finished(self) -> bool:
        return self.state.is_finished


def study_runs(client: StoreClient, experiment_id: str, workload: str) -> list[StoredStudy]:
    """Every study run of a workload in the experiment (one paged search)."""
    runs = search_all(client, experiment_id,
                       filter_string(tags={TAG_KIND: KIND_STUDY, TAG_WORKLOAD: workload}))
    stored = []
    for run in runs:
        steps = run.data.metrics.get(METRIC_STEPS_TO_RESULT)
        stored.append(StoredStudy(
            run_id=run.info.run_id, study_key=run.data.tags.get(TAG_STUDY_KEY, ""), state=RunState(run.info.status),
            parent_run_id=run.data.tags.get(MLFLOW_PARENT_RUN_ID),
            steps_to_result=int(steps) if steps is not None else None,
            full_trials=run.data.tags.get(TAG_STOPPING) == STOPPING_FULL_TRIALS))
    return stored


def finished_trial_counts(client: StoreClient, experiment_id: str, workload: str) -> dict[str, int]:
    """study_key -> number of FINISHED trial runs logged for it (for the sweep's plan)."""
    runs = search_all(client, experiment_id,
                       filter_string(tags={TAG_KIND: KIND_TRIAL, TAG_WORKLOAD: workload}, status=RunState.FINISHED.value))
    counts: dict[str, int] = {}
    for run in runs:
        key = run.data.tags.get(TAG_STUDY_KEY)
        if key:
            counts[key] = counts.get(key, 0) + 1
    return counts


def sweep_run_id(client: StoreClient, experiment_id: str, sweep_key: str) -> str | None:
    runs = search_all(client, experiment_id,
                       filter_string(tags={TAG_KIND: KIND_SWEEP, TAG_SWEEP_KEY: sweep_key}))
    return min(runs, key=lambda r: r.info.start_time or 0).info.run_id if runs else None


@dataclass(frozen=True)
class LeasedRun:
    """A study or sweep run with its lease: RUNNING and renewed within the lease means a live owner."""

    run_id: str
    kind: str | None
    key: str
    state: RunState
    start_time: int  # ms
    renewed: float  # unix seconds of the last heartbeat (the start time when there is none)
    parent_run_id: str | None
    owner: str | None
    steps_to_result: int | None
    full_trials: bool

    def live(self, lease: float, now: float | None = None) -> bool:
        return self.state is RunState.RUNNING and (now or time.time()) - self.renewed < lease

    @property
    def order(self) -> tuple[int, str]:
        """Which of two runs of one key came first (the earlier one is kept)."""
        return (self.start_time, self.run_id)


def _leased(run: Run) -> LeasedRun:
    tags = run.data.tags
    try:
        renewed = float(tags[TAG_HEARTBEAT])
    except (KeyError, ValueError):
        renewed = (run.info.start_time or 0) / 1000
    steps = run.data.metrics.get(METRIC_STEPS_TO_RESULT)
    kind = tags.get(TAG_KIND)
    return LeasedRun(
        run_id=run.info.run_id, kind=kind, key=tags.get(TAG_SWEEP_KEY if kind == KIND_SWEEP else TAG_STUDY_KEY, ""),
        state=RunState(run.info.status), start_time=run.info.start_time or 0, renewed=renewed,
        parent_run_id=tags.get(MLFLOW_PARENT_RUN_ID), owner=tags.get(TAG_LEASE_OWNER),
        steps_to_result=int(steps) if steps is not None else None,
        full_trials=tags.get(TAG_STOPPING) == STOPPING_FULL_TRIALS)


def keyed_runs(client: StoreClient, experiment_id: str, kind: str, key: str) -> list[LeasedRun]:
    """Every study (or sweep) run with ``key``, earliest first."""
    key_tag = TAG_SWEEP_KEY if kind == KIND_SWEEP else TAG_STUDY_KEY
    runs = search_all(client, experiment_id, filter_string(tags={TAG_KIND: kind, key_tag: key}))
    return sorted((_leased(r) for r in runs), key=lambda r: r.order)


def get_leased(client: StoreClient, run_id: str) -> LeasedRun:
    return _leased(client.get_run(run_id))


def latest_finished_study(client: StoreClient, experiment_id: str, study_key: str,
                          full_trials: bool) -> LeasedRun | None:
    """The latest FINISHED study run of the key in the same early-stopping mode (None: not done)."""
    done = [r for r in keyed_runs(client, experiment_id, KIND_STUDY, study_key)
            if r.state.is_finished and r.full_trials == full_trials]
    return done[-1] if done else None


@dataclass(frozen=True)
class TrialOutcome:
    """One trial of a finished study as its ``trials.csv`` lists it (trained there or reused)."""

    trial_index: int
    status: TrialStatus
    steps_to_result: int | None
    steps_trained: int


def study_trial_outcomes(client: StoreClient, run_id: str) -> list[TrialOutcome]:
    """The trials of a finished study run, from its ``trials.csv`` artifact (empty when it has none)."""
    with tempfile.TemporaryDirectory(prefix="edps-trials-") as scratch:
        try:
            path = client.download_artifacts(run_id, ARTIFACT_TRIALS_CSV, dst_path=scratch)
            rows = list(csv.DictReader(Path(path).read_text().splitlines()))
        except (MlflowException, OSError):
            return []
    outcomes = []
    for row in rows:
        try:
            steps = row.get("steps_to_result") or ""
            outcomes.append(TrialOutcome(int(row["trial_index"]), TrialStatus(row["status"]),
                                         int(float(steps)) if steps else None, int(float(row["steps_trained"] or 0))))
        except (KeyError, ValueError):
            return []  # not a trials table of ours: the study gets no bootstrap
    return outcomes


def expired_runs(client: StoreClient, experiment_id: str, lease: float) -> list[LeasedRun]:
    """Runs marked RUNNING whose owner is dead: study and sweep runs whose lease ran out, and trial
    runs whose study run is not live (left behind by a killed process)."""
    running = [_leased(r) for r in search_all(client, experiment_id,
                                               filter_string(status=RunState.RUNNING.value))]
    now = time.time()
    live = {r.run_id for r in running if r.kind in (KIND_STUDY, KIND_SWEEP) and r.live(lease, now)}
    expired = []
    for run in running:
        if run.kind in (KIND_STUDY, KIND_SWEEP) and run.run_id not in live:
            expired.append(run)
        elif run.kind == KIND_TRIAL and run.parent_run_id not in live:
            expired.append(run)
    return expired


@dataclass(frozen=True)
class StudyRow:
    """One study run as ``edps status`` shows it."""

    curve: CurveId  # the curve it is a point of (read from its tags)
    batch_size: int
    study_key: str
    state: RunState
    steps_to_result: int | None
    trials: int  # the study's trial count
    finished_trials: int  # FINISHED trial runs with the study's key
    start_time: int
    live: bool = False  # RUNNING with a lease renewed in time: a process is working on it now


def experiments_with_studies(tracking_uri: str | None = None) -> list[str]:
    """Names of the active experiments that hold at least one study run."""
    uri = resolve_tracking_uri(tracking_uri)
    require_existing_store(uri)  # before the client: MLflow creates a missing sqlite store when it connects
    client = open_store(uri)
    try:
        experiments = client.search_experiments(max_results=50_000)
        return [e.name for e in experiments
                if client.search_runs([e.experiment_id], filter_string(tags={TAG_KIND: KIND_STUDY}),
                                      max_results=1)]
    except MlflowException as error:
        raise store_error(client, error) from None


def study_rows(experiment: str, lease: float, tracking_uri: str | None = None) -> list[StudyRow]:
    """Every study run of the experiment named ``experiment``, with its finished-trial count; ``lease``:
    the lease that tells a live run (ownership.lease_seconds)."""
    uri = resolve_tracking_uri(tracking_uri)
    require_existing_store(uri)  # a reader never creates a store that is not there
    client = open_store(uri)
    try:
        found = client.get_experiment_by_name(experiment)
        if found is None:
            raise EdpsError(f"no experiment named {experiment!r} in {redact_uri(str(client.tracking_uri))}")
        runs = search_all(client, found.experiment_id, filter_string(tags={TAG_KIND: KIND_STUDY}))
        counts: dict[str, int] = {}
        for workload in {r.data.tags.get(TAG_WORKLOAD) for r in runs} - {None}:
            counts.update(finished_trial_counts(client, found.experiment_id, workload))
    except MlflowException as error:
        raise store_error(client, error) from None
    rows = []
    for run in runs:
        tags, metrics, params = run.data.tags, run.data.metrics, run.data.params
        try:
            steps = metrics.get(METRIC_STEPS_TO_RESULT)
            key = tags.get(TAG_STUDY_KEY, "")
            rows.append(StudyRow(
                curve=CurveId.from_tags(tags), batch_size=int(tags[TAG_BATCH_SIZE]), study_key=key,
                state=RunState(run.info.status),
                steps_to_result=int(steps) if steps is not None else None,
                trials=int(params.get(PARAM_SPEC_TRIALS, 0)), finished_trials=counts.get(key, 0),
                start_time=run.info.start_time or 0, live=_leased(run).live(lease)))
        except (KeyError, ValueError):
            continue  # a study run refused before it logged anything
    return rows


@dataclass(frozen=True)
class RunFacts:
    """What ``edps doctor`` checks of one run of ours."""

    run_id: str
    kind: str | None
    study_key: str | None
    trial_key: str | None
    sweep_key: str | None
    state: RunState
    renewed: float
    parent_run_id: str | None
    full_trials: bool
    ours: bool  # carries a tag that only this project writes
    gave_way: bool  # a run that yielded to an earlier live run of its key
    end_time: int | None = None  # ms; None while RUNNING
    marked_dead: bool = False  # carries the reason a process wrote when it marked the run FAILED (edps.error)
    summarised: bool = False  # a sweep run that logged its end-of-sweep summary (studies/done)


def experiments(client: StoreClient, name: str | None) -> list[tuple[str, str]]:
    """(id, name) of the experiment named ``name``, or of every active experiment."""
    if name is not None:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise EdpsError(f"no experiment named {name!r} in {redact_uri(str(client.tracking_uri))}")
        return [(found.experiment_id, found.name)]
    found_all, token = [], None
    while True:
        page = client.search_experiments(max_results=1000, page_token=token)
        found_all.extend((e.experiment_id, e.name) for e in page)
        token = page.token
        if not token:
            return found_all


def run_facts(client: StoreClient, experiment_id: str) -> list[RunFacts]:
    """Every run of the experiment, as doctor sees it (one paged search)."""
    facts = []
    for run in search_all(client, experiment_id, ""):
        tags = run.data.tags
        leased = _leased(run)
        facts.append(RunFacts(
            run_id=run.info.run_id, kind=tags.get(TAG_KIND), study_key=tags.get(TAG_STUDY_KEY),
            trial_key=tags.get(TAG_TRIAL_KEY), sweep_key=tags.get(TAG_SWEEP_KEY), state=leased.state,
            renewed=leased.renewed, parent_run_id=tags.get(MLFLOW_PARENT_RUN_ID), full_trials=leased.full_trials,
            ours=any(tag in tags for tag in (TAG_KIND, TAG_VERSION, TAG_HEARTBEAT)),
            gave_way=TAG_YIELDED_TO in tags, end_time=run.info.end_time, marked_dead=TAG_ERROR in tags,
            summarised=METRIC_STUDIES_DONE in run.data.metrics))
    return facts
