"""A sqlite store: built safely when new, checked before use (MLflow's full schema, writable now), with the
repair that works when it is not. MLflow migrates a new database in place, step by step, and processes doing
that at once (or one killed half-way) leave a half-migrated file: so a new store is built in a temporary file
beside the target, under a file lock, and linked into place in one step, never over a store, by every command
(client.open_store) and every MLflow process where the package is installed (plugin.py). Every wait here, on that
lock or on sqlite's, is bounded and says within seconds which process it waits for (locks.py).
"""

from __future__ import annotations

import fcntl
import functools
import os
import re
import shlex
import sqlite3
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, TextIO, TypeVar
from urllib.parse import quote

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking._tracking_service.utils import _get_sqlalchemy_store

from edps_mlflow.errors import EdpsError
from edps_mlflow.locks import NOTICE_SECONDS, LockWait, describe_holders, say_waiting, what_to_do
from edps_mlflow.locks import lock_holders as file_lock_holders
from edps_mlflow.process_settings import LEASE_VARIABLE, lease_seconds
from edps_mlflow.store.logs import quiet_loggers
from edps_mlflow.store.trouble import StoreTrouble, describe_store_error, lock_holders, store_trouble, trouble_line
from edps_mlflow.uris import redact_uri, require_store_folder, sqlite_path

LOCK_WAIT_SECONDS = 30.0  # how long a command waits at its start for a sqlite store's lock, or its creation lock
_T = TypeVar("_T")
_SETTLE_SECONDS = 10.0  # a file another process is still migrating changes within this time
_REVISION = re.compile(r"""^revision\s*(?::[^=]*)?=\s*["']([^"']+)["']""", re.MULTILINE)
_DOWN_REVISION = re.compile(r"""^down_revision\s*(?::[^=]*)?=\s*(.+)$""", re.MULTILINE)


def initialise_store(tracking_uri: str, artifact_uri: str | None = None) -> Path | None:
    """Make sure the sqlite store of ``tracking_uri`` exists with MLflow's full schema before anything opens it;
    the file's path when this call created it. ``artifact_uri``: the Default experiment's artifact root."""
    path = sqlite_path(tracking_uri).resolve()
    if not _has_content(path):
        require_store_folder(tracking_uri)  # never a new folder: a typo in its name is refused
        generation = 0
        while (held := _creation_lock(path, tracking_uri, generation)) is not None:
            lock, generation = held
            with lock, _renewing(lock):
                if _has_content(path):
                    break
                if _build_in_place(path, generation, artifact_uri):
                    return path
            # Taken over while stopped (or another builder was first): its successor holds a later generation.
            generation += 1
    _require_settled(path, tracking_uri)
    return None


def _creation_lock(path: Path, uri: str, generation: int) -> tuple[TextIO, int] | None:
    """The creation lock of the store at ``path``, taken (the open lock file and its generation); None once the
    store exists. Its holder renews the lock file's time while it builds; one that has not for the lease (stopped,
    asleep) is taken over by taking the next generation's lock, whose builder discards its temporary file."""
    wait = LockWait(f"the creation lock of tracking store {redact_uri(uri)} ({path.name}.lock)", LOCK_WAIT_SECONDS)
    suspect = None
    while not _has_content(path):
        name = path.with_name(f"{path.name}.lock" + (f".{generation}" if generation else ""))
        lock = open(name, "a")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when the file closes, or the process dies
        except BlockingIOError:
            lock.close()
        else:
            os.utime(lock.fileno())  # its lease starts now
            return lock, generation
        renewed = name.stat().st_mtime
        if time.time() - renewed > lease_seconds():
            # Seen twice, a poll apart: a builder that has just taken the lock renews it at once.
            if suspect == (generation, renewed):
                generation, suspect = generation + 1, None
                continue
            suspect = (generation, renewed)
        if not wait.pause(functools.partial(file_lock_holders, name)):
            holders = file_lock_holders(name)
            left = max(0.0, lease_seconds() - (time.time() - renewed))
            raise EdpsError(f"tracking store {redact_uri(uri)} is being built by {describe_holders(holders)}, which "
                            f"held its creation lock {name} for the {LOCK_WAIT_SECONDS:g} s this command waited; "
                            f"{what_to_do(holders)}, then run the same command again (a builder that stops renewing "
                            f"the lock for {LEASE_VARIABLE}={lease_seconds():g} s is taken over: in {left:.0f} s)")
    return None


