"""The writes of the study index (index.py says what it holds and why): its run, and each study run's entry."""

from __future__ import annotations

from mlflow.exceptions import MlflowException

from edps_mlflow import __version__
from edps_mlflow import names as n
from edps_mlflow.filters import filter_string
from edps_mlflow.results import RunState
from edps_mlflow.store.client import StoreClient, searcher
from edps_mlflow.store.index import entry_of, index_runs

INDEX_DESCRIPTION = (
    "The study index of this experiment: one tag `edps.index.<run id>` per study run, holding that run's "
    "state, edps tags, params and metrics, so that `edps status`, sweeps, `edps doctor` and `edps-analyze` read "
    "this run instead of searching every study run. Each study writes its entry when it starts and when it "
    "ends; do not delete or rename it (`edps doctor --repair` rebuilds it from the study runs).")


def make_index_run(client: StoreClient, experiment_id: str, complete: bool) -> str:
    """A new index run of the experiment; ``complete``: every study run of the experiment will be in it."""
    # Made at the epoch: readers find it by its start time (index.index_runs).
    run = client.create_run(experiment_id, start_time=n.INDEX_START_TIME, tags={
        n.TAG_KIND: n.KIND_STUDY_INDEX, n.TAG_VERSION: __version__, n.MLFLOW_RUN_NAME: n.INDEX_RUN_NAME,
        n.MLFLOW_NOTE: INDEX_DESCRIPTION, n.TAG_INDEX_COMPLETE: "true" if complete else "false"})
    # FINISHED at once: nothing renews a lease on it, and tags can still be written to a finished run.
    client.set_terminated(run.info.run_id, RunState.FINISHED.value)
    return run.info.run_id


def index_run_id(client: StoreClient, experiment_id: str, own_run_id: str | None = None) -> str:
    """The experiment's index run (the earliest, when two processes made one at the same moment), made when
    there is none: complete when the experiment holds no study run but ``own_run_id`` (one search by tag,
    once per experiment)."""
    found = index_runs(searcher(client, [experiment_id]))
    if found:
        return found[0].info.run_id
    studies = client.search_runs([experiment_id], filter_string(tags={n.TAG_KIND: n.KIND_STUDY}), max_results=2)
    return make_index_run(client, experiment_id, complete={r.info.run_id for r in studies} <= {own_run_id})


def index_study_run(client: StoreClient, run_id: str, was_study: bool = False) -> bool:
    """Write a study run's entry from the run as the store holds it now (``was_study``: one that gave its kind up,
    whose entry must stop saying RUNNING); False when not written. Best effort: readers read a run whose entry is
    missing or says RUNNING from the store."""
    try:
        run = client.get_run(run_id)
        if run.data.tags.get(n.TAG_KIND) != n.KIND_STUDY and not was_study:
            return False
        entry = entry_of(run)
        if entry is None:
            return False
        client.set_tag(index_run_id(client, run.info.experiment_id, run_id), n.TAG_INDEX_PREFIX + run_id, entry)
        return True
    except (MlflowException, OSError):
        return False


def complete_index(client: StoreClient, experiment_id: str, run_ids: list[str]) -> int:
    """Index these study runs (all those of the experiment without an entry: doctor --repair) and say that
    the index is complete; the number indexed."""
    indexed = sum(index_study_run(client, run_id) for run_id in run_ids)
    if indexed == len(run_ids):
        client.set_tag(index_run_id(client, experiment_id), n.TAG_INDEX_COMPLETE, "true")
    return indexed
