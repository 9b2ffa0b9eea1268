"""edps-mlflow's plugin of MLflow's tracking stores: the builder of ``sqlite:`` stores.

pyproject.toml declares it in MLflow's entry-point group ``mlflow.tracking_store``, so in every process where
edps-mlflow is installed (``mlflow run``, ``mlflow server``, ``mlflow ui``, a script's MlflowClient) a sqlite
store that does not exist yet is built safely before MLflow opens it (sqlite.py). MLflow loads this module
while importing its tracking package: it imports nothing at import time.
"""

from __future__ import annotations

from typing import Any


def sqlite_store(store_uri: str, artifact_uri: str | None = None) -> Any:
    """MLflow's store of a sqlite URI, built safely when the database does not exist yet."""
    from edps_mlflow.store.sqlite import mlflow_sqlite_store

    return mlflow_sqlite_store(store_uri, artifact_uri)
