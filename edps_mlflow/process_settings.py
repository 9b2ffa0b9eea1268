"""What a command's process takes from its environment, read or set in one place, importing neither torch
nor MLflow (so the command line can use it before validating its input):

- MLflow's HTTP request settings, which MLflow reads from the environment at every request. Our processes
  give up on an unreachable server within about half a minute (MLflow's own defaults retry for minutes); a
  user's own setting wins. :func:`configure_process` sets them once, when a command's process starts (its
  worker processes and ``mlflow run`` children inherit them; Ray's workers get :func:`request_settings`).
  Library code never sets them, so nothing leaks from one caller (or test) into the next.
- The run that ``mlflow run`` made for this process (``MLFLOW_RUN_ID``): :func:`launcher_run_id`.
"""

from __future__ import annotations

import os
from typing import MutableMapping

HTTP_CLIENT_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def configure_process(environment: MutableMapping[str, str] | None = None) -> None:
    """Our request defaults where MLflow reads them, unless the user set their own."""
    environment = os.environ if environment is None else environment
    for name, value in HTTP_CLIENT_DEFAULTS.items():
        environment.setdefault(name, value)


def request_settings() -> dict[str, str]:
    """This process's request settings, for processes that do not inherit its environment (Ray's)."""
    return {name: os.environ[name] for name in HTTP_CLIENT_DEFAULTS if name in os.environ}


def launcher_run_id() -> str | None:
    """The run id that ``mlflow run`` passes to its entry point (``MLFLOW_RUN_ID``), if any."""
    return os.environ.get("MLFLOW_RUN_ID") or None
