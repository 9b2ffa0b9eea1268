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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from mlflow.entities import Run
from mlflow.exceptions import MlflowException

from edps_mlflow import study_index
from edps_mlflow.config import StudySpec, study_family
from edps_mlflow.curves import CurveId
from edps_mlflow.errors import EdpsError
from edps_mlflow.filters import filter_string
from edps_mlflow.names import (
    ARTIFACT_TRIALS_CSV,
    KIND_STUDY,
    KIND_ANALYSIS,
    KIND_STUDY_INDEX,
    KIND_SWEEP,
    KIND_TRIAL,
    METRIC_BEST_VALIDATION_ERROR,
    METRIC_PACK_SIZE,
    METRIC_SECONDS_PER_STEP,
    METRIC_STEPS_TO_RESULT,
    METRIC_STEPS_TRAINED,
    METRIC_STUDIES_DONE,
    METRIC_TRIAL_RUNS_FINISHED,
    MLFLOW_PARENT_RUN_ID,
    PARAM_BEST_PREFIX,
    PARAM_DEVICE,
    PARAM_SPEC_PREFIX,
    PARAM_SPEC_TRIALS,
    STOPPING_FULL_TRIALS,
    TAG_BATCH_SIZE,
    TAG_ERROR,
    TAG_HEARTBEAT,
    TAG_KIND,
    TAG_LEASE_OWNER,
    TAG_REUSED,
    TAG_STATUS,
    TAG_STOPPING,
    TAG_STUDY_FAMILY,
    TAG_STUDY_KEY,
    TAG_SWEEP_KEY,
    TAG_TRIAL_FAMILIES,
    TAG_TRIAL_KEY,
    TAG_TRIAL_OUTCOMES,
    TAG_VERSION,
    TAG_WORKLOAD,
    TAG_YIELDED_TO,
)
from edps_mlflow.results import RunState, TrialOutcome, TrialStatus, decode_trial_outcomes
from edps_mlflow.store import StoreClient, open_store, resolve_tracking_uri, search_all, store_error
from edps_mlflow.store import searcher as _searcher
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
    start_time: int = 0  # ms
    # Its tag edps.trial_outcomes as written (decoded on demand by trial_outcomes: most readers only count)
    trial_outcomes_text: str | None = None
    live: bool = False  # RUNNING with its lease renewed in time
    trials_so_far: int = 0  # trials it reused when it started and trial runs it finished since (see _trials_so_far)

    @property
    def finished(self) -> bool:
        return self.state.is_finished

    @property
    def order(self) -> tuple[int, str]:
        return (self.start_time, self.run_id)

    @property
    def trial_outcomes(self) -> tuple[TrialOutcome, ...] | None:
        """Its trials, from its tag edps.trial_outcomes (None: a study written before the tag; see
        study_trial_outcomes). Decoded when asked: at 1,500 studies decoding all costs about a second."""
        decoded = decode_trial_outcomes(self.trial_outcomes_text)
        return tuple(decoded) if decoded is not None else None


def study_views(client: StoreClient, experiment_id: str) -> list[study_index.RunView]:
    """Every study run of the experiment, as study_index.study_runs reads it: one read, which a command that
    asks several questions of the studies (a sweep's plan and its sweep runs) passes to each."""
    return study_index.study_runs(_searcher(client, [experiment_id]))


