"""What a command's process takes from its environment, read or set in one place, importing neither torch
nor MLflow (so the command line can use it before validating its input):

- MLflow's HTTP request settings, which MLflow reads from the environment at every request. Our processes
  give up on an unreachable server within about half a minute (MLflow's own defaults retry for minutes); a
  user's own setting wins. :func:`configure_process` sets them once, when a command's process starts (its
  worker processes and ``mlflow run`` children inherit them; Ray's workers get :func:`request_settings`).
  Library code never sets them, so nothing leaks from one caller (or test) into the next.
- libpq's connect timeout (``PGCONNECT_TIMEOUT``), which bounds every later connection of a PostgreSQL
  store's client (the first one is bounded by ``store.require_database``).
- The command's log file (``EDPS_LOG_FILE``): where MLflow's, alembic's and SQLAlchemy's log records go
  instead of the terminal (``store.route_library_logs``), one file per command, shared by its processes.
- The run that ``mlflow run`` made for this process (``MLFLOW_RUN_ID``): :func:`launcher_run_id`.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import MutableMapping

CLIENT_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
                        "PGCONNECT_TIMEOUT": "10"}
LOG_FILE_VARIABLE = "EDPS_LOG_FILE"


def configure_process(environment: MutableMapping[str, str] | None = None, program: str = "edps") -> None:
    """Our request defaults where MLflow reads them, unless the user set their own; the command's log file
    (created when something is first logged to it)."""
    environment = os.environ if environment is None else environment
    for name, value in CLIENT_DEFAULTS.items():
        environment.setdefault(name, value)
    # In the temporary folder, not beside the store: the store's disk may be the full or read-only one.
    folder = Path(tempfile.gettempdir()) / "edps-mlflow-logs"
    environment.setdefault(LOG_FILE_VARIABLE, str(folder / f"{program}-{time.strftime('%Y%m%d-%H%M%S')}-"
                                                           f"{os.getpid()}.log"))


def library_log_file() -> Path | None:
    """The command's log file (:data:`LOG_FILE_VARIABLE`); None outside a command (a library caller, a test)."""
    value = os.environ.get(LOG_FILE_VARIABLE)
    return Path(value) if value else None


def log_note() -> str:
    """`` (MLflow's log: PATH)`` when the command's log file holds something, to end its error line with; else ``""``."""
    path = library_log_file()
    try:
        return f" (MLflow's log: {path})" if path is not None and path.stat().st_size > 0 else ""
    except OSError:
        return ""


def request_settings() -> dict[str, str]:
    """This process's request settings, for processes that do not inherit its environment (Ray's)."""
    return {name: os.environ[name] for name in CLIENT_DEFAULTS if name in os.environ}


def launcher_run_id() -> str | None:
    """The run id that ``mlflow run`` passes to its entry point (``MLFLOW_RUN_ID``), if any."""
    return os.environ.get("MLFLOW_RUN_ID") or None

