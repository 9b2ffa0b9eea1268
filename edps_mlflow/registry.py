"""MLflow reads for training: finished trials by key (reuse), neighbouring studies (trial order),
study and sweep runs (the sweep's plan), and the grid that ``edps status`` shows.

Only this module and tracking.py import mlflow on the training side. What it returns is plain
records with enums and booleans, never MLflow's own entities or status strings. It imports no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mlflow.entities import Run
from mlflow.exceptions import MlflowException

from edps_mlflow.config import StudySpec
from edps_mlflow.errors import EdpsError
from edps_mlflow.names import (
    KIND_STUDY,
    KIND_SWEEP,
    KIND_TRIAL,
    METRIC_BEST_VALIDATION_ERROR,
    METRIC_STEPS_TO_RESULT,
    METRIC_STEPS_TRAINED,
    MLFLOW_PARENT_RUN_ID,
    PARAM_BEST_PREFIX,
    PARAM_SPEC_TRIALS,
    STOPPING_FULL_TRIALS,
    TAG_BATCH_SIZE,
    TAG_KIND,
    TAG_OPTIMIZER,
    TAG_SPARSITY,
    TAG_STATUS,
    TAG_STOPPING,
    TAG_STUDY_FAMILY,
    TAG_STUDY_KEY,
    TAG_SWEEP_KEY,
    TAG_TRIAL_KEY,
    TAG_WORKLOAD,
)
from edps_mlflow.results import RunState, TrialStatus
from edps_mlflow.tracking import StoreClient, open_store, redact_uri, sparsity_tag, store_error, study_family


@dataclass(frozen=True)
class StoredTrial:
    """A finished trial found in the store."""

    run_id: str
    trial_key: str
    status: TrialStatus
    steps_to_result: int | None
    steps_trained: int
    best_validation_error: float | None


def _search_all(client: StoreClient, experiment_id: str, filter_string: str) -> list[Run]:
    runs: list[Run] = []
    token = None
    while True:
        page = client.search_runs([experiment_id], filter_string=filter_string, max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def finished_trials(client: StoreClient, experiment_id: str, spec: StudySpec) -> dict[str, StoredTrial]:
    """trial_key -> the earliest finished trial run with that key, from any study of the same family."""
    runs = _search_all(
        client, experiment_id,
        f"tags.`{TAG_KIND}` = '{KIND_TRIAL}' and tags.`{TAG_STUDY_FAMILY}` = '{study_family(spec)}' "
        f"and attributes.status = '{RunState.FINISHED.value}'",
    )
    found: dict[str, StoredTrial] = {}
    for run in sorted(runs, key=lambda r: r.info.start_time or 0):
        tags, metrics = run.data.tags, run.data.metrics
        key = tags.get(TAG_TRIAL_KEY)
        status_name = tags.get(TAG_STATUS)
        if key is None or status_name is None or key in found:
            continue
        steps = metrics.get(METRIC_STEPS_TO_RESULT)
        found[key] = StoredTrial(
            run_id=run.info.run_id, trial_key=key, status=TrialStatus(status_name),
            steps_to_result=int(steps) if steps is not None else None,
            steps_trained=int(metrics.get(METRIC_STEPS_TRAINED, 0)),
            best_validation_error=metrics.get(METRIC_BEST_VALIDATION_ERROR),
        )
    return found


def neighbour_best_point(client: StoreClient, experiment_id: str,
                         spec: StudySpec) -> tuple[int, dict[str, float]] | None:
    """(batch size, best metaparameters) of the finished study at the nearest batch size, if any.

    Used only to order trials (promising ones first); it changes the cost, never the result.
    """
    runs = _search_all(
        client, experiment_id,
        f"tags.`{TAG_KIND}` = '{KIND_STUDY}' and tags.`{TAG_WORKLOAD}` = '{spec.workload}' "
        f"and tags.`{TAG_OPTIMIZER}` = '{spec.optimizer.value}' "
        f"and tags.`{TAG_SPARSITY}` = '{sparsity_tag(spec.sparsity)}' and attributes.status = '{RunState.FINISHED.value}'",
    )
    candidates = []
    for run in runs:
        if METRIC_STEPS_TO_RESULT not in run.data.metrics:
            continue
        try:
            batch_size = int(run.data.tags[TAG_BATCH_SIZE])
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
    runs = _search_all(client, experiment_id,
                       f"tags.`{TAG_KIND}` = '{KIND_STUDY}' and tags.`{TAG_WORKLOAD}` = '{workload}'")
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
    runs = _search_all(client, experiment_id,
                       f"tags.`{TAG_KIND}` = '{KIND_TRIAL}' and tags.`{TAG_WORKLOAD}` = '{workload}' "
                       f"and attributes.status = '{RunState.FINISHED.value}'")
    counts: dict[str, int] = {}
    for run in runs:
        key = run.data.tags.get(TAG_STUDY_KEY)
        if key:
            counts[key] = counts.get(key, 0) + 1
    return counts


def sweep_run_id(client: StoreClient, experiment_id: str, sweep_key: str) -> str | None:
    runs = _search_all(client, experiment_id,
                       f"tags.`{TAG_KIND}` = '{KIND_SWEEP}' and tags.`{TAG_SWEEP_KEY}` = '{sweep_key}'")
    return min(runs, key=lambda r: r.info.start_time or 0).info.run_id if runs else None


def running_runs_of_sweep(client: StoreClient, experiment_id: str, sweep_key: str) -> list[str]:
    """Study and trial runs of a sweep still marked RUNNING (left behind by a killed process)."""
    runs = _search_all(client, experiment_id,
                       f"tags.`{TAG_SWEEP_KEY}` = '{sweep_key}' and attributes.status = '{RunState.RUNNING.value}'")
    return [r.info.run_id for r in runs if r.data.tags.get(TAG_KIND) != KIND_SWEEP]


@dataclass(frozen=True)
class StudyRow:
    """One study run as ``edps status`` shows it."""

    workload: str
    optimizer: str
    sparsity: float
    batch_size: int
    study_key: str
    state: RunState
    steps_to_result: int | None
    trials: int  # the study's trial count
    finished_trials: int  # FINISHED trial runs with the study's key
    start_time: int


def study_rows(experiment: str, tracking_uri: str | None = None) -> list[StudyRow]:
    """Every study run of the experiment named ``experiment``, with its finished-trial count."""
    client = open_store(tracking_uri)
    try:
        found = client.get_experiment_by_name(experiment)
        if found is None:
            raise EdpsError(f"no experiment named {experiment!r} in {redact_uri(str(client.tracking_uri))}")
        runs = _search_all(client, found.experiment_id, f"tags.`{TAG_KIND}` = '{KIND_STUDY}'")
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
                workload=tags[TAG_WORKLOAD], optimizer=tags[TAG_OPTIMIZER], sparsity=float(tags[TAG_SPARSITY]),
                batch_size=int(tags[TAG_BATCH_SIZE]), study_key=key, state=RunState(run.info.status),
                steps_to_result=int(steps) if steps is not None else None,
                trials=int(params.get(PARAM_SPEC_TRIALS, 0)), finished_trials=counts.get(key, 0),
                start_time=run.info.start_time or 0))
        except (KeyError, ValueError):
            continue  # a study run refused before it logged anything
    return rows