@contextmanager
def _renewing(lock: TextIO) -> Iterator[None]:
    """The creation lock's lease renewed (its file's time) every sixth of the lease while the block runs: a
    thread, so that a stopped or sleeping process stops renewing and a live one does not."""
    done = threading.Event()
    every = lease_seconds() / 6

    def renew() -> None:
        while not done.wait(every):
            os.utime(lock.fileno())

    thread = threading.Thread(target=renew, name="edps-creation-lock", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _build_in_place(path: Path, generation: int, artifact_uri: str | None) -> bool:
    """Build the store in a temporary file and link it into place; False when this builder was taken over (its
    successor discarded its file) or another put a store in place first, which stays: a link never replaces."""
    # Builders of earlier generations were taken over, and those of this one are gone: theirs is half-built.
    for leftover in path.parent.glob(f".{path.name}.*.new*"):
        if _generation(leftover, path) <= generation:
            leftover.unlink(missing_ok=True)
    if path.exists() and not _has_content(path):
        path.unlink()  # what sqlite leaves when it only opened the path: nothing to keep
    temporary = path.with_name(f".{path.name}.g{generation}.{os.getpid()}.{uuid.uuid4().hex[:8]}.new")
    try:
        try:
            _build(temporary, artifact_uri)
        except Exception:
            if temporary.exists():
                raise
            return False  # discarded while this process was stopped: sqlite refused to write to a moved file
        problem = _unusable_store(temporary, f"sqlite:///{temporary}") if temporary.exists() else None
        if problem:
            raise EdpsError(problem)
        try:
            os.link(temporary, path)
        except (FileExistsError, FileNotFoundError):
            return False
        except OSError:  # a filesystem without hard links: moved instead, where nothing is in place yet
            if _has_content(path):
                return False
            os.replace(temporary, path)
        return True
    finally:
        for name in (temporary, temporary.with_name(temporary.name + "-journal")):
            name.unlink(missing_ok=True)


def _generation(temporary: Path, path: Path) -> int:
    """The generation of the creation lock under which a temporary store was begun (-1: an older version's)."""
    field = temporary.name[len(path.name) + 2:].split(".", 1)[0]
    return int(field[1:]) if field[:1] == "g" and field[1:].isdigit() else -1


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

    def rolled_back_write(timeout: float) -> None:
        connection = _connection(path, timeout)
        try:
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("UPDATE alembic_version SET version_num = version_num")
        finally:
            connection.close()  # rolls the write back

    try:
        _under_lock(path, rolled_back_write)
    except sqlite3.OperationalError as error:
        trouble = store_trouble(error)
        if trouble is None and not os.access(path.parent, os.W_OK):
            trouble = StoreTrouble.READ_ONLY  # sqlite cannot create its journal: "unable to open database file"
        if trouble is None:
            raise EdpsError(describe_store_error(uri, error)) from None
        raise EdpsError(trouble_line(uri, trouble, error, f"{LOCK_WAIT_SECONDS:g} s")) from None


def _under_lock(path: Path, use: Callable[[float], _T]) -> _T:
    """``use(timeout)``, ``timeout`` being sqlite's wait for the database's lock: :data:`NOTICE_SECONDS`, then,
    while another process still holds it, a line naming that process and the rest of :data:`LOCK_WAIT_SECONDS`."""
    try:
        return use(NOTICE_SECONDS)
    except sqlite3.OperationalError as error:
        if store_trouble(error) is not StoreTrouble.LOCKED:
            raise
    say_waiting(f"the lock of sqlite database {path}", LOCK_WAIT_SECONDS, lock_holders(path))
    return use(LOCK_WAIT_SECONDS - NOTICE_SECONDS)


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
    """One line unless the existing sqlite store is usable, after giving a process that is still creating or
    upgrading it (an ``mlflow`` without our plugin, which takes no lock of ours) time to finish: while it writes
    the file, up to :data:`LOCK_WAIT_SECONDS`."""
    wait = LockWait(f"tracking store {redact_uri(uri)} to be migrated by the process writing it", LOCK_WAIT_SECONDS)
    last, changed = None, time.monotonic()
    while (problem := _unusable_store(path, uri)) is not None:
        stat = path.stat()
        if (stat.st_size, stat.st_mtime_ns) != last:
            last, changed = (stat.st_size, stat.st_mtime_ns), time.monotonic()
        if time.time() - stat.st_mtime > _SETTLE_SECONDS or time.monotonic() - changed > _SETTLE_SECONDS:
            raise EdpsError(problem)  # nobody has written it for a while: nobody is migrating it
        if not wait.pause(lambda: lock_holders(path)):
            raise EdpsError(f"{problem} (after {LOCK_WAIT_SECONDS:g} s in which {describe_holders(lock_holders(path))} "
                            "kept writing it: let it finish first)")


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


def _connection(path: Path, timeout: float) -> sqlite3.Connection:
    """A connection to the existing sqlite file ``path`` that waits up to ``timeout`` seconds for its lock. Never
    read-only: a hot journal (a writer killed mid-commit) is rolled back on the first read, which a read-only
    connection refuses ("attempt to write a readonly database"); a write-protected file opens read-only anyway."""
    return sqlite3.connect(f"file:{quote(str(path))}?mode=rw", uri=True, timeout=timeout, isolation_level=None)


def _schema(path: Path, count_runs: bool = False) -> tuple[set[str], str | None, int | None]:
    """(table names, alembic revision, number of runs when ``count_runs``) of a sqlite file (it writes nothing)."""
    def read(timeout: float) -> tuple[set[str], str | None, int | None]:
        connection = _connection(path, timeout)
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

    return _under_lock(path, read)


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
