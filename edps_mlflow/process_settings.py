"""What a command's process takes from its environment, read or set in one place, without torch or MLflow (the
command line uses it before it validates its input): MLflow's HTTP request settings and libpq's connect timeout
(they bound each request in the middle of work; a user's own setting wins), how long the store may stay
unreachable in the middle of work (``EDPS_OUTAGE_SECONDS``), the lease of runs and locks, when the process started
(the store's first answer is bounded from there), the command's log file for the libraries' log records
(store/logs.py), and the run that ``mlflow run`` made for us; and how a store error ends a command
(:func:`store_errors_in_one_line`).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, MutableMapping, NoReturn

from edps_mlflow.errors import EdpsError
from edps_mlflow.locks import proc_stat

# One retry, at once (urllib3 waits before the second only): every store call in the middle of work retries for
# itself (store/client.py call_store), so that an outage is said and bounded by EDPS_OUTAGE_SECONDS, not hidden in
# MLflow's own backoff; a request to a server that never answers takes 20 s, longer than a first answer's bound.
CLIENT_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
                   "PGCONNECT_TIMEOUT": "10"}
LOG_FILE_VARIABLE = "EDPS_LOG_FILE"
OUTAGE_VARIABLE = "EDPS_OUTAGE_SECONDS"
DEFAULT_OUTAGE_SECONDS = 300.0
LEASE_VARIABLE = "EDPS_LEASE_SECONDS"
DEFAULT_LEASE_SECONDS = 120.0


def configure_process(environment: MutableMapping[str, str] | None = None, program: str = "edps") -> None:
    """Our request defaults where MLflow reads them, unless the user set their own, and the command's log file
    (created when something is first logged to it). Set once, when a command's process starts (its workers and
    ``mlflow run`` children inherit them); library code never sets them, so nothing leaks from one caller into
    the next."""
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
    """`` (MLflow's log: PATH)`` to end an error line with, when the command's log file holds something."""
    path = library_log_file()
    try:
        return f" (MLflow's log: {path})" if path is not None and path.stat().st_size > 0 else ""
    except OSError:
        return ""


def outage_seconds() -> float:
    """How long a store call in the middle of work waits for an unreachable store (``EDPS_OUTAGE_SECONDS``, default
    300): a server restarting, a network away; then the command gives up."""
    return seconds_setting(OUTAGE_VARIABLE, DEFAULT_OUTAGE_SECONDS)


def seconds_setting(variable: str, default: float, least: float = 0.0, most: float = float("inf")) -> float:
    """The seconds that ``variable`` sets, ``default`` when unset; above ``least`` (at least it when it is not 0)
    and finite, at most ``most``, else one line (EdpsError)."""
    text = os.environ.get(variable, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and (least <= value if least else value > 0) and value <= most):
        bounds = f"between {least:g} and {most:g}" if math.isfinite(most) else "above 0"
        raise EdpsError(f"{variable} must be a number of seconds {bounds}, got {text!r}")
    return value


def request_settings() -> dict[str, str]:
    """This process's request settings, for processes that do not inherit its environment (Ray's)."""
    return {name: os.environ[name] for name in CLIENT_DEFAULTS if name in os.environ}


def lease_seconds() -> float:
    """How long a run, or a new store's creation lock, stays live after its owner's last heartbeat
    (``EDPS_LEASE_SECONDS``, default 120)."""
    return seconds_setting(LEASE_VARIABLE, DEFAULT_LEASE_SECONDS, 1.0, 86_400.0)


def process_age() -> float:
    """Seconds since this process started, interpreter start-up included (the launcher's re-execution keeps the
    process and its start); read from /proc, so 0.0 where there is none."""
    fields = proc_stat("self")
    if fields is None:
        return 0.0
    try:
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (ValueError, IndexError, AttributeError):
        return 0.0


def launcher_run_id() -> str | None:
    """The run id that ``mlflow run`` passes to its entry point (``MLFLOW_RUN_ID``), if any."""
    return os.environ.get("MLFLOW_RUN_ID") or None


def end_with(error: EdpsError, own_process: bool) -> NoReturn:
    """Exit with the error's code, once its line is printed; at once for an error that ``ends_at_once`` (the bound
    its line states includes the command's end) in a process of its own, not inside another program (a test)."""
    if error.ends_at_once and own_process:
        logging.shutdown()  # the command's log file, flushed
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(error.exit_code)
    sys.exit(error.exit_code)


@contextmanager
def store_errors_in_one_line(program: str) -> Iterator[None]:
    """A tracking-store error, or a full or read-only disk, escaping a command: one line and exit code 2, not a
    traceback. Afterwards MLflow's loggers are as they were before the command routed them to its log file (for a
    command run inside another program, a test); a command that never opened the store changed nothing."""
    try:
        yield
    except Exception as error:
        from edps_mlflow.store.trouble import store_error_line  # imports MLflow: only once a command has failed

        line = store_error_line(error)
        if line is None:
            raise
        print(f"{program}: error: {line}{log_note()}", file=sys.stderr)
        sys.exit(2)
    finally:
        logs = sys.modules.get("edps_mlflow.store.logs")
        if logs is not None:
            logs.restore_library_logs()

