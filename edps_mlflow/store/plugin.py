"""edps-mlflow's plugin of MLflow's tracking stores (entry-point group ``mlflow.tracking_store``): in every
process where edps-mlflow is installed, a sqlite store that does not exist yet is built safely before MLflow
opens it (sqlite.py). MLflow loads this module while importing its tracking package: it imports nothing.
"""

from __future__ import annotations

from typing import Any


def sqlite_store(store_uri: str, artifact_uri: str | None = None) -> Any:
    """MLflow's store of a sqlite URI, built safely when the database does not exist yet."""
    from edps_mlflow.store.sqlite import mlflow_sqlite_store

    return mlflow_sqlite_store(store_uri, artifact_uri)
