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

import errno
import fcntl
import functools
import logging
import os
import random
import re
import shlex
import sqlite3
import sys
import time
import uuid
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar
from urllib.parse import quote

from mlflow.entities import Metric, Param, Run, RunStatus, RunTag, ViewType
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from edps_mlflow import __version__, study_index
from edps_mlflow import names as n
from edps_mlflow.errors import EdpsError
from edps_mlflow.filters import filter_string
from edps_mlflow.interrupts import store_call
from edps_mlflow.names import MLFLOW_NOTE, default_experiment
from edps_mlflow.process_settings import library_log_file
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
    if not run_id:
        # The experiment's study runs (under their sweep runs), not its newest runs: the UI loads 100 runs at a
        # time, newest first, which in a sweep of many studies are the trials of one study (docs/tracking.md).
        page += "&searchFilter=" + quote(filter_string(tags={n.TAG_KIND: n.KIND_STUDY}), safe="")
    if tracking_uri.startswith(("http://", "https://")):
        return f"MLflow UI: {redact_uri(tracking_uri).rstrip('/')}/{page}"
    return f"MLflow UI (start it with `mlflow ui --backend-store-uri {redact_uri(tracking_uri)}`): " \
           f"http://127.0.0.1:5000/{page}"


def uri_error(uri: str, error: BaseException) -> EdpsError:
    """Any error about the store ``uri`` as one line, without the credentials of any URI in it."""
    return EdpsError(describe_store_error(uri, error))


