"""An experiment by name, created with its study index when new; a run of ours in it; the marks that
``edps doctor`` leaves on it."""

from __future__ import annotations

import os
import re
from pathlib import Path

from mlflow.exceptions import MlflowException

from edps_mlflow import __version__
from edps_mlflow import names as n
from edps_mlflow.descriptions import provenance_tags
from edps_mlflow.errors import EdpsError
from edps_mlflow.store.client import StoreClient, log_batch
from edps_mlflow.store.trouble import store_errors
from edps_mlflow.store.write.index import make_index_run
from edps_mlflow.uris import sqlite_path


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
    """A run with ``tags`` from its first moment: the run ``mlflow run`` made for us (``launcher_run_id``), else a
    new one; its id."""
    with store_errors(client):
        if launcher_run_id:
            log_batch(client, launcher_run_id, tags={**tags, **provenance_tags(launched_by_mlflow=True)})
            return launcher_run_id
        return client.create_run(experiment_id, tags={**tags, **provenance_tags()}).info.run_id


def artifact_location_for(tracking_uri: str, experiment_name: str) -> str | None:
    """For a sqlite store, a folder next to the database file (``<db stem>-artifacts/<experiment>``), so
    that two stores used from one working directory never mix their artifacts; otherwise the store's
    default (None)."""
    database = sqlite_path(tracking_uri)
    if database is None:
        return None
    folder = re.sub(r"[^A-Za-z0-9_.-]+", "_", experiment_name).strip("._") or "experiment"
    return (database.absolute().parent / f"{database.stem}-artifacts" / folder).as_uri()


def record_doctor_check(client: StoreClient, experiment_id: str, checked_until: int | None,
                        recheck: list[str], searched_keyless: bool) -> None:
    """What the next ``edps doctor`` need not read again: the runs that started or ended before ``checked_until``
    (ms; None: the next check reads every run) but for ``recheck``; ``searched_keyless``: whether they were
    checked for their kind and keys too. Best effort: a store that refuses it gets a full check next time."""
    try:
        client.set_experiment_tag(experiment_id, n.EXPERIMENT_TAG_CHECKED_UNTIL,
                                  "" if checked_until is None else str(checked_until))
        client.set_experiment_tag(experiment_id, n.EXPERIMENT_TAG_RECHECK, ",".join(recheck))
        client.set_experiment_tag(experiment_id, n.EXPERIMENT_TAG_SEARCHED_KEYLESS, str(searched_keyless).lower())
    except MlflowException:
        pass