def study_runs(client: StoreClient, experiment_id: str, workload: str, lease: float,
               views: list[study_index.RunView] | None = None) -> list[StoredStudy]:
    """Every study run of a workload in the experiment: the finished ones from the study index, the others
    from the store (study_index.study_runs); ``lease`` tells a live run (ownership.lease_seconds). ``views``:
    the experiment's study runs as :func:`study_views` read them, instead of reading them again."""
    wanted = {TAG_WORKLOAD: workload}
    runs = (study_index.study_runs(_searcher(client, [experiment_id]), wanted) if views is None
            else study_index.with_tags(views, wanted))
    now = time.time()
    stored = []
    for run in runs:
        steps = run.data.metrics.get(METRIC_STEPS_TO_RESULT)
        stored.append(StoredStudy(
            run_id=run.info.run_id, study_key=run.data.tags.get(TAG_STUDY_KEY, ""), state=RunState(run.info.status),
            parent_run_id=run.data.tags.get(MLFLOW_PARENT_RUN_ID),
            steps_to_result=int(steps) if steps is not None else None,
            full_trials=run.data.tags.get(TAG_STOPPING) == STOPPING_FULL_TRIALS, start_time=run.info.start_time or 0,
            trial_outcomes_text=run.data.tags.get(TAG_TRIAL_OUTCOMES), live=_leased(run).live(lease, now),
            trials_so_far=_trials_so_far(run)))
    return stored


def _trials_so_far(run: Any) -> int:
    """A study run's trials done so far: those it reused when it started (its tag edps.trials_reused) and the
    trial runs it finished since (METRIC_TRIAL_RUNS_FINISHED)."""
    reused = run.data.tags.get(TAG_REUSED, "0")
    return (int(reused) if reused.isdigit() else 0) + int(run.data.metrics.get(METRIC_TRIAL_RUNS_FINISHED, 0))


def planned_trial_counts(client: StoreClient, experiment_id: str, stored: list[StoredStudy],
                         study_keys: Iterable[str]) -> dict[str, int]:
    """study key -> its finished trials, for studies that have study runs (``stored``) but none finished.

    A live study's latest run says it (trials_so_far: exact but for the trial finishing at this moment). A
    study whose process is gone is looked up by key (finished_trial_counts): its run's count may be one
    short (killed between finishing a trial and counting it), and the runs before it may have finished
    trials too: one search each, for the few studies stopped half-way.
    """
    latest: dict[str, StoredStudy] = {}
    for run in sorted(stored, key=lambda r: r.order):
        latest[run.study_key] = run
    counts: dict[str, int] = {}
    stopped = []
    for key in dict.fromkeys(study_keys):
        run = latest.get(key)
        if run is not None and run.live:
            counts[key] = run.trials_so_far
        else:
            stopped.append(key)
    counts.update(finished_trial_counts(client, experiment_id, stopped))
    return counts


def finished_trial_counts(client: StoreClient, experiment_id: str, study_keys: Iterable[str]) -> dict[str, int]:
    """study_key -> number of FINISHED trial runs logged for it, for the given keys only: one search per
    key, which reads that study's trial runs, never the experiment's (callers ask for the studies that
    have a study run but no finished one: a few)."""
    counts: dict[str, int] = {}
    for key in dict.fromkeys(study_keys):
        counts[key] = len(search_all(client, experiment_id, filter_string(
            tags={TAG_KIND: KIND_TRIAL, TAG_STUDY_KEY: key}, status=RunState.FINISHED.value)))
    return counts


def unfinished_trial_counts(client: StoreClient, experiment_id: str, runs: list[Any], lease: float) -> dict[str, int]:
    """study key -> its finished trials, for the studies among ``runs`` (study runs) without a FINISHED run.

    A live study's latest run says it: the trials it reused when it started (its tag edps.trials_reused)
    and the trial runs it finished since (METRIC_TRIAL_RUNS_FINISHED). A study whose process is gone is
    looked up by key (finished_trial_counts): its count may be one short (killed between finishing a trial
    and counting it), and the runs before it may have finished trials too.
    """
    now = time.time()
    done = {r.data.tags.get(TAG_STUDY_KEY) for r in runs if r.info.status == RunState.FINISHED.value}
    latest: dict[str, Any] = {}
    for run in sorted(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id)):
        key = run.data.tags.get(TAG_STUDY_KEY)
        if key and key not in done:
            latest[key] = run
    counts, stopped = {}, []
    for key, run in latest.items():
        if _leased(run).live(lease, now):
            counts[key] = _trials_so_far(run)
        else:
            stopped.append(key)
    counts.update(finished_trial_counts(client, experiment_id, stopped))
    return counts


