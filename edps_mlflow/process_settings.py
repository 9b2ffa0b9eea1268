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

import gc
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



# Python's cycle collector by default runs after every 700 allocations not yet freed; importing MLflow,
# SQLAlchemy and pandas makes several hundred thousand objects that live as long as the process, which
# the collector goes through again and again: about 0.5 s of a command's start on this machine. Every
# 10,000 allocations, it costs a few tenths less, and cyclic garbage still goes within a fraction of a MB.
COLLECTION_THRESHOLDS = (10_000, 10, 10)


def collect_less_often() -> None:
    """Called as a command's process starts (COLLECTION_THRESHOLDS), for the commands that read and
    report, not for those that train (``edps study``, ``edps sweep``): a cycle there may hold a model and its
    optimizer's state, which must go as soon as Python's default would free it, as in the trial workers.
    Only for a process that is the command: a test that calls a command's main in its own process keeps its
    settings."""
    gc.set_threshold(*COLLECTION_THRESHOLDS)


_paused = False  # the collector paused by pause_collection, until resume_collection


def pause_collection() -> None:
    """Called as a read command's process starts (after collect_less_often): the collector paused while the
    command imports its libraries and reads the store. Nearly all it makes then is either alive until the
    command ends (the modules of MLflow, SQLAlchemy and pandas) or freed at once without the collector (the
    rows read, which hold no cycles): at 1,500 study runs about 440,000 objects, which the collector went
    through for 0.15 to 0.2 s of the read, and 3,600 objects in cycles, which it would have freed. Only for a
    process that is the command, as collect_less_often."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume_collection() -> None:
    """Called once a read command has read the store, and in its forked children once they have imported their
    modules: what is alive then is frozen (the collector never goes through it again; the few cycles made
    while it was paused stay, a fraction of a MB) and the collector runs again, for what the command makes
    next. Nothing when the collector was not paused by pause_collection."""
    global _paused
    if _paused:
        gc.freeze()
        gc.enable()
        _paused = False


def skip_shutdown_collection() -> None:
    """Called as a command's process ends: Python's shutdown runs the cycle collector over every object
    still alive, which after importing MLflow, SQLAlchemy and pandas is several hundred thousand objects
    (about 0.9 s of every command on this machine, more than most reads), only to free memory the process
    gives back anyway. Frozen, they are left alone. atexit handlers (temporary folders, worker pools) still
    run and the standard streams are flushed; the young generations are collected first, so what the command
    just dropped is finalized. An object in a cycle that reached the oldest generation is never finalized:
    the commands close their files with ``with``, not by dropping them. Only for a process that ends with the
    command, as collect_less_often."""
    gc.collect(1)
    gc.freeze()
