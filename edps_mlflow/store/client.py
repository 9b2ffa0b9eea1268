"""The store as a service: a client that survives blips, paged searches and batched writes.

    client = open_store()                 # at the start of a command: created safely when new, checked
    client = connect(uri)                 # in a worker of a command that opened it already
    runs = search_all(client, experiment_id, filter_string(tags={...}))
"""

from __future__ import annotations

import random
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar
from urllib.parse import quote

from mlflow.entities import Metric, Param, Run, RunTag, ViewType
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient, get_tracking_uri

from edps_mlflow import names as n
from edps_mlflow.errors import EdpsError
from edps_mlflow.filters import filter_string
from edps_mlflow.interrupts import store_call
from edps_mlflow.process_settings import OUTAGE_VARIABLE, outage_seconds, process_age
from edps_mlflow.store.index import Search, every_page
from edps_mlflow.store.logs import route_library_logs
from edps_mlflow.store.sqlite import initialise_store, require_writable
from edps_mlflow.store.trouble import StoreTrouble, is_disk_error, store_error_text, store_trouble, uri_error
from edps_mlflow.uris import quiet_links_with_credentials, redact_uri, require_encoded_userinfo, sqlite_path, store_uri

# Errors that pass: a busy sqlite file, a server restarting or overloaded, a dropped connection (also one
# dropped in the middle of an answer: "Connection broken: IncompleteRead", a server killed while it replied).
_UNREACHABLE_MARKERS = ("connection reset", "connection aborted", "connection refused", "connection broken",
                        "max retries exceeded", "remote end closed", "timed out", "temporarily unavailable",
                        "too many requests", "internal server error", "bad gateway", "service unavailable",
                        "gateway timeout", "status code 500", "status code 502", "status code 503",
                        "status code 504", "too many 500 error", "too many 502 error", "too many 503 error",
                        "too many 504 error")
# A locked sqlite store: tries per call (about two minutes with MLflow's busy timeout); its holder is a process
# that the error line names. An unreachable store is waited for up to EDPS_OUTAGE_SECONDS instead.
STORE_ATTEMPTS = 5
WAIT_SAID_AFTER = 5.0  # seconds of waiting for the store before a process says so, once per call
_T = TypeVar("_T")


def resolve_tracking_uri(tracking_uri: str | None = None) -> str:
    """The URI given, else what MLflow resolves now, made explicit for worker processes and other machines; one
    whose user information is not validly percent-encoded, a bare path other than a ``.db`` file or a local store in
    a missing folder is refused here, before any connection (uris.store_uri)."""
    uri = tracking_uri or get_tracking_uri()
    require_encoded_userinfo(uri)
    return store_uri(uri)


def call_store(action: Callable[[], _T], attempts: int = STORE_ATTEMPTS, uri: str = "") -> _T:
    """``action()``, tried again with bounded, jittered backoff while it fails transiently: ``attempts`` times
    while the store is locked, and up to :func:`outage_seconds` from the call's start while it is unreachable
    (one line on stdout once that passes :data:`WAIT_SAID_AFTER`; past it, an EdpsError naming the setting).
    ``attempts=1``: tried once, never waited."""
    started, attempt, said = time.monotonic(), 0, False
    while True:
        try:
            with store_call():  # a SIGTERM waits for the call's end: no transaction left open
                return action()
        except (MlflowException, OSError) as error:
            text, attempt = str(error).lower(), attempt + 1
            pause = min(8.0, 0.5 * 2 ** (attempt - 1)) * (0.5 + random.random())
            if store_trouble(error) is StoreTrouble.LOCKED:
                if attempt >= attempts:
                    raise
            elif not any(marker in text for marker in _UNREACHABLE_MARKERS) or attempts == 1:
                raise
            else:
                # Counted from the call's start: a try's own time (a request that timed out) is part of the wait.
                waited, bound, where = time.monotonic() - started, outage_seconds(), uri or get_tracking_uri()
                if waited >= bound:
                    raise EdpsError(f"tracking store {redact_uri(where)} unreachable for {waited:.0f} s, longer "
                                    f"than {OUTAGE_VARIABLE}={bound:g} (set it higher to wait longer): "
                                    f"{store_error_text(error, where)}") from error
                pause = min(pause, bound - waited)
                if not said and waited + pause >= WAIT_SAID_AFTER:
                    said = True
                    print(f"waiting for tracking store {redact_uri(where)}, unreachable for {waited:.0f} s, up to "
                          f"{bound:g} s ({OUTAGE_VARIABLE})", flush=True)
            time.sleep(pause)