# Errors that pass: a busy sqlite file, a server restarting or overloaded, a dropped connection (also one
# dropped in the middle of an answer: "Connection broken: IncompleteRead", a server killed while it replied).
_TRANSIENT_MARKERS = ("database is locked", "database table is locked", "connection reset", "connection aborted",
                      "connection refused", "connection broken", "max retries exceeded", "remote end closed",
                      "timed out", "temporarily unavailable", "too many requests", "internal server error",
                      "bad gateway",
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

    def __init__(self, tracking_uri: str, attempts: int = STORE_ATTEMPTS, client: MlflowClient | None = None) -> None:
        self._client = client or MlflowClient(tracking_uri)
        self.tracking_uri = tracking_uri
        self.attempts = attempts

    def without_retries(self) -> StoreClient:
        """The same client, each call tried once: for best-effort writes after the store failed (an abort),
        which must not wait out the retries once more per run."""
        return StoreClient(self.tracking_uri, attempts=1, client=self._client)

    def log_artifact(self, run_id: str, local_path: str, artifact_path: str | None = None) -> None:
        """MlflowClient.log_artifact; a full or read-only disk names where the run's artifacts go (the OS's
        error from the copy names no file)."""
        try:
            call_store(lambda: self._client.log_artifact(run_id, local_path, artifact_path), self.attempts)
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
            return call_store(lambda: attribute(*args, **kwargs), self.attempts)

        return retried


def connect(tracking_uri: str | None = None) -> StoreClient:
    """A client of the store, resolved once (see :func:`resolve_tracking_uri`), retrying blips.

    MLflow refuses an unknown scheme (``foo://``) or a retired backend when the client is made, and
    a missing database driver surfaces as an ImportError: each becomes the one line the user sees. A
    database that does not answer is given up within :data:`DATABASE_CONNECT_SECONDS`.
    """
    uri = resolve_tracking_uri(tracking_uri)
    quiet_links_with_credentials(uri)
    route_library_logs()
    require_database(uri)
    try:
        return StoreClient(uri)
    except (MlflowException, ImportError) as error:
        raise uri_error(uri, error) from None


def open_store(tracking_uri: str | None = None, writes: bool = False) -> StoreClient:
    """The store, checked once at the start of a command: created safely when new, reachable, usable,
    and (``writes``: for commands that record runs) writable now; else one line naming it."""
    uri = resolve_tracking_uri(tracking_uri)
    quiet_links_with_credentials(uri)
    route_library_logs()
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
    elif writes and sqlite_path(uri) is not None:
        # A read-only, full or locked store stops the command now, before data, training or any run.
        problem = _write_problem(sqlite_path(uri).resolve(), uri)
        if problem:
            raise EdpsError(problem)
    return connect(uri)


def describe_store_error(uri: str, error: BaseException) -> str:
    """The one line a user sees for a store error: the store (without secrets) and the cause: locked (by
    whom), read-only or full when it is one of those, else the error's first line."""
    trouble = store_trouble(error)
    if trouble is not None:
        return trouble_line(uri, trouble, error)
    message = getattr(error, "message", None) or str(error) or type(error).__name__
    first = message.strip().splitlines()[0] if message.strip() else type(error).__name__
    # Redacted before it is cut: a cut through a password would leave its start unrecognised.
    first = redact_uri(first, str(uri))
    if len(first) > 300:
        first = first[:300] + "..."
    return f"tracking store {redact_uri(str(uri))}: {explain_store_error(first)}"


_STORE_LIBRARIES = ("mlflow", "requests", "urllib3", "sqlalchemy", "sqlite3", "psycopg2", "psycopg")


def store_error_line(error: BaseException, tracking_uri: str | None = None) -> str | None:
    """The one line for an error raised by the tracking store or its client libraries, or for a file that
    could not be written because its disk is full or read-only (the store's artifacts); None for others."""
    if type(error).__module__.split(".")[0] not in _STORE_LIBRARIES and not is_disk_error(error):
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


# ---- locked, read-only, full: what a store error means -------------------------------------------------
class StoreTrouble(Enum):
    LOCKED = "locked"  # another process holds the write lock past the busy timeout
    READ_ONLY = "read-only"
    FULL = "full"  # the disk (or the quota) of the database or of an artifact


# Where each is written: sqlite's messages, the OS's (artifacts, journals), PostgreSQL's read-only server.
_TROUBLE_MARKERS = {
    StoreTrouble.LOCKED: ("database is locked", "database table is locked"),
    StoreTrouble.READ_ONLY: ("attempt to write a readonly database", "read-only file system",
                             "read-only transaction"),
    StoreTrouble.FULL: ("database or disk is full", "no space left on device", "disk quota exceeded"),
}
_TROUBLE_ERRNOS = {errno.ENOSPC: StoreTrouble.FULL, errno.EDQUOT: StoreTrouble.FULL, errno.EROFS: StoreTrouble.READ_ONLY}
LOCK_WAIT_SECONDS = 30.0  # how long a command waits for a sqlite store's lock at its start


def is_disk_error(error: BaseException) -> bool:
    """An OSError of a full or read-only disk (an artifact, a journal that could not be written)."""
    return isinstance(error, OSError) and error.errno in _TROUBLE_ERRNOS


def store_trouble(error: BaseException) -> StoreTrouble | None:
    """Locked, read-only or full, when ``error`` (or an error it was raised from) says so: MLflow wraps
    SQLAlchemy's error, which wraps sqlite's, and SQLAlchemy's first line may be a hint about autoflush."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _TROUBLE_ERRNOS:
            return _TROUBLE_ERRNOS[current.errno]
        text = str(current).lower()
        for trouble, markers in _TROUBLE_MARKERS.items():
            if any(marker in text for marker in markers):
                return trouble
        current = current.__cause__ or current.__context__
    return None


def trouble_line(uri: str, trouble: StoreTrouble, error: BaseException | None = None, waited: str = "") -> str:
    """The one line for a locked, read-only or full store: the cause, the store, and what to do."""
    store = redact_uri(str(uri))
    path = sqlite_path(str(uri))
    if isinstance(error, OSError):  # a file of the store: an artifact (its folder), a journal
        where = str(error.filename) if error.filename else "its files"
    else:
        where = str(path) if path is not None else "it"
    if trouble is StoreTrouble.LOCKED:
        holders = lock_holders(path.resolve()) if path is not None else []
        stopped = [pid for pid in holders if _is_stopped(pid)]
        who = (f"{'process' if len(holders) == 1 else 'processes'} "
               f"{', '.join(_process_description(pid) for pid in holders)}" if holders else "another process")
        advice = (f"resume it (`kill -CONT {' '.join(map(str, stopped))}`) or end it" if stopped else
                  "wait for it to finish or end it")
        return (f"tracking store {store} is locked: {who} holds its write lock and did not release it "
                f"{f'within {waited}' if waited else 'while this process waited and tried again'}; {advice}, "
                "then run the same command again")
    if trouble is StoreTrouble.READ_ONLY:
        return (f"tracking store {store} is read-only: {where} cannot be written ({_cause(error, trouble)}); make "
                f"it writable (its folder too), or set MLFLOW_TRACKING_URI to a writable store, then run the same "
                "command again")
    return (f"tracking store {store}: no space left on the disk that holds {where} ({_cause(error, trouble)}); "
            "free space there (or raise the quota), then run the same command again")


def _cause(error: BaseException | None, trouble: StoreTrouble) -> str:
    """The words of the error that say it (sqlite's, or the OS's), else the trouble's name."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    text = str(error).lower() if error is not None else ""
    return next((marker for marker in _TROUBLE_MARKERS[trouble] if marker in text), trouble.value)


# sqlite's locks are fcntl byte-range locks (os_unix.c): PENDING at 1 GiB, RESERVED after it, then 510 bytes
# that readers share and the EXCLUSIVE writer takes whole. A write lock there stops writers (and readers,
# while PENDING or EXCLUSIVE); a read lock there is a reader, which keeps a writer from committing.
_PENDING_BYTE = 0x40000000
_LAST_LOCK_BYTE = _PENDING_BYTE + 2 + 510 - 1


def lock_holders(path: Path) -> list[int]:
    """The processes (other than this one) that hold sqlite's write lock on the database file ``path``, else
    those that hold its read lock; read from /proc/locks, so Linux only ([] elsewhere, or in WAL mode)."""
    try:
        stat = path.stat()
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    writers: set[int] = set()
    readers: set[int] = set()
    for line in lines:
        fields = line.split()
        # "1: POSIX  ADVISORY  WRITE 2155 fe:00:2171355 1073741824 1073742335"; "->" marks a waiter.
        if len(fields) != 8 or fields[1] != "POSIX" or fields[5] != device:
            continue
        kind, pid, start = fields[3], int(fields[4]), int(fields[6])
        end = _LAST_LOCK_BYTE if fields[7] == "EOF" else int(fields[7])
        if pid == os.getpid() or end < _PENDING_BYTE or start > _LAST_LOCK_BYTE:
            continue
        (writers if kind == "WRITE" else readers).add(pid)
    return sorted(writers or readers)


def _process_description(pid: int) -> str:
    """``1234 (python -m edps_mlflow.cli study ..., stopped)``: its command line, cut and without secrets."""
    try:
        words = [w.decode(errors="replace") for w in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if w]
    except OSError:
        return str(pid)
    command = redact_uri(" ".join(" ".join(words).split()))  # one line, whatever the arguments hold
    command = command if len(command) <= 100 else command[:100] + "..."
    return f"{pid} ({command}{', stopped' if _is_stopped(pid) else ''})"


def _is_stopped(pid: int) -> bool:
    """Whether the process is stopped (Ctrl-Z, SIGSTOP) or held by a debugger."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


# ---- database stores: a bounded first connection -------------------------------------------------------
_DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")
DATABASE_CONNECT_SECONDS = 15.0  # the first connection of a command to a database store, retries included
# A database restarting answers these for a few seconds; anything else (a wrong password) is an answer.
_NOT_YET_MARKERS = ("connection refused", "timeout expired", "timed out", "could not connect", "starting up",
                    "server closed the connection", "can't connect", "lost connection", "connection reset")
_reached_databases: set[str] = set()


def require_database(uri: str) -> None:
    """For a database store (PostgreSQL, MySQL, SQL Server): one connection made within
    :data:`DATABASE_CONNECT_SECONDS`, else one line naming the store. MLflow's own first connection
    tries 10 times over about 100 s, each try bounded only by the driver (minutes on a filtered port)."""
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower()
    if scheme not in _DATABASE_SCHEMES or uri in _reached_databases:
        return
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    try:
        url = sqlalchemy.engine.make_url(uri)
    except sqlalchemy.exc.ArgumentError as error:
        raise uri_error(uri, error) from None
    started = time.monotonic()
    pause = 0.5
    while True:
        left = DATABASE_CONNECT_SECONDS - (time.monotonic() - started)
        # libpq and the MySQL drivers take whole seconds, at least 2 for libpq.
        timeout = {} if scheme == "mssql" or "connect_timeout" in url.query else {"connect_timeout": max(2, int(left))}
        try:
            engine = sqlalchemy.create_engine(url, poolclass=NullPool, connect_args=timeout)
            try:
                with engine.connect():
                    _reached_databases.add(uri)
                    return
            finally:
                engine.dispose()
        except (ImportError, sqlalchemy.exc.NoSuchModuleError) as error:  # no driver installed
            raise uri_error(uri, error) from None
        except sqlalchemy.exc.DBAPIError as error:
            if not any(marker in str(error).lower() for marker in _NOT_YET_MARKERS):
                raise uri_error(uri, error) from None
            if time.monotonic() - started + pause >= DATABASE_CONNECT_SECONDS:
                first = redact_uri(str(error.orig or error).strip().splitlines()[0], uri)
                raise EdpsError(f"tracking store {redact_uri(uri)}: the database did not answer within "
                                f"{DATABASE_CONNECT_SECONDS:g} s ({first}); check that it runs and listens "
                                "there") from None
        time.sleep(pause)
        pause = min(4.0, pause * 2)


# ---- MLflow's and its libraries' log records: to the command's log file --------------------------------
class _LogFile(logging.FileHandler):
    """The command's log file, made when the first record comes; a failure to write it (the disk that is
    full) is not printed on the terminal either."""

    def _open(self):  # noqa: ANN202 - logging's own signature
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()

    def handleError(self, record: logging.LogRecord) -> None:
        pass


# MLflow gives these handlers of its own on stderr when imported (mlflow.utils.logging_utils); SQLAlchemy's
# pool and dialects log under "sqlalchemy".
_LIBRARY_LOGGERS = ("mlflow", "alembic", "sqlalchemy", "sqlalchemy.engine", "huey")


def route_library_logs() -> None:
    """MLflow's, alembic's and SQLAlchemy's log records to the command's log file instead of the terminal:
    MLflow logs a traceback at every failed store call before it raises (dozens for one locked store),
    and the command says one line, which names the file. Nothing changes outside a command (no
    ``EDPS_LOG_FILE``: a library caller, a test) or when the file is already in place."""
    path = library_log_file()
    if path is None:
        return
    handler = next((h for h in logging.getLogger(_LIBRARY_LOGGERS[0]).handlers
                    if isinstance(h, _LogFile) and h.baseFilename == str(path.absolute())), None)
    if handler is not None:
        return
    handler = _LogFile(path, delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"))
    for name in _LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        _routed.setdefault(name, (logger.handlers, logger.propagate))
        logger.handlers = [handler]
        logger.propagate = False


_routed: dict[str, tuple[list[logging.Handler], bool]] = {}  # each routed logger's handlers before


def restore_library_logs() -> None:
    """Undo :func:`route_library_logs` (a command that ran inside another program, or a test, returns)."""
    for name, (handlers, propagate) in _routed.items():
        logger = logging.getLogger(name)
        for handler in logger.handlers:
            if isinstance(handler, _LogFile):
                handler.close()
        logger.handlers, logger.propagate = handlers, propagate
    _routed.clear()


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for any other store)."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    path = tracking_uri[len("sqlite:///"):].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


_REVISION = re.compile(r"""^revision\s*(?::[^=]*)?=\s*["']([^"']+)["']""", re.MULTILINE)
_DOWN_REVISION = re.compile(r"""^down_revision\s*(?::[^=]*)?=\s*(.+)$""", re.MULTILINE)


@functools.lru_cache(maxsize=1)
def _schema_head() -> str:
    """MLflow's newest schema revision (the alembic head of the MLflow installed here). Read from the
    migration files' ``revision``/``down_revision`` lines: alembic imports every migration module to find it,
    about 1-2 s of CPU that every command would pay on opening a sqlite store. Where the files do not read as
    one chain with one head, alembic decides."""
    import mlflow

    versions = Path(mlflow.__file__).parent / "store" / "db_migrations" / "versions"
    revisions: set[str] = set()
    parents: set[str] = set()
    try:
        for script in versions.glob("*.py"):
            text = script.read_text(encoding="utf-8")
            revision = _REVISION.search(text)
            if revision is None:
                continue
            revisions.add(revision.group(1))
            down = _DOWN_REVISION.search(text)
            if down is not None:
                parents.update(re.findall(r"""["']([^"']+)["']""", down.group(1)))
    except OSError:
        revisions = set()
    heads = revisions - parents
    if len(heads) == 1:
        return heads.pop()
    from mlflow.store.db.utils import _get_latest_schema_revision

    return _get_latest_schema_revision()


def _sqlite_connection(path: Path, read_only: bool) -> sqlite3.Connection:
    """A connection to the sqlite file ``path`` that waits up to :data:`LOCK_WAIT_SECONDS` for its lock."""
    mode = "?mode=ro" if read_only else ""
    return sqlite3.connect(f"file:{quote(str(path))}{mode}", uri=True, timeout=LOCK_WAIT_SECONDS,
                           isolation_level=None)


def _sqlite_schema(path: Path, count_runs: bool = False) -> tuple[set[str], str | None, int | None]:
    """(table names, alembic revision, number of runs when ``count_runs``) of a sqlite file, read without
    writing to it."""
    connection = _sqlite_connection(path, read_only=True)
    try:
        tables = {row[0] for row in connection.execute("select name from sqlite_master where type = 'table'")}
        revision = None
        if "alembic_version" in tables:
            row = connection.execute("select version_num from alembic_version").fetchone()
            revision = row[0] if row else None
        runs = None
        if count_runs:
            runs = connection.execute("select count(*) from runs").fetchone()[0] if "runs" in tables else 0
        return tables, revision, runs
    finally:
        connection.close()


def _unusable_store(path: Path, uri: str) -> str | None:
    """Why the sqlite file at ``path`` cannot be used as it is, with the repair that works; None when it is
    fully migrated. A lock held past :data:`LOCK_WAIT_SECONDS` is an EdpsError that says so (not a
    broken file: the file is fine, another process is writing it)."""
    try:
        tables, revision, _ = _sqlite_schema(path)
    except sqlite3.DatabaseError as error:
        if store_trouble(error) is StoreTrouble.LOCKED:
            raise EdpsError(trouble_line(uri, StoreTrouble.LOCKED, error, f"{LOCK_WAIT_SECONDS:g} s")) from None
        return f"{path} is not a usable sqlite database ({error}); move it away"
    head = _schema_head()
    # sqlite migrations copy a table to _alembic_tmp_<table>, drop it and rename the copy: a migration
    # that stopped half-way leaves copies behind, on which `mlflow db upgrade` fails ("already exists").
    copies = sorted(t for t in tables if t.startswith("_alembic_tmp_"))
    if revision == head and {"runs", "experiments"} <= tables and not copies:
        return None
    complete = bool(revision) and {"runs", "experiments"} <= tables and not copies
    state = ("is empty" if not tables else
             f"has MLflow schema revision {revision}, not this MLflow's {head} (another MLflow version made it)"
             if complete else
             f"has a half-migrated MLflow schema (revision {revision or 'none'}, expected {head}), probably left by "
             "a process stopped while creating or upgrading it")
    return f"tracking store {redact_uri(uri)} {state}; {_repair(path, uri, tables, copies)}"


def _repair(path: Path, uri: str, tables: set[str], copies: list[str]) -> str:
    """The repair of a store that is not fully migrated, as commands to run (tried on such files)."""
    try:
        runs = _sqlite_schema(path, count_runs=True)[2]
    except sqlite3.DatabaseError:
        runs = None  # unreadable: it may hold runs
    if runs == 0:
        files = [path, *(path.with_name(path.name + suffix) for suffix in ("-journal", "-wal", "-shm"))]
        present = [str(f) for f in files if f == path or f.exists()]
        return f"it holds no runs: remove it (`rm {shlex.join(present)}`) and run the command again"
    orphans = [c for c in copies if c.removeprefix("_alembic_tmp_") not in tables]
    if orphans:
        # The table itself is gone and its rows are in the copy: only a backup brings the store back.
        return (f"it holds runs, but a stopped migration left {', '.join(orphans)} without its table: restore "
                "it from a backup")
    steps = [f"back it up (`cp {shlex.quote(str(path))} {shlex.quote(str(path) + '.backup')}`)"]
    if copies:
        drops = "; ".join(f"DROP TABLE {c}" for c in copies)
        steps.append(f"remove the copies a stopped migration left (`sqlite3 {shlex.quote(str(path))} "
                     f"{shlex.quote(drops)}`)")
    steps.append(f"run `mlflow db upgrade {redact_uri(uri)}`")
    held = "perhaps runs" if runs is None else f"{runs} run{'' if runs == 1 else 's'}"
    return f"it holds {held}: {', then '.join(steps)}"


def _write_problem(path: Path, uri: str) -> str | None:
    """Why nothing can be written to the sqlite store at ``path`` now (locked past
    :data:`LOCK_WAIT_SECONDS`, read-only, full), or None. It begins a write and rolls it back: the
    write lock is taken and the rollback journal written beside the file, as for any write."""
    try:
        connection = _sqlite_connection(path, read_only=False)
        try:
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("UPDATE alembic_version SET version_num = version_num")
        finally:
            connection.close()  # rolls the write back
    except sqlite3.OperationalError as error:
        trouble = store_trouble(error)
        if trouble is None and not os.access(path.parent, os.W_OK):
            trouble = StoreTrouble.READ_ONLY  # sqlite cannot create its journal: "unable to open database file"
        if trouble is None:
            return describe_store_error(uri, error)
        return trouble_line(uri, trouble, error, f"{LOCK_WAIT_SECONDS:g} s")
    return None


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


def initialise_store(tracking_uri: str, artifact_uri: str | None = None) -> Path | None:
    """Make sure the store exists and has MLflow's full schema before anything else opens it.

    MLflow migrates a new database in place, one step at a time (many seconds on a loaded machine):
    several processes doing that at once crash ("duplicate column name", "table ... already exists") and
    leave a half-migrated file, and a process killed half-way leaves one too. So a new sqlite store is
    built in a temporary file beside the target, under a file lock, and moved into place in one step:
    the target either does not exist or is complete. Other stores (servers, databases) are touched once.
    ``artifact_uri``: the artifact root of the store's Default experiment (MLflow's default when None).
    Returns the path of the sqlite file when this call created it, else None.
    """
    path = sqlite_path(tracking_uri)
    if path is None:
        require_database(tracking_uri)
        # One try, bounded by MLflow's own HTTP retries: an unreachable server fails fast at start.
        MlflowClient(tracking_uri).search_experiments(max_results=1)
        return None
    path = path.resolve()
    if _has_content(path):
        problem = _settled_problem(path, tracking_uri)
        if problem:
            raise EdpsError(problem)
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when this process dies
        try:
            if _has_content(path):
                problem = _settled_problem(path, tracking_uri)
                if problem:
                    raise EdpsError(problem)
                return None
            # Builders hold the lock while they build: any temporary file left here is a dead one's.
            for leftover in path.parent.glob(f".{path.name}.*.new*"):
                leftover.unlink(missing_ok=True)
            temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.new")
            try:
                _build_sqlite_store(temporary, artifact_uri)
                problem = _unusable_store(temporary, f"sqlite:///{temporary}")
                if problem:
                    raise EdpsError(problem)
                os.replace(temporary, path)
                return path
            finally:
                temporary.unlink(missing_ok=True)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _has_content(path: Path) -> bool:
    # An empty file is what sqlite leaves when it only opened a path: nothing to keep.
    try:
        return path.stat().st_size > 0
    except FileNotFoundError:
        return False


def _build_sqlite_store(database: Path, artifact_uri: str | None) -> None:
    """MLflow's schema in a new sqlite file, made by MLflow's own store class directly: a client would go
    through MLflow's store registry, that is, through :func:`mlflow_sqlite_store`, back here."""
    from mlflow.tracking._tracking_service.utils import _get_sqlalchemy_store

    # MLflow's progress lines ("Creating initial MLflow database tables...") are not for the user: a
    # refused command says one line.
    with _quiet_loggers("mlflow.store.db.utils", "alembic"):
        store = _get_sqlalchemy_store(f"sqlite:///{database}", artifact_uri)
    # Its connections point at the file that is about to become the store: close them.
    store.engine.dispose()


