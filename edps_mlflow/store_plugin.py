"""The MLflow plugin's entry point under its name before the store package (`edps_mlflow.store.plugin` now), for
editable installs made before it: until `pip install -e .` is run again, MLflow still looks for it here."""

from edps_mlflow.store.plugin import sqlite_store  # noqa: F401
