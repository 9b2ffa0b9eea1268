"""The tracking store as a service: one client per process that survives blips, a store built safely the
first time, one-line store errors, paged searches, and MLflow's request settings.

    client = open_store()                 # at the start of a command: created safely when new, checked
    client = connect(uri)                 # in a worker of a command that opened it already
    runs = search_all(client, experiment_id, filter_string(tags={...}))

Every other module reaches MLflow through a :class:`StoreClient` from here (writes in tracking.py and
ownership.py, reads in registry.py). MLflow's request settings are set once per process, by
``process_settings.configure_process``.

This module imports neither torch nor the engine.
"""

from __future__ import annotations

import fcntl
import logging
import os
import random
import re
import sqlite3
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from mlflow.entities import Metric, Param, Run, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from edps_mlflow.errors import EdpsError
from edps_mlflow.interrupts import store_call
from edps_mlflow.names import MLFLOW_NOTE, default_experiment
from edps_mlflow.uris import (
    explain_store_error,
    quiet_links_with_credentials,
    redact_uri,
)

_BATCH_LIMIT = 1000  # metrics per log_batch call (MLflow's limit; 100 params and 100 tags)


def _now_ms() -> int:
    return int(time.time() * 1000)


def resolve_tracking_uri(tracking_uri: str | None = None) -> str:
    """The URI given, else what MLflow resolves now (the environment, else its default local store),
    made explicit so that worker processes and other machines write to the same store."""
    if tracking_uri:
        return tracking_uri
    from mlflow.tracking import get_tracking_uri

    return get_tracking_uri()


def ui_link(tracking_uri: str, experiment_id: str, run_id: str | None = None) -> str:
    """Where to look in the MLflow UI, in its machine-learning view: the run, else the experiment's runs.

    A store reached over HTTP serves the UI itself; for a local store the line says how to start one.
    """
    # Without the view parameter MLflow 3 opens a run under its GenAI "Evaluations" pages.
    page = (f"#/experiments/{experiment_id}/runs/{run_id}" if run_id
            else f"#/experiments/{experiment_id}/runs") + "?workflowType=machine_learning"
    if tracking_uri.startswith(("http://", "https://")):
        return f"MLflow UI: {redact_uri(tracking_uri).rstrip('/')}/{page}"
    return f"MLflow UI (start it with `mlflow ui --backend-store-uri {redact_uri(tracking_uri)}`): " \
           f"http://127.0.0.1:5000/{page}"


def uri_error(uri: str, error: BaseException) -> EdpsError:
    """Any error about the store ``uri`` as one line, without the credentials of any URI in it."""
    return EdpsError(describe_store_error(uri, error))


# Errors that pass: a busy sqlite file, a server restarting or overloaded, a dropped connection.
_TRANSIENT_MARKERS = ("database is locked", "database table is locked", "connection reset", "connection aborted",
                      "connection refused", "max retries exceeded", "remote end closed", "timed out",
                      "temporarily unavailable", "too many requests", "internal server error", "bad gateway",
                      "service unavailable", "gateway timeout", "status code 500", "status code 502",
                      "status code 503", "status code 504", "too many 500 error", "too many 502 error",
                      "too many 503 error", "too many 504 error")
STORE_ATTEMPTS = 5  # tries per store call in the middle of work; about a minute with MLflow's own retries
_T = TypeVar("_T")


def is_transient(error: BaseException) -> bool:
    """Whether a store error is worth another try (a blip), not a real answer."""
    text = str(error).lower()
    return any(marker in text for marker in _TRANSIENT_MARKERS)


def call_store(action: Callable[[], _T], attempts: int = STORE_ATTEMPTS) -> _T:
    """``action()``, tried again with bounded, jittered backoff while it fails transiently."""
    for attempt in range(attempts):
        try:
            with store_call():  # a SIGTERM waits for the call's end: no transaction left open
                return action()
        except (MlflowException, OSError) as error:
            if attempt == attempts - 1 or not is_transient(error):
                raise
            time.sleep(min(8.0, 0.5 * 2 ** attempt) * (0.5 + random.random()))
    raise AssertionError("unreachable")


class StoreClient:
    """An MlflowClient whose every call survives transient store errors (see :func:`call_store`).

    A retried write may land twice when the first try succeeded unseen: metric points and tags
    are then written twice with the same values, which changes nothing that we read.
    """

    def __init__(self, tracking_uri: str) -> None:
        self._client = MlflowClient(tracking_uri)
        self.tracking_uri = tracking_uri

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute):
            return attribute

        def retried(*args: Any, **kwargs: Any) -> Any:
            return call_store(lambda: attribute(*args, **kwargs))

        return retried


def connect(tracking_uri: str | None = None) -> StoreClient:
    """A client of the store, resolved once (see :func:`resolve_tracking_uri`), retrying blips.

    MLflow refuses an unknown scheme (``foo://``) or a retired backend when the client is made, and
    a missing database driver surfaces as an ImportError: each becomes the one line the user sees.
    """
    uri = resolve_tracking_uri(tracking_uri)
    quiet_links_with_credentials(uri)
    try:
        return StoreClient(uri)
    except (MlflowException, ImportError) as error:
        raise uri_error(uri, error) from None


