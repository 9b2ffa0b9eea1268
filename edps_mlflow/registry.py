"""MLflow reads for training: finished trials by key (reuse) and neighbouring studies (trial order).

Only this module and tracking.py import mlflow on the training side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from edps_mlflow.config import StudySpec
from edps_mlflow.engine import TrialStatus
from edps_mlflow.tracking import (
    KIND_STUDY,
    KIND_TRIAL,
    METRIC_BEST_VALIDATION_ERROR,
    METRIC_STEPS_TO_RESULT,
    METRIC_STEPS_TRAINED,
    TAG_BATCH_SIZE,
    TAG_KIND,
    TAG_OPTIMIZER,
    TAG_SPARSITY,
    TAG_STATUS,
    TAG_STUDY_FAMILY,
    TAG_TRIAL_KEY,
    TAG_WORKLOAD,
    sparsity_tag,
    study_family,
)


@dataclass(frozen=True)
class StoredTrial:
    """A finished trial found in the store."""

    run_id: str
    trial_key: str
    status: TrialStatus
    steps_to_result: int | None
    steps_trained: int
    best_validation_error: float | None


def _search_all(client: MlflowClient, experiment_id: str, filter_string: str) -> list[Run]:
    runs: list[Run] = []
    token = None
    while True:
        page = client.search_runs([experiment_id], filter_string=filter_string, max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def finished_trials(client: MlflowClient, experiment_id: str, spec: StudySpec) -> dict[str, StoredTrial]:
    """trial_key -> the earliest finished trial run with that key, from any study of the same family."""
    runs = _search_all(
        client, experiment_id,
        f"tags.`{TAG_KIND}` = '{KIND_TRIAL}' and tags.`{TAG_STUDY_FAMILY}` = '{study_family(spec)}' "
        f"and attributes.status = 'FINISHED'",
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


def neighbour_best_point(client: MlflowClient, experiment_id: str,
                         spec: StudySpec) -> tuple[int, dict[str, float]] | None:
    """(batch size, best metaparameters) of the finished study at the nearest batch size, if any.

    Used only to order trials (promising ones first); it changes the cost, never the result.
    """
    runs = _search_all(
        client, experiment_id,
        f"tags.`{TAG_KIND}` = '{KIND_STUDY}' and tags.`{TAG_WORKLOAD}` = '{spec.workload}' "
        f"and tags.`{TAG_OPTIMIZER}` = '{spec.optimizer.value}' "
        f"and tags.`{TAG_SPARSITY}` = '{sparsity_tag(spec.sparsity)}' and attributes.status = 'FINISHED'",
    )
    candidates = []
    for run in runs:
        if METRIC_STEPS_TO_RESULT not in run.data.metrics:
            continue
        try:
            batch_size = int(run.data.tags[TAG_BATCH_SIZE])
        except (KeyError, ValueError):
            continue
        point = {k[len("best."):]: float(v) for k, v in run.data.params.items() if k.startswith("best.")}
        if point and batch_size > 0:
            candidates.append((abs(math.log2(batch_size) - math.log2(spec.batch_size)), batch_size, point))
    if not candidates:
        return None
    _, batch_size, point = min(candidates, key=lambda c: (c[0], c[1]))
    return batch_size, point
