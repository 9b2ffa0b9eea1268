"""An experiment's bookkeeping, under ownership/ and write/: the experiment by name (made with its study index
when new), a run of ours in it, the study index's entries (index.py says why), and the marks doctor leaves."""

from __future__ import annotations

import os
import re
from contextlib import suppress

from mlflow.exceptions import MlflowException

from edps_mlflow import __version__
from edps_mlflow import names as n
from edps_mlflow.descriptions import provenance_tags
from edps_mlflow.errors import EdpsError
from edps_mlflow.filters import filter_string
from edps_mlflow.results import RunState
from edps_mlflow.store.client import StoreClient, log_batch, searcher
from edps_mlflow.store.index import entry_of, index_runs
from edps_mlflow.store.trouble import store_errors
from edps_mlflow.uris import sqlite_path

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
    """The experiment's index run (the earliest of two made at once), made when there is none: complete when the
    experiment holds no study run but ``own_run_id`` (one search by tag, once per experiment)."""
    found = index_runs(searcher(client, [experiment_id]))
    if found:
        return found[0].info.run_id
    studies = client.search_runs([experiment_id], filter_string(tags={n.TAG_KIND: n.KIND_STUDY}), max_results=2)
    return make_index_run(client, experiment_id, complete={r.info.run_id for r in studies} <= {own_run_id})


def index_study_run(client: StoreClient, run_id: str, was_study: bool = False) -> bool:
    """Write a study run's entry from the run as the store holds it now (``was_study``: one that gave its kind up);
    False when not written. Best effort: a run whose entry is missing or says RUNNING is read from the store."""
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
    """Index these study runs (those without an entry: doctor --repair), and when all were, mark the index
    complete; how many were."""
    indexed = sum(index_study_run(client, run_id) for run_id in run_ids)
    if indexed == len(run_ids):
        client.set_tag(index_run_id(client, experiment_id), n.TAG_INDEX_COMPLETE, "true")
    return indexed


def experiment_name_for(workload: str, requested: str | None) -> str:
    """``--experiment``, else ``MLFLOW_EXPERIMENT_NAME``, else the workload's default experiment."""
    return requested or os.environ.get("MLFLOW_EXPERIMENT_NAME") or n.default_experiment(workload)


def resolve_experiment(client: StoreClient, name: str, description: str = "") -> str:
    """The id of the experiment ``name``, created (with ``description``, Markdown) when it does not exist yet."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage != "active":
            raise EdpsError(f"experiment {name!r} is deleted; restore it or choose another name")
        return experiment.experiment_id
    tags = {n.EXPERIMENT_TAG_CREATED_BY: f"edps-mlflow {__version__}"}
    if description:
        tags[n.MLFLOW_NOTE] = description
    try:
        experiment_id = client.create_experiment(
            name, artifact_location=artifact_location_for(str(client.tracking_uri), name), tags=tags)
    except MlflowException:
        # Another process created it in the meantime.
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id
    # Made with its experiment, the study index holds every study run of it (index.py).
    make_index_run(client, experiment_id, complete=True)
    return experiment_id


def create_run(client: StoreClient, experiment_id: str, tags: dict[str, str], launcher_run_id: str | None) -> str:
    """The id of a run with ``tags`` from its first moment: ``launcher_run_id`` (``mlflow run``'s), else a new one."""
    with store_errors(client):
        if launcher_run_id:
            log_batch(client, launcher_run_id, tags={**tags, **provenance_tags(launched_by_mlflow=True)})
            return launcher_run_id
        return client.create_run(experiment_id, tags={**tags, **provenance_tags()}).info.run_id


def artifact_location_for(tracking_uri: str, experiment_name: str) -> str | None:
    """For a sqlite store, ``<db stem>-artifacts/<experiment>`` beside the database file (two stores used from one
    folder never mix their artifacts); otherwise the store's default (None)."""
    database = sqlite_path(tracking_uri)
    if database is None:
        return None
    folder = re.sub(r"[^A-Za-z0-9_.-]+", "_", experiment_name).strip("._") or "experiment"
    return (database.absolute().parent / f"{database.stem}-artifacts" / folder).as_uri()


def record_doctor_check(client: StoreClient, experiment_id: str, checked_until: int | None,
                        recheck: list[str], searched_keyless: bool) -> None:
    """What the next ``edps doctor`` need not read again: the runs that started or ended before ``checked_until``
    (ms; None: all) but ``recheck``, and whether they were checked for their kind and keys. Best effort."""
    with suppress(MlflowException):
        client.set_experiment_tag(experiment_id, n.EXPERIMENT_TAG_CHECKED_UNTIL,
                                  "" if checked_until is None else str(checked_until))
        client.set_experiment_tag(experiment_id, n.EXPERIMENT_TAG_RECHECK, ",".join(recheck))
        client.set_experiment_tag(experiment_id, n.EXPERIMENT_TAG_SEARCHED_KEYLESS, str(searched_keyless).lower())