def open_store(tracking_uri: str | None = None) -> StoreClient:
    """The store, checked once at the start of a command: created safely when new, reachable, usable;
    else one line naming it."""
    uri = resolve_tracking_uri(tracking_uri)
    quiet_links_with_credentials(uri)
    # Before any client: making an MlflowClient of a sqlite store already creates and migrates it, which
    # initialise_store does safely (under a lock, in a temporary file moved into place).
    try:
        created = initialise_store(uri)
    except (MlflowException, OSError, ImportError) as error:
        raise uri_error(uri, error) from None
    if created is not None:
        # A typo in the URI would otherwise train into a store nobody will look at.
        print(f"created a new tracking store at {created} (none was there; if you expected one, check "
              "MLFLOW_TRACKING_URI)", flush=True)
    return connect(uri)


def describe_store_error(uri: str, error: BaseException) -> str:
    """The one line a user sees for a store error: the store (without secrets) and the first line."""
    message = getattr(error, "message", None) or str(error) or type(error).__name__
    first = message.strip().splitlines()[0] if message.strip() else type(error).__name__
    # Redacted before it is cut: a cut through a password would leave its start unrecognised.
    first = redact_uri(first, str(uri))
    if len(first) > 300:
        first = first[:300] + "..."
    return f"tracking store {redact_uri(str(uri))}: {explain_store_error(first)}"


_STORE_LIBRARIES = ("mlflow", "requests", "urllib3", "sqlalchemy", "sqlite3", "psycopg2", "psycopg")


def store_error_line(error: BaseException, tracking_uri: str | None = None) -> str | None:
    """The one line for an error raised by the tracking store or its client libraries; None for others."""
    if type(error).__module__.split(".")[0] not in _STORE_LIBRARIES:
        return None
    return describe_store_error(tracking_uri or resolve_tracking_uri(), error)


def store_error(client: Any, error: MlflowException) -> EdpsError:
    """An MLflow error as the one line the user sees, naming the store without its secrets."""
    return uri_error(str(client.tracking_uri), error)


@contextmanager
def store_errors(client: Any) -> Iterator[None]:
    """Turn an MLflow error inside the block into the one line the user sees."""
    try:
        yield
    except MlflowException as error:
        raise store_error(client, error) from None


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for any other store)."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    path = tracking_uri[len("sqlite:///"):].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def _schema_head() -> str:
    # MLflow's newest schema revision (the alembic head of the MLflow installed here).
    from mlflow.store.db.utils import _get_latest_schema_revision

    return _get_latest_schema_revision()


def _sqlite_schema(path: Path) -> tuple[set[str], str | None]:
    """(table names, alembic revision) of a sqlite file, read without writing to it."""
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=20)
    try:
        tables = {row[0] for row in connection.execute("select name from sqlite_master where type = 'table'")}
        revision = None
        if "alembic_version" in tables:
            row = connection.execute("select version_num from alembic_version").fetchone()
            revision = row[0] if row else None
        return tables, revision
    finally:
        connection.close()


def _unusable_store(path: Path, uri: str) -> str | None:
    """Why the sqlite file at ``path`` cannot be used as it is, or None when it is fully migrated."""
    try:
        tables, revision = _sqlite_schema(path)
    except sqlite3.DatabaseError as error:
        return f"{path} is not a usable sqlite database ({error}); move it away"
    head = _schema_head()
    if revision == head and "runs" in tables and "experiments" in tables:
        return None
    holds_runs = "runs" in tables
    state = ("is empty" if not tables else f"has a half-migrated MLflow schema (revision {revision or 'none'}, "
             f"expected {head})")
    repair = (f"back it up and run `mlflow db upgrade {redact_uri(uri)}`" if holds_runs and revision
              else "it holds no usable runs: remove it (and its -journal/-wal files) and run again")
    return f"tracking store {redact_uri(uri)} {state}, probably left by a process killed while creating it; {repair}"


_SETTLE_SECONDS = 10.0  # a file another process is still migrating changes within this time


