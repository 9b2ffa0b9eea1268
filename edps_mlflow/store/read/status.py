"""What ``edps status`` reads: the experiments that hold studies, and one row per study run of one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edps_mlflow import names as n
from edps_mlflow.curves import CurveId
from edps_mlflow.errors import EdpsError
from edps_mlflow.filters import filter_string
from edps_mlflow.results import RunState
from edps_mlflow.store import index
from edps_mlflow.store.client import every_experiment, open_store, resolve_tracking_uri, searcher
from edps_mlflow.store.read.runs import planned_trial_counts, stored_studies
from edps_mlflow.store.trouble import store_errors
from edps_mlflow.uris import redact_uri, require_existing_store


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
    rungs: tuple[tuple[float, int | None], ...] = ()  # a finished goal ladder's (goal, steps-to-result), easiest first
    goal: float | None = None  # a one-goal study's goal (a ladder's hardest)
    seed: int = 0  # the study seed: the studies of one point at several seeds are its replicates


def with_studies(client: Any, experiments: list[Any]) -> list[Any]:
    """The experiments among ``experiments`` that hold at least one study run (index.experiments_with_studies)."""
    ids = [e.experiment_id for e in experiments]
    found = set(index.experiments_with_studies(searcher(client, ids), ids, lambda experiment_id: bool(
        client.search_runs([experiment_id], filter_string(tags={n.TAG_KIND: n.KIND_STUDY}), max_results=1))))
    return [e for e in experiments if e.experiment_id in found]


def experiments_with_studies(tracking_uri: str | None = None) -> list[str]:
    """Names of the active experiments that hold at least one study run."""
    uri = resolve_tracking_uri(tracking_uri)
    require_existing_store(uri)  # before the client: MLflow creates a missing sqlite store when it connects
    client = open_store(uri)
    with store_errors(client):
        return [e.name for e in with_studies(client, every_experiment(client))]


def study_rows(experiment: str, lease: float, tracking_uri: str | None = None) -> list[StudyRow]:
    """Every study run of the experiment named ``experiment``, with the finished-trial count of each study that
    has no finished run yet; ``lease`` tells a live run."""
    uri = resolve_tracking_uri(tracking_uri)
    require_existing_store(uri)  # a reader never creates a store that is not there
    client = open_store(uri)
    with store_errors(client):
        found = client.get_experiment_by_name(experiment)
        if found is None:
            raise EdpsError(f"no experiment named {experiment!r} in {redact_uri(str(client.tracking_uri))}")
        runs = index.study_runs(searcher(client, [found.experiment_id]))
        studies = stored_studies(runs, lease)
        done = {s.study_key for s in studies if s.finished}
        counts = planned_trial_counts(client, found.experiment_id, studies,
                                      [s.study_key for s in studies if s.study_key and s.study_key not in done])
    rows = []
    for run, study in zip(runs, studies):
        try:
            trials = int(run.data.params.get(n.PARAM_SPEC_TRIALS, 0))
            rows.append(StudyRow(
                curve=CurveId.from_tags(run.data.tags), batch_size=int(run.data.tags[n.TAG_BATCH_SIZE]),
                study_key=study.study_key, state=study.state, steps_to_result=study.steps_to_result, trials=trials,
                finished_trials=counts.get(study.study_key, trials), start_time=study.start_time, live=study.live,
                rungs=tuple((r.goal, r.steps_to_result) for r in study.rungs),
                goal=run.data.metrics.get(n.METRIC_GOAL_ERROR),
                seed=int(run.data.params.get(n.PARAM_SPEC_PREFIX + "seed", 0))))
        except (KeyError, ValueError):
            continue  # a study run refused before it logged anything
    return rows