def mlflow_sqlite_store(store_uri: str, artifact_uri: str | None = None) -> Any:
    """MLflow's tracking store of a ``sqlite:`` URI, the database built safely first when there is none
    (:func:`initialise_store`). This is edps-mlflow's plugin for MLflow's ``mlflow.tracking_store`` entry
    points (edps_mlflow/store_plugin.py): every process where the package is installed (``mlflow run``,
    ``mlflow server``/``ui``, any MlflowClient) opens sqlite stores through it, so that several of them
    starting at once on a new store make one migration between them. An existing store costs one stat."""
    from mlflow.tracking._tracking_service.utils import _get_sqlalchemy_store

    path = sqlite_path(store_uri)
    if path is not None and not _has_content(path.resolve()):
        try:
            created = initialise_store(store_uri, artifact_uri)
        except EdpsError as error:
            raise MlflowException(str(error)) from None
        if created is not None:
            # On stderr: this may be any MLflow process, whose standard output is not ours to add to.
            print(f"edps-mlflow: created a new tracking store at {created} (none was there; if you expected one, "
                  "check MLFLOW_TRACKING_URI)", file=sys.stderr, flush=True)
    return _get_sqlalchemy_store(store_uri, artifact_uri)


def _settled_problem(path: Path, uri: str) -> str | None:
    """What is wrong with an existing sqlite store, after giving a process that is still creating it
    (an ``mlflow`` without our plugin, which takes no lock of ours) time to finish: None when it is usable."""
    deadline = time.monotonic() + _SETTLE_SECONDS
    last = None
    while True:
        problem = _unusable_store(path, uri)
        if problem is None:
            return None
        stat = path.stat()
        if time.time() - stat.st_mtime > _SETTLE_SECONDS:
            return problem  # nobody has written it for a while: nobody is migrating it
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
        experiment_id = client.create_experiment(name, artifact_location=artifact_location_for(str(client.tracking_uri),
                                                                                             name),
                                                 tags={n.EXPERIMENT_TAG_CREATED_BY: f"edps-mlflow {__version__}",
                                                       **({MLFLOW_NOTE: description} if description else {})})
    except MlflowException:
        # Another process created it in the meantime.
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id
    # Made with its experiment, the study index holds every study run of it (study_index.py).
    make_index_run(client, experiment_id, complete=True)
    return experiment_id


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
    return study_index.every_page(lambda size, token: client.search_runs(
        [experiment_id], filter_string=conditions, max_results=size, page_token=token))