@contextmanager
def _quiet_loggers(*names: str) -> Iterator[None]:
    """Only warnings and errors from these loggers inside the block."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(logger.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def initialise_store(tracking_uri: str) -> Path | None:
    """Make sure the store exists and has MLflow's full schema before anything else opens it.

    MLflow migrates a new database in place, one step at a time (many seconds on a loaded machine):
    several processes doing that at once crash ("duplicate column name"), and a process killed
    half-way leaves a file that no later process can open. So a new sqlite store is built in a
    temporary file beside the target, under a file lock, and moved into place in one step: the
    target either does not exist or is complete. Other stores (servers, PostgreSQL) are touched once.
    Returns the path of the sqlite file when this call created it, else None.
    """
    path = sqlite_path(tracking_uri)
    if path is None:
        # One try, bounded by MLflow's own HTTP retries: an unreachable server fails fast at start.
        MlflowClient(tracking_uri).search_experiments(max_results=1)
        return None
    path = path.resolve()
    if path.exists() and path.stat().st_size > 0:
        problem = _settled_problem(path, tracking_uri)
        if problem:
            raise EdpsError(problem)
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when this process dies
        try:
            if path.exists():
                problem = _settled_problem(path, tracking_uri)
                if problem:
                    raise EdpsError(problem)
                return None
            # Builders hold the lock while they build: any temporary file left here is a dead one's.
            for leftover in path.parent.glob(f".{path.name}.*.new*"):
                leftover.unlink(missing_ok=True)
            temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.new")
            try:
                # MLflow creates and migrates the schema here. Its progress lines ("Creating initial
                # MLflow database tables...") are not for the user: a refused command says one line.
                with _quiet_loggers("mlflow.store.db.utils", "alembic"):
                    builder = MlflowClient(f"sqlite:///{temporary}")
                    builder.search_experiments(max_results=1)
                _close_engine(builder)
                problem = _unusable_store(temporary, f"sqlite:///{temporary}")
                if problem:
                    raise EdpsError(problem)
                os.replace(temporary, path)
                return path
            finally:
                temporary.unlink(missing_ok=True)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _close_engine(client: MlflowClient) -> None:
    # The builder's connections point at the file that is about to become the store: close them.
    engine = getattr(getattr(getattr(client, "_tracking_client", None), "store", None), "engine", None)
    if engine is not None:
        engine.dispose()


def _settled_problem(path: Path, uri: str) -> str | None:
    """What is wrong with an existing sqlite store, after giving a process that is still creating it
    (``mlflow`` itself, which takes no lock of ours) time to finish: None when it is usable."""
    deadline = time.monotonic() + _SETTLE_SECONDS
    last = None
    while True:
        problem = _unusable_store(path, uri)
        if problem is None:
            return None
        stat = path.stat()
        state = (stat.st_size, stat.st_mtime_ns)
        if state != last:
            last, deadline = state, time.monotonic() + _SETTLE_SECONDS
        elif time.monotonic() > deadline:
            return problem
        time.sleep(0.5)


def resolve_experiment(client: StoreClient, name: str, description: str = "") -> str:
    """The id of the experiment ``name``, created (with ``description``, Markdown) when it does not exist yet."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage != "active":
            raise EdpsError(f"experiment {name!r} is deleted; restore it or choose another name")
        return experiment.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location_for(str(client.tracking_uri), name),
                                        tags={MLFLOW_NOTE: description} if description else None)
    except MlflowException:
        # Another process created it in the meantime.
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def artifact_location_for(tracking_uri: str, experiment_name: str) -> str | None:
    """For a sqlite store, a folder next to the database file (``<db stem>-artifacts/<experiment>``), so
    that two stores used from one working directory never mix their artifacts; otherwise the store's
    default (None)."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    database = Path(tracking_uri[len("sqlite:///"):])
    if not database.is_absolute():
        database = Path.cwd() / database
    folder = re.sub(r"[^A-Za-z0-9_.-]+", "_", experiment_name).strip("._") or "experiment"
    return (database.parent / f"{database.stem}-artifacts" / folder).as_uri()


def experiment_name_for(workload: str, requested: str | None) -> str:
    """``--experiment``, else ``MLFLOW_EXPERIMENT_NAME``, else the workload's default experiment."""
    return requested or os.environ.get("MLFLOW_EXPERIMENT_NAME") or default_experiment(workload)


def search_all(client: StoreClient, experiment_id: str, conditions: str) -> list[Run]:
    """Every run matching ``conditions`` (built by ``filters.filter_string``), page by page."""
    runs: list[Run] = []
    token = None
    while True:
        page = client.search_runs([experiment_id], filter_string=conditions, max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs



def display_value(value: Any) -> str:
    """A param as people read it: floats without binary noise (0.1, not 0.10000000000000006), tuples as lists."""
    if isinstance(value, float):
        return f"{value:.12g}"
    if isinstance(value, (tuple, list)):
        return ",".join(display_value(v) for v in value)
    return str(value)


def log_batch(client: StoreClient, run_id: str, params: dict[str, Any] | None = None,
              tags: dict[str, str] | None = None, metrics: dict[str, float] | None = None, step: int = 0) -> None:
    """Params, tags and metrics of one run in as few requests as MLflow's limits allow (usually one)."""
    timestamp = _now_ms()
    metric_list = [Metric(k, float(v), timestamp, step) for k, v in (metrics or {}).items()]
    param_list = [Param(k, display_value(v)) for k, v in (params or {}).items()]
    tag_list = [RunTag(k, str(v)) for k, v in (tags or {}).items()]
    # MLflow's limits per call: 1,000 metrics, 100 params, 100 tags.
    while metric_list or param_list or tag_list:
        client.log_batch(run_id, metrics=metric_list[:_BATCH_LIMIT], params=param_list[:100], tags=tag_list[:100])
        metric_list, param_list, tag_list = metric_list[_BATCH_LIMIT:], param_list[100:], tag_list[100:]