class StoreClient:
    """An MlflowClient whose every call survives transient store errors (:func:`call_store`). A retried write
    may land twice when the first try succeeded unseen, with the same values: nothing that we read changes."""

    def __init__(self, tracking_uri: str, attempts: int = STORE_ATTEMPTS, client: MlflowClient | None = None) -> None:
        self._client = client or MlflowClient(tracking_uri)
        self.tracking_uri = tracking_uri
        self.attempts = attempts

    def without_retries(self) -> StoreClient:
        """The same client, each call tried once: for best-effort writes after the store failed (an abort)."""
        return StoreClient(self.tracking_uri, attempts=1, client=self._client)

    def log_artifact(self, run_id: str, local_path: str, artifact_path: str | None = None) -> None:
        """A full or read-only disk names where the run's artifacts go (the OS's error from the copy names none)."""
        try:
            call_store(lambda: self._client.log_artifact(run_id, local_path, artifact_path), self.attempts,
                       self.tracking_uri)
        except OSError as error:
            if not is_disk_error(error) or error.filename:
                raise
            try:
                where = self._client.get_run(run_id).info.artifact_uri
            except Exception:  # noqa: BLE001 - the store failing too: the error as it was
                raise error from None
            raise OSError(error.errno, error.strerror, redact_uri(where)) from error

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute):
            return attribute

        def retried(*args: Any, **kwargs: Any) -> Any:
            return call_store(lambda: attribute(*args, **kwargs), self.attempts, self.tracking_uri)

        return retried


def connect(tracking_uri: str | None = None) -> StoreClient:
    """A client of the store, resolved once, retrying blips, for a worker of a command that reached the store. An
    unknown scheme, a retired backend or a missing database driver is one line; a database that does not answer is
    an outage, waited for up to :func:`outage_seconds` (require_database)."""
    uri = resolve_tracking_uri(tracking_uri)
    quiet_links_with_credentials(uri)
    route_library_logs()
    require_database(uri, Deadline.of_outage())
    try:
        return StoreClient(uri)
    except (MlflowException, ImportError) as error:
        raise uri_error(uri, error) from None


def open_store(tracking_uri: str | None = None, writes: bool = False) -> StoreClient:
    """The store, checked once at the start of a command: created safely when new, reachable, usable, and
    (``writes``: for commands that record runs) writable now; else one line naming it."""
    uri = resolve_tracking_uri(tracking_uri)
    quiet_links_with_credentials(uri)
    route_library_logs()
    try:
        if sqlite_path(uri) is None:
            require_answer(uri)
            created = None
        else:
            # Before any client: making an MlflowClient of a sqlite store already creates and migrates it.
            created = initialise_store(uri)
    except (MlflowException, OSError, ImportError) as error:
        raise uri_error(uri, error) from None
    if created is not None:
        # A typo in the URI would otherwise train into a store nobody will look at.
        print(f"created a new tracking store at {created} (none was there; if you expected one, check "
              "MLFLOW_TRACKING_URI)", flush=True)
    elif writes and sqlite_path(uri) is not None:
        require_writable(uri)  # a read-only, full or locked store stops the command before any work
    return connect(uri)


# ---- a store's first answer, bounded from the command's start ---------------------------------------------
FIRST_ANSWER_SECONDS = 20.0  # a command whose store (server or database) has not answered by then ends
_LEAST_SECONDS = 10.0  # from a late first request to the command's end
_EXIT_SECONDS = 4.0  # of the bound, kept for the command's own end (its line; NoAnswer skips the teardown)
_DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")
# A database restarting answers these for a few seconds; anything else (a wrong password) is an answer.
_NOT_YET_MARKERS = ("connection refused", "timeout expired", "timed out", "could not connect", "starting up",
                    "server closed the connection", "can't connect", "lost connection", "connection reset")
_reached_databases: set[str] = set()
_answered: set[str] = set()