def searcher(client: StoreClient, experiment_ids: list[str]) -> study_index.Search:
    """study_index's search over ``experiment_ids``: every page (or the first ``most`` runs), active runs or
    deleted ones."""
    def runs_found(conditions: str, deleted: bool, most: int | None) -> list[Run]:
        view = ViewType.DELETED_ONLY if deleted else ViewType.ACTIVE_ONLY
        return study_index.every_page(lambda size, token: client.search_runs(
            experiment_ids, filter_string=conditions, run_view_type=view, max_results=size, page_token=token), most)

    return study_index.Search(tuple(str(experiment_id) for experiment_id in experiment_ids), runs_found)


# ---- the study index (study_index.py: what it holds and why; these are its writes) ----------------------
INDEX_DESCRIPTION = (
    "The study index of this experiment: one tag `edps.index.<run id>` per study run, holding that run's "
    "state, edps tags, params and metrics, so that `edps status`, sweeps, `edps doctor` and `edps-analyze` read "
    "this run instead of searching every study run. Each study writes its entry when it starts and when it "
    "ends; do not delete or rename it (`edps doctor --repair` rebuilds it from the study runs).")


def make_index_run(client: StoreClient, experiment_id: str, complete: bool) -> str:
    """A new index run of the experiment; ``complete``: every study run of the experiment will be in it."""
    # Made at the epoch: readers find it by its start time (study_index.index_runs).
    run = client.create_run(experiment_id, start_time=n.INDEX_START_TIME, tags={
        n.TAG_KIND: n.KIND_STUDY_INDEX, n.TAG_VERSION: __version__, n.MLFLOW_RUN_NAME: n.INDEX_RUN_NAME,
        n.MLFLOW_NOTE: INDEX_DESCRIPTION, n.TAG_INDEX_COMPLETE: "true" if complete else "false"})
    # FINISHED at once: nothing renews a lease on it, and tags can still be written to a finished run.
    client.set_terminated(run.info.run_id, RunStatus.to_string(RunStatus.FINISHED))
    return run.info.run_id