def trial_runs_finished(client: StoreClient, experiment_id: str, run_ids: Iterable[str]) -> dict[str, int]:
    """study run id -> the trial runs it has finished so far (its METRIC_TRIAL_RUNS_FINISHED, written after
    each one; 0 for a run without it), in a search by run id (the mlflow-project executor's progress)."""
    return {run.info.run_id: int(run.data.metrics.get(METRIC_TRIAL_RUNS_FINISHED, 0))
            for run in study_index.by_ids(_searcher(client, [experiment_id]), run_ids)}


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


def running_trial_runs(client: StoreClient, experiment_id: str, study_run_id: str) -> list[str]:
    """The ids of the trial runs of one study run that are still RUNNING (one search by tag)."""
    return [run.info.run_id for run in search_all(client, experiment_id, filter_string(
        tags={TAG_KIND: KIND_TRIAL, MLFLOW_PARENT_RUN_ID: study_run_id}, status=RunState.RUNNING.value))]


def sweep_runs(client: StoreClient, experiment_id: str, sweep_key: str,
               views: list[study_index.RunView] | None = None) -> list[LeasedRun]:
    """The sweep runs of ``sweep_key``, earliest first, found without a search by tag when it can be: the
    parents of the key's study runs (from the study index, or ``views`` as :func:`study_views` read them) and
    the RUNNING sweep runs of the key. A sweep run of the key that parents no study and has ended is missed
    then (it did nothing); when none is found this way, the sweep runs are searched by their key (keyed_runs)."""
    search = _searcher(client, [experiment_id])
    wanted = {TAG_SWEEP_KEY: sweep_key}
    keyed = study_index.study_runs(search, wanted) if views is None else study_index.with_tags(views, wanted)
    parents = {run.data.tags.get(MLFLOW_PARENT_RUN_ID) for run in keyed}
    candidates = [*study_index.by_ids(search, parents - {None}),
                  *search(filter_string(status=RunState.RUNNING.value), False)]
    found = {run.info.run_id: _leased(run) for run in candidates
             if run.data.tags.get(TAG_KIND) == KIND_SWEEP and run.data.tags.get(TAG_SWEEP_KEY) == sweep_key}
    if not found:
        return keyed_runs(client, experiment_id, KIND_SWEEP, sweep_key)
    return sorted(found.values(), key=lambda r: r.order)


def get_leased(client: StoreClient, run_id: str) -> LeasedRun:
    return _leased(client.get_run(run_id))


def latest_finished_study(client: StoreClient, experiment_id: str, study_key: str,
                          full_trials: bool) -> LeasedRun | None:
    """The latest FINISHED study run of the key in the same early-stopping mode (None: not done)."""
    done = [r for r in keyed_runs(client, experiment_id, KIND_STUDY, study_key)
            if r.state.is_finished and r.full_trials == full_trials]
    return done[-1] if done else None


def study_trial_outcomes(client: StoreClient, run_id: str) -> list[TrialOutcome]:
    """The trials of a finished study run: from its tag edps.trial_outcomes, else (a study written before
    the tag, or with too many trials for one) from its ``trials.csv`` artifact; empty when it has neither."""
    decoded = decode_trial_outcomes(client.get_run(run_id).data.tags.get(TAG_TRIAL_OUTCOMES))
    if decoded is not None:
        return decoded
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
    # FINISHED trial runs with the study's key while it has no finished run (its trial count once it has)
    finished_trials: int
    start_time: int
    live: bool = False  # RUNNING with a lease renewed in time: a process is working on it now