@dataclass(frozen=True)
class Deadline:
    """When a store must have answered (``time.monotonic()``), and that bound as the line giving up states it."""

    at: float
    bound: str

    @classmethod
    def of_command(cls) -> Deadline:
        """The command ends by :data:`FIRST_ANSWER_SECONDS` from its start, or by :data:`_LEAST_SECONDS` from now
        when it asks later than that allows (a command that loaded torch and its data, under load); the store has
        until :data:`_EXIT_SECONDS` before that end to answer."""
        age = process_age()
        if age + _LEAST_SECONDS <= FIRST_ANSWER_SECONDS:
            return cls(time.monotonic() + FIRST_ANSWER_SECONDS - _EXIT_SECONDS - age,
                       f"within {FIRST_ANSWER_SECONDS:g} s of the command's start")
        return cls(time.monotonic() + _LEAST_SECONDS - _EXIT_SECONDS,
                   f"within {_LEAST_SECONDS:g} s of the first request, made {age:.0f} s after the command's start")

    @classmethod
    def of_outage(cls) -> Deadline:
        """For a worker's connection, in the middle of its command's work: the store was there."""
        bound = outage_seconds()
        return cls(time.monotonic() + bound, f"within {bound:g} s ({OUTAGE_VARIABLE})")


class NoAnswer(EdpsError):
    """A store that did not answer by its deadline: the command ends at once after its line (a request may be left
    waiting in a thread, and the interpreter's teardown takes seconds with torch loaded, more under load)."""

    ends_at_once = True


def require_answer(uri: str) -> None:
    """A server or database store's first answer by :meth:`Deadline.of_command`, else one line (:class:`NoAnswer`);
    once per store and process. MLflow's own timeouts and retries are per request and add up to a minute against
    a server that accepts and never answers. A sqlite store answers: its file is here."""
    if uri in _answered or sqlite_path(uri) is not None:
        return
    deadline = Deadline.of_command()
    require_database(uri, deadline)
    client = MlflowClient(uri)
    if not _answered_by(deadline, lambda: client.search_experiments(max_results=1)):
        raise _no_answer(uri, deadline, None)
    _answered.add(uri)


def _answered_by(deadline: Deadline, action: Callable[[], object]) -> bool:
    """``action()`` in a thread: True when it returned by the deadline (its error is raised here), False when it
    had not. A driver's or MLflow's wait cannot be cut short: the thread is left to end on its own."""
    outcome: list[BaseException | None] = []

    def attempt() -> None:
        try:
            action()
            outcome.append(None)
        except BaseException as error:  # noqa: BLE001 - raised again in the caller's thread
            outcome.append(error)

    thread = threading.Thread(target=attempt, name="edps-first-answer", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline.at - time.monotonic()))
    if not outcome:
        return False
    if outcome[0] is not None:
        raise outcome[0]
    return True


def _no_answer(uri: str, deadline: Deadline, error: BaseException | None) -> NoAnswer:
    cause = f" ({store_error_text(error, uri)})" if error is not None else ""
    return NoAnswer(f"tracking store {redact_uri(uri)} did not answer {deadline.bound}{cause}; check that it runs "
                    "and listens there, then run the same command again")


def require_database(uri: str, deadline: Deadline) -> None:
    """For a database store: one connection made by ``deadline``, else one line. MLflow's own first connection
    tries for about 100 s, and minutes on a port that drops packets; libpq waits its connect timeout once for each
    address of a host."""
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower()
    if scheme not in _DATABASE_SCHEMES or uri in _reached_databases:
        return
    import sqlalchemy  # a database store's driver layer: not imported for sqlite or server stores
    from sqlalchemy.pool import NullPool

    try:
        url = sqlalchemy.engine.make_url(uri)
    except sqlalchemy.exc.ArgumentError as error:
        raise uri_error(uri, error) from None
    refusals: list[BaseException] = []

    def connect_when_up() -> None:
        pause = 0.5
        while True:
            # libpq and the MySQL drivers take whole seconds, at least 2 for libpq.
            left = int(deadline.at - time.monotonic())
            timeout = {} if scheme == "mssql" or "connect_timeout" in url.query else {"connect_timeout": max(2, left)}
            engine = sqlalchemy.create_engine(url, poolclass=NullPool, connect_args=timeout)
            try:
                with engine.connect():
                    return
            except sqlalchemy.exc.DBAPIError as error:
                if not _not_yet(error) or time.monotonic() + pause >= deadline.at:
                    raise
                refusals[:] = [error]
            finally:
                engine.dispose()
            time.sleep(pause)
            pause = min(4.0, pause * 2)

    try:
        answered = _answered_by(deadline, connect_when_up)
    except (ImportError, sqlalchemy.exc.NoSuchModuleError) as error:  # no driver installed
        raise uri_error(uri, error) from None
    except sqlalchemy.exc.DBAPIError as error:
        if not _not_yet(error):
            raise uri_error(uri, error) from None
        raise _no_answer(uri, deadline, error) from None
    if not answered:
        raise _no_answer(uri, deadline, refusals[-1] if refusals else None)
    _reached_databases.add(uri)