def index_run_id(client: StoreClient, experiment_id: str, own_run_id: str | None = None) -> str:
    """The experiment's index run (the earliest, when two processes made one at the same moment), made when
    there is none: complete when the experiment holds no study run but ``own_run_id`` (one search by tag,
    once per experiment)."""
    found = study_index.index_runs(searcher(client, [experiment_id]))
    if found:
        return found[0].info.run_id
    studies = client.search_runs([experiment_id], filter_string(tags={n.TAG_KIND: n.KIND_STUDY}), max_results=2)
    return make_index_run(client, experiment_id, complete={r.info.run_id for r in studies} <= {own_run_id})


def index_study_run(client: StoreClient, run_id: str, was_study: bool = False) -> bool:
    """Write a study run's entry in its experiment's study index, from the run as the store holds it now
    (study_index.py); False for a run that is not a study run (``was_study``: one that gave its kind up, whose
    entry must stop saying RUNNING), one whose entry does not fit a tag, or when the store failed. Best
    effort: a study run whose entry is missing or stale is read from the store (a RUNNING one), so a store
    error here fails nothing."""
    try:
        run = client.get_run(run_id)
        if run.data.tags.get(n.TAG_KIND) != n.KIND_STUDY and not was_study:
            return False
        entry = study_index.entry_of(run)
        if entry is None:
            return False
        client.set_tag(index_run_id(client, run.info.experiment_id, run_id), n.TAG_INDEX_PREFIX + run_id, entry)
        return True
    except (MlflowException, OSError):
        return False