def experiments_with_studies(tracking_uri: str | None = None) -> list[str]:
    """Names of the active experiments that hold at least one study run."""
    uri = resolve_tracking_uri(tracking_uri)
    require_existing_store(uri)  # before the client: MLflow creates a missing sqlite store when it connects
    client = open_store(uri)
    try:
        experiments = client.search_experiments(max_results=50_000)
        ids = [e.experiment_id for e in experiments]
        with_studies = set(study_index.experiments_with_studies(
            _searcher(client, ids), ids,
            lambda experiment_id: bool(client.search_runs([experiment_id], filter_string(tags={TAG_KIND: KIND_STUDY}),
                                                          max_results=1))))
        return [e.name for e in experiments if e.experiment_id in with_studies]
    except MlflowException as error:
        raise store_error(client, error) from None


def study_rows(experiment: str, lease: float, tracking_uri: str | None = None) -> list[StudyRow]:
    """Every study run of the experiment named ``experiment``: the finished ones from the study index, the
    others from the store; the finished-trial count of each study that has no finished run yet. ``lease``:
    the lease that tells a live run (ownership.lease_seconds)."""
    uri = resolve_tracking_uri(tracking_uri)
    require_existing_store(uri)  # a reader never creates a store that is not there
    client = open_store(uri)
    try:
        found = client.get_experiment_by_name(experiment)
        if found is None:
            raise EdpsError(f"no experiment named {experiment!r} in {redact_uri(str(client.tracking_uri))}")
        runs = study_index.study_runs(_searcher(client, [found.experiment_id]))
        counts = unfinished_trial_counts(client, found.experiment_id, runs, lease)
    except MlflowException as error:
        raise store_error(client, error) from None
    rows = []
    for run in runs:
        tags, metrics, params = run.data.tags, run.data.metrics, run.data.params
        try:
            steps = metrics.get(METRIC_STEPS_TO_RESULT)
            key = tags.get(TAG_STUDY_KEY, "")
            trials = int(params.get(PARAM_SPEC_TRIALS, 0))
            rows.append(StudyRow(
                curve=CurveId.from_tags(tags), batch_size=int(tags[TAG_BATCH_SIZE]), study_key=key,
                state=RunState(run.info.status),
                steps_to_result=int(steps) if steps is not None else None,
                trials=trials, finished_trials=counts.get(key, trials),
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
    indexed: bool = False  # a study run with an entry in the study index (study_index.py)


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


@dataclass(frozen=True)
class DoctorRead:
    """What doctor read of one experiment: the runs to check, and the time from which the next check need
    read only the runs that start or end later (None: it read none of that kind)."""

    facts: list["RunFacts"]
    checked_until: int | None


# A client's clock may be behind doctor's: a run it starts now may carry a time up to this much earlier.
CLOCK_MARGIN_MS = 10 * 60 * 1000


def run_facts(client: StoreClient, experiment_id: str, checked_until: int | None = None,
              recheck: Iterable[str] = ()) -> list[RunFacts]:
    """The runs of the experiment on which doctor's invariants can fail (see :func:`doctor_read`)."""
    return doctor_read(client, experiment_id, checked_until, recheck).facts


def doctor_read(client: StoreClient, experiment_id: str, checked_until: int | None = None,
                recheck: Iterable[str] = (), search_malformed: bool = True) -> DoctorRead:
    """The runs of the experiment on which doctor's invariants can fail, found without reading every trial
    run: the study runs (study_index.study_runs) and their sweep runs, the RUNNING runs, and

    - with ``checked_until`` (an earlier check's time, ms): the runs that started or ended since (minus a
      margin for clocks that lag) and the runs of the problems found then (``recheck``): searches on run
      attributes, which cost what those runs cost;
    - without (the first check of an experiment): every sweep run, and, with ``search_malformed``, the runs
      of ours without their kind, of an unknown kind, trial runs without their keys and FINISHED trial runs
      without a parent, each found by a search on tags, which scans the tags of the store once per search
      (doctor leaves these out in an experiment made by edps-mlflow, which never writes such runs);

    and, for the invariant of one FINISHED trial run per trial key, the FINISHED trial runs of each study
    family where two study runs may have finished trial runs, and of those without a parent; for the trial
    runs finished after their lease was lost, in the first check, those of the families of the study runs
    that ended without finishing (later checks read them among the runs that ended since).

    A study run may have finished trial runs in the families of its tag edps.trial_families (its own family
    for a run made before the tag) unless it is FINISHED with METRIC_TRIAL_RUNS_FINISHED 0: that count is
    written after each trial run it finishes, so once the study run is FINISHED it is the whole count. A
    family of one such study run cannot hold a trial trained twice: a study run trains each trial once.
    """
    started = int(time.time() * 1000)
    search = _searcher(client, [experiment_id])
    finished = RunState.FINISHED.value
    searches: tuple[str, ...] = ()
    if checked_until is None:
        known_kinds = (KIND_STUDY, KIND_TRIAL, KIND_SWEEP, KIND_ANALYSIS, KIND_STUDY_INDEX)
        malformed = (filter_string(tags={TAG_KIND: KIND_TRIAL}, tags_absent=[TAG_TRIAL_KEY]),
                     filter_string(tags={TAG_KIND: KIND_TRIAL}, tags_absent=[TAG_STUDY_KEY]),
                     filter_string(tags_absent=[TAG_KIND], tags_present=[TAG_VERSION]),
                     filter_string(tags_present=[TAG_KIND], tags_not={TAG_KIND: known_kinds}),
                     filter_string(tags={TAG_KIND: KIND_TRIAL}, status=finished, tags_absent=[MLFLOW_PARENT_RUN_ID]))
        # every sweep run (a few): one that finished its grid may have been overwritten FAILED, and one that
        # ran no study is not the parent of any
        searches = ((*malformed,) if search_malformed else ()) + (filter_string(tags={TAG_KIND: KIND_SWEEP}),)
    # Each search on tags scans the tags of every run in the store (about a second at 150,000 runs); sent at
    # once, before the study index is read, they share the store's cores with that read and with each other
    # (sqlite releases the GIL while it reads; a server serves requests in parallel).
    with ThreadPoolExecutor(max_workers=len(searches) or 1) as pool:
        scans = [pool.submit(search, conditions, False) for conditions in searches]
        studies = study_index.study_runs(search)
        found: dict[str, Any] = {run.info.run_id: run for run in studies}

        def add(runs: Iterable[Any]) -> None:
            for run in runs:
                found.setdefault(run.info.run_id, run)

        add(search(filter_string(status=RunState.RUNNING.value), False))
        add(study_index.by_ids(search, {p for run in studies if (p := run.data.tags.get(MLFLOW_PARENT_RUN_ID))}))
        if checked_until is not None:
            since = checked_until - CLOCK_MARGIN_MS
            add(search(filter_string(started_from=since), False))
            add(search(filter_string(ended_from=since), False))
            add(study_index.by_ids(search, recheck))
        for scan in scans:
            add(scan.result())
    writers: dict[str, int] = {}  # study family -> study runs that may have finished trial runs in it
    for run in studies:
        if run.info.status == finished and run.data.metrics.get(METRIC_TRIAL_RUNS_FINISHED) == 0:
            continue
        for family in _trial_families(search, run):
            writers[family] = writers.get(family, 0) + 1
    families = {family for family, count in writers.items() if count > 1}
    parents = []
    if checked_until is None:
        # A trial run finished after its lease was lost (a stalled process woken after its study run was marked
        # FAILED or KILLED) is FINISHED under an ended study run that did not finish: the first check reads
        # the families of such runs (the run's own trial runs when it names none); later checks read it among
        # the runs that ended since.
        for run in studies:
            if run.info.status in (finished, RunState.RUNNING.value):
                continue
            own = _trial_families(search, run)
            families.update(own)
            if not own:
                parents.append(run.info.run_id)
    keys = set()
    for run in list(found.values()):
        tags = run.data.tags
        if tags.get(TAG_KIND) == KIND_TRIAL and run.info.status == finished and not tags.get(MLFLOW_PARENT_RUN_ID):
            if tags.get(TAG_STUDY_FAMILY):
                families.add(tags[TAG_STUDY_FAMILY])
            elif tags.get(TAG_STUDY_KEY):
                keys.add(tags[TAG_STUDY_KEY])
    for conditions in ([filter_string(tags={TAG_KIND: KIND_TRIAL, TAG_STUDY_FAMILY: f}, status=finished)
                        for f in sorted(families)]
                       + [filter_string(tags={TAG_KIND: KIND_TRIAL, TAG_STUDY_KEY: k}, status=finished)
                          for k in sorted(keys)]
                       + [filter_string(tags={TAG_KIND: KIND_TRIAL, MLFLOW_PARENT_RUN_ID: p}, status=finished)
                          for p in parents]):
        add(search(conditions, False))
    return DoctorRead([_facts(run) for run in found.values()], started)


def _trial_families(search: study_index.Search, run: Any) -> list[str]:
    """The study families of a study run's trial runs (see run_facts)."""
    tags, params = run.data.tags, run.data.params
    if tags.get(TAG_TRIAL_FAMILIES):
        return tags[TAG_TRIAL_FAMILIES].split(",")
    if params.get(PARAM_SPEC_PREFIX + "probes") and params.get(PARAM_SPEC_PREFIX + "probe_trials") == "best":
        # Made before the tag, by a study whose trials are another study's (StudySpec.training_spec): ask its
        # trial runs for their families.
        trials = search(filter_string(tags={TAG_KIND: KIND_TRIAL, MLFLOW_PARENT_RUN_ID: run.info.run_id}), False)
        return sorted({t.data.tags[TAG_STUDY_FAMILY] for t in trials if t.data.tags.get(TAG_STUDY_FAMILY)})
    return [tags[TAG_STUDY_FAMILY]] if tags.get(TAG_STUDY_FAMILY) else []


def _facts(run: Any) -> RunFacts:
    tags = run.data.tags
    leased = _leased(run)
    return RunFacts(
        run_id=run.info.run_id, kind=tags.get(TAG_KIND), study_key=tags.get(TAG_STUDY_KEY),
        trial_key=tags.get(TAG_TRIAL_KEY), sweep_key=tags.get(TAG_SWEEP_KEY), state=leased.state,
        renewed=leased.renewed, parent_run_id=tags.get(MLFLOW_PARENT_RUN_ID), full_trials=leased.full_trials,
        ours=any(tag in tags for tag in (TAG_KIND, TAG_VERSION, TAG_HEARTBEAT)),
        gave_way=TAG_YIELDED_TO in tags, end_time=run.info.end_time, marked_dead=TAG_ERROR in tags,
        summarised=METRIC_STUDIES_DONE in run.data.metrics, indexed=getattr(run, "indexed", False))


def unindexed_study_runs(client: StoreClient, experiment_id: str) -> list[str]:
    """The ids of the experiment's study runs without an entry in its study index (one search by tag over
    the store: doctor --repair only)."""
    search = _searcher(client, [experiment_id])
    listed = {run_id for index_run in study_index.index_runs(search) for run_id in study_index.entries(index_run)}
    return [run.info.run_id for run in search(filter_string(tags={TAG_KIND: KIND_STUDY}), False)
            if run.info.run_id not in listed]


def index_is_complete(client: StoreClient, experiment_id: str) -> bool:
    """Whether the experiment's study index holds every study run of it (study_index.py)."""
    return study_index.complete(study_index.index_runs(_searcher(client, [experiment_id])))
