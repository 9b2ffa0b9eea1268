"""What a study reads of trials already measured: finished trials by key (reuse), the best point of its
neighbour on the curve (trial order), and the trials of a finished study (an adaptive sweep's bootstrap)."""

from __future__ import annotations

import csv
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mlflow.entities import Run
from mlflow.exceptions import MlflowException

from edps_mlflow import names as n
from edps_mlflow.config import StudySpec, study_family
from edps_mlflow.curves import CurveId
from edps_mlflow.filters import filter_string
from edps_mlflow.ladder import stored_goal_steps
from edps_mlflow.results import RunState, TrialOutcome, TrialStatus, decode_trial_outcomes
from edps_mlflow.store.client import StoreClient, search_all
from edps_mlflow.store.read.fence import Fence, trial_epochs
from edps_mlflow.store.read.runs import keyed_runs


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
    epochs: tuple[tuple[int, str], ...] = ()  # (epoch, study key) pairs that count it (fence.trial_epochs)
    goal_steps: tuple[int | None, ...] = ()  # at each goal of its study's ladder (ladder.stored_goal_steps)


def finished_trials(client: StoreClient, experiment_id: str, spec: StudySpec) -> dict[str, StoredTrial]:
    """trial_key -> the latest finished trial run with that key that counts (fence.py: not one finished by a process
    that had lost its study), from any study of the same family."""
    runs = search_all(client, experiment_id, filter_string(
        tags={n.TAG_KIND: n.KIND_TRIAL, n.TAG_STUDY_FAMILY: study_family(spec)}, status=RunState.FINISHED.value))
    # The study runs of the keys these trial runs count for (one search per key: a family has a few).
    owners = {key for run in runs for _, key in trial_epochs(run.data.tags)} - {""}
    fence = Fence.of(study for key in owners for study in keyed_runs(client, experiment_id, n.KIND_STUDY, key))
    found: dict[str, StoredTrial] = {}
    for run in sorted(runs, key=lambda r: r.info.start_time or 0):
        tags, metrics = run.data.tags, run.data.metrics
        key = tags.get(n.TAG_TRIAL_KEY)
        status_name = tags.get(n.TAG_STATUS)
        if key is None or status_name is None or not fence.counts_trial(trial_epochs(tags)):
            continue  # later runs replace earlier ones: the latest measurement of a key wins
        steps = int(metrics[n.METRIC_STEPS_TO_RESULT]) if n.METRIC_STEPS_TO_RESULT in metrics else None
        found[key] = StoredTrial(
            run_id=run.info.run_id, trial_key=key, status=TrialStatus(status_name),
            steps_to_result=steps, goal_steps=stored_goal_steps(spec, metrics, steps),
            steps_trained=int(metrics.get(n.METRIC_STEPS_TRAINED, 0)),
            best_validation_error=metrics.get(n.METRIC_BEST_VALIDATION_ERROR),
            seconds_per_step=trial_number(run, n.METRIC_SECONDS_PER_STEP),
            pack_size=trial_number(run, n.METRIC_PACK_SIZE),
            device=run.data.params.get(n.PARAM_DEVICE), epochs=tuple(trial_epochs(tags)),
        )
    return found


def trial_number(run: Run, name: str) -> float | None:
    """A trial run's one-value number: a param (a metric on trial runs written before they were params)."""
    if name in run.data.metrics:
        return run.data.metrics[name]
    text = run.data.params.get(name)
    return None if text is None else float(text)


def neighbour_best_point(client: StoreClient, experiment_id: str,
                         spec: StudySpec) -> tuple[int, dict[str, float]] | None:
    """(batch size, best metaparameters) of the finished study on the same curve at the nearest batch size, if
    any: it orders the trials (promising ones first), which changes the cost, never the result."""
    curve = CurveId.of(spec)
    runs = search_all(client, experiment_id, filter_string(
        tags={n.TAG_KIND: n.KIND_STUDY, **curve.search_tags()}, status=RunState.FINISHED.value))
    candidates = []
    for run in runs:
        if n.METRIC_STEPS_TO_RESULT not in run.data.metrics:
            continue
        try:
            batch_size = int(run.data.tags[n.TAG_BATCH_SIZE])
            if CurveId.from_tags(run.data.tags) != curve:
                continue
        except (KeyError, ValueError):
            continue
        point = {k[len(n.PARAM_BEST_PREFIX):]: float(v) for k, v in run.data.params.items()
                 if k.startswith(n.PARAM_BEST_PREFIX)}
        if point and batch_size > 0:
            candidates.append((abs(math.log2(batch_size) - math.log2(spec.batch_size)), batch_size, point))
    if not candidates:
        return None
    _, batch_size, point = min(candidates, key=lambda c: (c[0], c[1]))
    return batch_size, point


def study_trial_outcomes(client: StoreClient, run_id: str, rung: float | None = None) -> list[TrialOutcome]:
    """The trials of a finished study run (of a ladder's easier ``rung``: as that goal's one-goal study lists them):
    from its tag, else (a study written before the tag, or with too many trials for one) from its ``trials.csv``
    artifact; empty when it has neither."""
    tag = n.TAG_TRIAL_OUTCOMES if rung is None else n.goal_outcomes_tag(rung)
    decoded = decode_trial_outcomes(client.get_run(run_id).data.tags.get(tag))
    if decoded is not None:
        return decoded
    with tempfile.TemporaryDirectory(prefix="edps-trials-") as scratch:
        try:
            path = client.download_artifacts(run_id, n.ARTIFACT_TRIALS_CSV, dst_path=scratch)
            rows = list(csv.DictReader(Path(path).read_text().splitlines()))
        except (MlflowException, OSError):
            return []
    outcomes = []
    for row in rows:
        try:
            steps = row.get("steps_to_result" if rung is None else n.goal_steps_column(rung)) or ""
            status = TrialStatus.REACHED if steps else TrialStatus(row["status"])  # a rung met is reached
            outcomes.append(TrialOutcome(int(row["trial_index"]), status, int(float(steps)) if steps else None,
                                         int(float(row["steps_trained"] or 0))))
        except (KeyError, ValueError):
            return []  # not a trials table of ours: the study gets no bootstrap
    return outcomes