def complete_index(client: StoreClient, experiment_id: str, run_ids: list[str]) -> int:
    """Index these study runs (all those of the experiment without an entry: doctor --repair) and say that
    the index is complete; the number indexed."""
    indexed = sum(index_study_run(client, run_id) for run_id in run_ids)
    if indexed == len(run_ids):
        client.set_tag(index_run_id(client, experiment_id), n.TAG_INDEX_COMPLETE, "true")
    return indexed


def record_doctor_check(client: StoreClient, experiment_id: str, checked_until: int | None,
                        recheck: list[str], searched_keyless: bool) -> None:
    """What the next ``edps doctor`` of the experiment need not read again: every run that started or ended
    before ``checked_until`` (ms) was checked, and the runs of the problems found are to be looked at again
    (None: nothing of that kind; the next check reads every run); ``searched_keyless``: whether every run up
    to then was checked for its kind and keys too. Best effort: a store that refuses the write gets a full
    check next time."""
    try:
        client.set_experiment_tag(experiment_id, n.EXPERIMENT_TAG_CHECKED_UNTIL,
                                  "" if checked_until is None else str(checked_until))
        client.set_experiment_tag(experiment_id, n.EXPERIMENT_TAG_RECHECK, ",".join(recheck))
        client.set_experiment_tag(experiment_id, n.EXPERIMENT_TAG_SEARCHED_KEYLESS, str(searched_keyless).lower())
    except MlflowException:
        pass



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