def _not_yet(error: BaseException) -> bool:
    return any(marker in str(error).lower() for marker in _NOT_YET_MARKERS)


# ---- searches and writes ---------------------------------------------------------------------------------
def search_all(client: StoreClient, experiment_id: str, conditions: str) -> list[Run]:
    """Every active run of the experiment matching ``conditions`` (``filters.filter_string``), page by page."""
    return searcher(client, [experiment_id])(conditions)


def every_experiment(client: StoreClient) -> list[Any]:
    """Every active experiment of the store, page by page."""
    return every_page(lambda size, token: client.search_experiments(max_results=size, page_token=token))


def searcher(client: StoreClient, experiment_ids: list[str]) -> Search:
    """The study index's search over ``experiment_ids`` (index.Search)."""
    def runs_found(conditions: str, deleted: bool, most: int | None) -> list[Run]:
        view = ViewType.DELETED_ONLY if deleted else ViewType.ACTIVE_ONLY
        return every_page(lambda size, token: client.search_runs(
            experiment_ids, filter_string=conditions, run_view_type=view, max_results=size, page_token=token), most)

    return Search(tuple(str(experiment_id) for experiment_id in experiment_ids), runs_found)


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
    timestamp = int(time.time() * 1000)
    metric_list = [Metric(k, float(v), timestamp, step) for k, v in (metrics or {}).items()]
    param_list = [Param(k, display_value(v)) for k, v in (params or {}).items()]
    tag_list = [RunTag(k, str(v)) for k, v in (tags or {}).items()]
    while metric_list or param_list or tag_list:  # at most 1,000 metrics, 100 params and 100 tags per call
        client.log_batch(run_id, metrics=metric_list[:1000], params=param_list[:100], tags=tag_list[:100])
        metric_list, param_list, tag_list = metric_list[1000:], param_list[100:], tag_list[100:]


def log_points(client: StoreClient, run_id: str, points: list[tuple[str, float, int]]) -> None:
    """Metric values each at its own step (name, value, step): a curve against the batch size, say."""
    timestamp = int(time.time() * 1000)
    metrics = [Metric(name, float(value), timestamp, int(step)) for name, value, step in points]
    for start in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[start:start + 1000])


def log_text(client: StoreClient, run_id: str, name: str, text: str) -> None:
    """``text`` as the run's artifact ``name``."""
    with tempfile.TemporaryDirectory(prefix="edps-artifact-") as folder:
        (Path(folder) / name).write_text(text)
        client.log_artifact(run_id, str(Path(folder) / name))


def ui_link(tracking_uri: str, experiment_id: str, run_id: str | None = None, charts: bool = False) -> str:
    """Where to look in the MLflow UI, in its machine-learning view: the run (``charts``: its Model metrics tab,
    where a sweep's or an analysis' curves are drawn), else the experiment's study runs; for a local store, how
    to start the UI."""
    # Without the view parameter MLflow 3 opens a run under its GenAI "Evaluations" pages.
    page = (f"#/experiments/{experiment_id}/runs/{run_id}" + ("/model-metrics" if charts else "") if run_id
            else f"#/experiments/{experiment_id}/runs") + "?workflowType=machine_learning"
    if not run_id:
        # The experiment's study runs (under their sweep runs), not its newest runs: the UI loads 100 runs at a
        # time, newest first, which in a sweep of many studies are the trials of one study (docs/tracking.md).
        page += "&searchFilter=" + quote(filter_string(tags={n.TAG_KIND: n.KIND_STUDY}), safe="")
    if tracking_uri.startswith(("http://", "https://")):
        return f"MLflow UI: {redact_uri(tracking_uri).rstrip('/')}/{page}"
    return f"MLflow UI (start it with `mlflow ui --backend-store-uri {redact_uri(tracking_uri)}`): " \
           f"http://127.0.0.1:5000/{page}"
