"""A sqlite store: built safely when new, checked before use (MLflow's full schema, writable now), with the
repair that works when it is not. MLflow migrates a new database in place, step by step, and processes doing
that at once (or one killed half-way) leave a half-migrated file: so a new store is built in a temporary file
beside the target, under a file lock, and moved into place in one step, by every command (client.open_store)
and every MLflow process where the package is installed (plugin.py).
"""

from __future__ import annotations

import fcntl
import functools
import os
import re
import shlex
import sqlite3
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking._tracking_service.utils import _get_sqlalchemy_store

from edps_mlflow.errors import EdpsError
from edps_mlflow.store.logs import quiet_loggers
from edps_mlflow.store.trouble import StoreTrouble, describe_store_error, store_trouble, trouble_line
from edps_mlflow.uris import redact_uri, sqlite_path

LOCK_WAIT_SECONDS = 30.0  # how long a command waits for a sqlite store's lock at its start
_SETTLE_SECONDS = 10.0  # a file another process is still migrating changes within this time
_REVISION = re.compile(r"""^revision\s*(?::[^=]*)?=\s*["']([^"']+)["']""", re.MULTILINE)
_DOWN_REVISION = re.compile(r"""^down_revision\s*(?::[^=]*)?=\s*(.+)$""", re.MULTILINE)


def initialise_store(tracking_uri: str, artifact_uri: str | None = None) -> Path | None:
    """Make sure the sqlite store of ``tracking_uri`` exists with MLflow's full schema before anything opens it;
    the file's path when this call created it. ``artifact_uri``: the Default experiment's artifact root."""
    path = sqlite_path(tracking_uri).resolve()
    if _has_content(path):
        _require_settled(path, tracking_uri)
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when this process dies
        try:
            if _has_content(path):
                _require_settled(path, tracking_uri)
                return None
            # Builders hold the lock while they build: any temporary file left here is a dead one's.
            for leftover in path.parent.glob(f".{path.name}.*.new*"):
                leftover.unlink(missing_ok=True)
            temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.new")
            try:
                _build(temporary, artifact_uri)
                problem = _unusable_store(temporary, f"sqlite:///{temporary}")
                if problem:
                    raise EdpsError(problem)
                os.replace(temporary, path)
                return path
            finally:
                temporary.unlink(missing_ok=True)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def mlflow_sqlite_store(store_uri: str, artifact_uri: str | None = None) -> object:
    """MLflow's tracking store of a ``sqlite:`` URI, the database built safely first when there is none (what the
    plugin gives any MLflow process: several starting at once make one migration). An existing store costs a stat."""
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


def require_writable(uri: str) -> None:
    """One line unless the sqlite store takes a write now (not locked past :data:`LOCK_WAIT_SECONDS`, not
    read-only, not full): a write begun and rolled back takes the lock and writes the journal, as any write."""
    path = sqlite_path(uri).resolve()
    try:
        connection = _connection(path, read_only=False)
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
            raise EdpsError(describe_store_error(uri, error)) from None
        raise EdpsError(trouble_line(uri, trouble, error, f"{LOCK_WAIT_SECONDS:g} s")) from None


def _has_content(path: Path) -> bool:
    # An empty file is what sqlite leaves when it only opened a path: nothing to keep.
    try:
        return path.stat().st_size > 0
    except FileNotFoundError:
        return False


def _build(database: Path, artifact_uri: str | None) -> None:
    """MLflow's schema in a new sqlite file, by MLflow's store class itself (a client would come back here)."""
    # MLflow's progress lines ("Creating initial MLflow database tables...") are not for the user.
    with quiet_loggers("mlflow.store.db.utils", "alembic"):
        store = _get_sqlalchemy_store(f"sqlite:///{database}", artifact_uri)
    store.engine.dispose()  # its connections point at the file that is about to become the store


def _require_settled(path: Path, uri: str) -> None:
    """One line unless the existing sqlite store is usable, after giving a process that is still creating it
    (an ``mlflow`` without our plugin, which takes no lock of ours) time to finish."""
    deadline = time.monotonic() + _SETTLE_SECONDS
    last = None
    while (problem := _unusable_store(path, uri)) is not None:
        stat = path.stat()
        if time.time() - stat.st_mtime > _SETTLE_SECONDS:
            raise EdpsError(problem)  # nobody has written it for a while: nobody is migrating it
        state = (stat.st_size, stat.st_mtime_ns)
        if state != last:
            last, deadline = state, time.monotonic() + _SETTLE_SECONDS
        elif time.monotonic() > deadline:
            raise EdpsError(problem)
        time.sleep(0.5)


@functools.lru_cache(maxsize=1)
def _schema_head() -> str:
    """MLflow's newest schema revision, from its migration files' ``revision``/``down_revision`` lines (alembic
    imports every migration module: seconds of CPU); alembic decides where they are not one chain with one head."""
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
    from mlflow.store.db.utils import _get_latest_schema_revision  # imports alembic: only when needed

    return _get_latest_schema_revision()


def _connection(path: Path, read_only: bool) -> sqlite3.Connection:
    """A connection to the sqlite file ``path`` that waits up to :data:`LOCK_WAIT_SECONDS` for its lock."""
    mode = "?mode=ro" if read_only else ""
    return sqlite3.connect(f"file:{quote(str(path))}{mode}", uri=True, timeout=LOCK_WAIT_SECONDS,
                           isolation_level=None)


def _schema(path: Path, count_runs: bool = False) -> tuple[set[str], str | None, int | None]:
    """(table names, alembic revision, number of runs when ``count_runs``) of a sqlite file, read only."""
    connection = _connection(path, read_only=True)
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
    """Why the sqlite file at ``path`` cannot be used as it is, with the repair that works; None when it is fully
    migrated. A lock held past :data:`LOCK_WAIT_SECONDS` is an EdpsError that says so."""
    try:
        tables, revision, _ = _schema(path)
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
        runs = _schema(path, count_runs=True)[2]
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
