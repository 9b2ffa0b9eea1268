"""A store that cannot take a write now: locked by another process, read-only, full. Each is one line that names
the cause and the store (never "move it away" for a lock), MLflow's own logged tracebacks go to the command's log
file, the exit code is 2 and nothing is left RUNNING.

Real parts: a real process holding sqlite's write lock (stopped with SIGSTOP, as a paused command would be),
real small filesystems (tmpfs mounts: full, or remounted read-only; skipped where mounting is not allowed),
`chattr +i`. A database that does not answer: tests/test_store_bounds.py.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from mlflow.tracking import MlflowClient

from conftest import REPO, clean_environment, fresh_store, run_edps
from edps_mlflow.errors import EdpsError
from edps_mlflow.store.client import open_store
from edps_mlflow.store.sqlite import LOCK_WAIT_SECONDS
from edps_mlflow.store.trouble import StoreTrouble, lock_holders, trouble_line

EDPS = [sys.executable, "-c", "from edps_mlflow.cli import main; main()"]
SMALL_STUDY = ["study", "--trials", "2", "--goal-error", "0.06", "--max-steps", "300", "--check-interval", "10",
               "--workers", "1", "--log-interval", "1"]


# ---- helpers -----------------------------------------------------------------------------------------
def _hold_lock(database: Path, how: str = "EXCLUSIVE", seconds: float = 600) -> subprocess.Popen:
    """Another process that takes sqlite's write lock on ``database`` (BEGIN EXCLUSIVE: readers wait too;
    BEGIN IMMEDIATE: writers only), says so, holds it ``seconds`` and commits."""
    script = (f"import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
              f"c.execute('BEGIN {how}'); print('held', flush=True); time.sleep({seconds}); c.execute('COMMIT')")
    holder = subprocess.Popen([sys.executable, "-c", script, str(database)], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def _stop(process: subprocess.Popen) -> None:
    """SIGSTOP, and wait until the process is seen stopped."""
    os.kill(process.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _end(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.communicate()


@contextmanager
def _small_filesystem(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on ``folder`` (made), unmounted afterwards; skips where mounting is not allowed."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here (needs root): {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(folder)], capture_output=True)
        subprocess.run(["umount", "-l", str(folder)], check=True)


def _fill(folder: Path) -> None:
    """Fill the filesystem of ``folder`` to its last byte."""
    with open(folder / "filler", "wb", buffering=0) as filler:
        try:
            while True:
                filler.write(b"\0" * 4096)
        except OSError:
            pass


def _remount_read_only(folder: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)


def _store_files_size() -> int:
    """The size of a new, empty store (the session's template)."""
    from conftest import _StoreTemplate

    return _StoreTemplate.get().stat().st_size


def _statuses(uri: str) -> list[str]:
    """The statuses of the store's study, trial and sweep runs (not of an experiment's study index run, which
    is FINISHED from the start)."""
    database = uri.removeprefix("sqlite:///")
    connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        return [row[0] for row in connection.execute(
            "select status from runs where run_uuid not in "
            "(select run_uuid from tags where key = 'edps.kind' and value = 'study_index')")]
    finally:
        connection.close()


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


# ---- a lock held by another process --------------------------------------------------------------------
def test_the_holder_of_the_write_lock_is_named(tmp_path):
    """/proc/locks names the process that holds the lock, its command line and that it is stopped."""
    uri = fresh_store(tmp_path / "mlflow.db")
    holder = _hold_lock(tmp_path / "mlflow.db", "IMMEDIATE")
    try:
        assert lock_holders(tmp_path / "mlflow.db") == [holder.pid]
        _stop(holder)
        error = sqlite3.OperationalError("database is locked")
        line = trouble_line(uri, StoreTrouble.LOCKED, error, "30 s")
        assert f"tracking store {uri} is locked: process {holder.pid} ({sys.executable} -c import sqlite3" in line
        assert ", stopped)" in line and f"kill -CONT {holder.pid}" in line and "within 30 s" in line
        assert "\n" not in line and "move it away" not in line
    finally:
        _end(holder)
    assert lock_holders(tmp_path / "mlflow.db") == []


def test_a_lock_released_within_the_wait_is_waited_for(tmp_path):
    uri = fresh_store(tmp_path / "mlflow.db")
    holder = _hold_lock(tmp_path / "mlflow.db", "EXCLUSIVE", seconds=3)
    try:
        started = time.monotonic()
        result = run_edps(["doctor"], cwd=tmp_path, MLFLOW_TRACKING_URI=uri)
        assert result.returncode == 0, result.stderr[-2000:]
        assert holder.wait(timeout=30) == 0
    finally:
        _end(holder)
    print(f"doctor waited for a 3 s lock and ran: {time.monotonic() - started:.1f} s in all")


@pytest.mark.slow
def test_a_store_locked_by_a_stopped_process_is_one_line_naming_it(tmp_path):
    """A paused process holds the write lock: `edps status` and `edps study` say within seconds that they wait
    for it, wait the bounded time, then say it is locked and by whom, exit 2, and leave no run behind (the study
    is refused before it makes one)."""
    uri = fresh_store(tmp_path / "mlflow.db")
    holder = _hold_lock(tmp_path / "mlflow.db", "EXCLUSIVE")
    _stop(holder)
    environment = clean_environment(PYTHONPATH=str(REPO), MLFLOW_TRACKING_URI=uri)
    try:
        started = time.monotonic()
        commands = [subprocess.Popen([*EDPS, *args], cwd=tmp_path, env=environment, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
                    for args in (["status"], [*SMALL_STUDY, "--bs", "64", "--experiment", "locked"])]
        outputs = [command.communicate(timeout=300) for command in commands]
        seconds = time.monotonic() - started
    finally:
        _end(holder)
    for command, (_, stderr) in zip(commands, outputs):
        assert command.returncode == 2, stderr[-3000:]
        # Within seconds, one line says what the command waits for; at the bound, one line why it stopped.
        notice, line = stderr.strip().splitlines()
        assert notice.startswith(f"edps-mlflow: waiting up to {LOCK_WAIT_SECONDS:g} s for the lock of sqlite "
                                 f"database {tmp_path / 'mlflow.db'}, held by process {holder.pid} ("), notice
        assert notice.endswith(", stopped)") and "Traceback" not in stderr, stderr[-3000:]
        assert f"tracking store {uri} is locked: process {holder.pid} (" in line, line
        assert "stopped" in line and f"kill -CONT {holder.pid}" in line and "usable" not in line, line
    assert LOCK_WAIT_SECONDS <= seconds < LOCK_WAIT_SECONDS + 120, seconds
    assert _statuses(uri) == []
    print(f"locked by a stopped process: both commands said so in {seconds:.1f} s (wait {LOCK_WAIT_SECONDS:g} s)")


# ---- read-only and full stores ---------------------------------------------------------------------------
def test_a_store_that_cannot_be_written_is_refused_before_any_work(tmp_path):
    """A command that records runs checks at its start that the store takes a write (begun, rolled back);
    a command that only reads does not need to."""
    with _small_filesystem(tmp_path / "small", "8m") as small:
        read_only_uri = fresh_store(small / "read-only" / "mlflow.db")
        full_uri = fresh_store(small / "mlflow.db")
        _fill(small)
        with pytest.raises(EdpsError) as full:
            open_store(full_uri, writes=True)
        assert str(full.value) == (f"tracking store {full_uri}: no space left on the disk that holds {small}/mlflow.db "
                                   "(database or disk is full); free space there (or raise the quota), then run "
                                   "the same command again")
        (small / "filler").unlink()
        _remount_read_only(small)
        with pytest.raises(EdpsError) as read_only:
            open_store(read_only_uri, writes=True)
        assert str(read_only.value).startswith(f"tracking store {read_only_uri} is read-only: {small}/read-only/"
                                               "mlflow.db cannot be written (attempt to write a readonly database)")
        assert open_store(read_only_uri).search_experiments()  # reading it is fine
    # Root ignores permissions; an immutable file (or folder) is refused to root too.
    immutable_uri = fresh_store(tmp_path / "immutable" / "mlflow.db")
    for target in (tmp_path / "immutable" / "mlflow.db", tmp_path / "immutable"):
        if subprocess.run(["chattr", "+i", str(target)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not allowed here")
        try:
            with pytest.raises(EdpsError, match="is read-only: .* cannot be written"):
                open_store(immutable_uri, writes=True)
        finally:
            subprocess.run(["chattr", "-i", str(target)], check=True)


def test_a_read_only_store_written_anyway_says_read_only_and_logs_off_the_terminal(tmp_path):
    """A write that reaches a read-only store (a store made read-only after the command's start): MLflow logs a
    traceback and raises an error whose first line is SQLAlchemy's hint about autoflush; the line says
    read-only, the traceback is in the command's log file and not on the terminal."""
    with _small_filesystem(tmp_path / "small", "8m") as small:
        uri = fresh_store(small / "mlflow.db")
        _remount_read_only(small)
        log = tmp_path / "logs" / "edps.log"
        script = ("import sys; from edps_mlflow.store.client import connect\n"
                  "from edps_mlflow.store.trouble import describe_store_error\n"
                  "client = connect(sys.argv[1])\n"
                  "try:\n    client.create_experiment('written-anyway')\n"
                  "except Exception as error:\n    print(describe_store_error(sys.argv[1], error))\n")
        result = subprocess.run([sys.executable, "-c", script, uri], cwd=tmp_path, capture_output=True, text=True,
                                env=clean_environment(PYTHONPATH=str(REPO), EDPS_LOG_FILE=str(log)), timeout=120)
    assert result.returncode == 0 and result.stderr == "", result.stderr[-3000:]
    assert result.stdout.strip().startswith(f"tracking store {uri} is read-only: {small}/mlflow.db cannot be written "
                                            "(attempt to write a readonly database)"), result.stdout
    assert "Traceback" in log.read_text() and "readonly database" in log.read_text()


@pytest.mark.slow
def test_a_full_disk_under_the_artifacts_and_a_full_database_are_one_line_each(tmp_path):
    """The studies fill the disk while they run: the artifacts' disk (a mask, at a trial's start), then the
    database's own (metrics). One line each, naming the cause, the store and where; MLflow's tracebacks in
    the log file the line names; exit 2; every run ends FAILED (the store still takes that small write)."""
    # The artifacts go beside the database, in <stem>-artifacts: a full filesystem mounted there.
    artifacts_uri = fresh_store(tmp_path / "artifacts-full" / "mlflow.db")
    with _small_filesystem(tmp_path / "artifacts-full" / "mlflow-artifacts", "64k") as artifacts:
        _fill(artifacts)
        result = run_edps([*SMALL_STUDY, "--bs", "32", "--sparsity", "0.5", "--experiment", "full"], cwd=tmp_path,
                          MLFLOW_TRACKING_URI=artifacts_uri, timeout=600)
    assert result.returncode == 2, result.stderr[-3000:]
    line = _one_line(result.stderr)
    assert line.startswith(f"edps: error: tracking store {artifacts_uri}: no space left on the disk that holds "
                           f"file://{artifacts}/full/"), line
    assert "(No space left on device)" in line, line
    statuses = _statuses(artifacts_uri)
    assert statuses and set(statuses) == {"FAILED"}, statuses

    # The database's own disk: a filesystem with room for the new store and little more.
    with _small_filesystem(tmp_path / "database-full", f"{_store_files_size() // 1024 + 64}k") as small:
        database_uri = fresh_store(small / "mlflow.db")
        result = run_edps([*SMALL_STUDY, "--bs", "32", "--experiment", "full"], cwd=tmp_path,
                          MLFLOW_TRACKING_URI=database_uri, timeout=600)
        statuses = _statuses(database_uri)
    assert result.returncode == 2, result.stderr[-3000:]
    line = _one_line(result.stderr)
    assert line.startswith(f"edps: error: tracking store {database_uri}: no space left on the disk that holds "
                           f"{small}/mlflow.db (database or disk is full)"), line
    log = Path(line.split("(MLflow's log: ", 1)[1].rstrip(")"))
    assert "Traceback" in log.read_text()
    assert statuses and "RUNNING" not in statuses, statuses


# ---- a store left half-migrated ------------------------------------------------------------------------
def test_a_half_migrated_store_with_runs_gets_the_repair_that_works(tmp_path):
    """A migration stopped half-way leaves _alembic_tmp_ copies, on which `mlflow db upgrade` fails; the line
    says to back up, drop them, then upgrade (tried on such a file: docs/reliability.md). Without runs: remove
    the file and its companions."""
    database = tmp_path / "mlflow.db"
    uri = fresh_store(database)
    MlflowClient(uri).create_run("0")
    connection = sqlite3.connect(database)
    with connection:
        connection.execute("create table _alembic_tmp_runs as select * from runs")
        connection.execute("update alembic_version set version_num = 'c8d9e0f1a2b3'")
    connection.close()
    _age(database)
    result = run_edps(["status"], cwd=tmp_path, MLFLOW_TRACKING_URI=uri)
    assert result.returncode == 2
    assert _one_line(result.stderr) == (
        f"edps: error: tracking store {uri} has a half-migrated MLflow schema (revision c8d9e0f1a2b3, expected "
        f"{_head()}), probably left by a process stopped while creating or upgrading it; it holds 1 run: back it "
        f"up (`cp {database} {database}.backup`), then remove the copies a stopped migration left "
        f"(`sqlite3 {database} 'DROP TABLE _alembic_tmp_runs'`), then run `mlflow db upgrade {uri}`")

    empty = tmp_path / "empty" / "mlflow.db"
    empty.parent.mkdir()
    connection = sqlite3.connect(empty)
    connection.executescript("create table alembic_version (version_num varchar(32) not null);"
                             "insert into alembic_version values ('451aebb31d03');"
                             "create table experiments (experiment_id integer primary key, name text);")
    connection.close()
    _age(empty)
    (empty.parent / "mlflow.db-journal").write_bytes(b"")
    result = run_edps(["status"], cwd=tmp_path, MLFLOW_TRACKING_URI=f"sqlite:///{empty}")
    assert _one_line(result.stderr).endswith(f"it holds no runs: remove it (`rm {empty} {empty}-journal`) and run "
                                             "the command again")


def _age(database: Path) -> None:
    """Last written a minute ago: no process is still migrating it, so it is judged at once."""
    os.utime(database, (time.time() - 60, time.time() - 60))


def _head() -> str:
    from mlflow.store.db.utils import _get_latest_schema_revision

    return _get_latest_schema_revision()


def test_the_schema_head_read_from_the_migration_files_is_alembics():
    # Every command that opens a sqlite store compares its revision with this head: read from the files in
    # milliseconds, it must be the revision alembic computes (by importing every migration, about a second).
    from mlflow.store.db.utils import _get_latest_schema_revision

    from edps_mlflow.store.sqlite import _schema_head

    _schema_head.cache_clear()
    assert _schema_head() == _get_latest_schema_revision()


# ---- a disk that fills while a study runs ----------------------------------------------------------------
_FILL_AT_THE_FIRST_TRIAL = """
import os, sqlite3, sys, time
database, folder = sys.argv[1], sys.argv[2]
while True:
    connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=0.1)
    try:
        if connection.execute("select 1 from tags where key = 'edps.kind' and value = 'trial'").fetchone():
            break
    except sqlite3.Error:
        pass
    finally:
        connection.close()
    time.sleep(0.05)
with open(os.path.join(folder, "filler"), "wb", buffering=0) as filler:
    try:
        while True:
            filler.write(b"\\0" * 4096)
    except OSError:
        pass
    os.ftruncate(filler.fileno(), os.fstat(filler.fileno()).st_size - 8192)
print("filled", flush=True)
"""


def _run_ids(database: Path, where: str, *arguments: str) -> list[tuple]:
    connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        return connection.execute(f"select run_uuid, end_time from runs where {where}", arguments).fetchall()
    finally:
        connection.close()


@pytest.mark.slow
def test_a_disk_that_fills_mid_study_names_what_it_left_running_and_the_next_command_takes_over_at_once(tmp_path):
    """The store's filesystem fills while the study trains, 8 KiB left: one line, which names every run the store
    would not let it mark FAILED (each is tried); once space is freed the same command takes the study over at once
    (its process exited), not after the lease of 120 s."""
    with _small_filesystem(tmp_path / "small", f"{_store_files_size() // 1024 + 2048}k") as small:
        database, uri = small / "mlflow.db", fresh_store(small / "mlflow.db")
        filler = subprocess.Popen([sys.executable, "-c", _FILL_AT_THE_FIRST_TRIAL, str(database), str(small)],
                                  stdout=subprocess.PIPE, text=True)
        study = ["study", "--trials", "2", "--goal-error", "0.06", "--max-steps", "150", "--check-interval", "10",
                 "--workers", "1", "--bs", "32", "--experiment", "filled"]
        result = run_edps(study, cwd=tmp_path, MLFLOW_TRACKING_URI=uri, EDPS_LEASE_SECONDS="120", timeout=600)
        assert filler.communicate(timeout=60)[0].strip() == "filled"
        line = _one_line(result.stderr)
        assert result.returncode == 2 and "no space left on the disk" in line, line
        # The study's own writes use up the 8 KiB before one fails, and a mark needs a journal page: each run
        # still RUNNING is one the store refused, and the line names it.
        running = [run_id for run_id, _ in _run_ids(database, "status = 'RUNNING' and run_uuid in (select run_uuid "
                                                              "from tags where key = 'edps.kind' and value != ?)",
                                                    "study_index")]
        assert running and all(run_id in line for run_id in running), (line, running)
        assert f"could not mark {len(running)} runs FAILED either" in line, line

        (small / "filler").unlink()
        started = time.time()
        again = run_edps(study, cwd=tmp_path, MLFLOW_TRACKING_URI=uri, EDPS_LEASE_SECONDS="120", timeout=300)
        ends = [end / 1000 - started for _, end in _run_ids(database, f"run_uuid in ({', '.join('?' * len(running))})",
                                                            *running)]
        final = _statuses(uri)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "left RUNNING by a dead process" in again.stdout, again.stdout
    assert len(ends) == len(running) and max(ends) < 20, ends  # marked FAILED at its start, not after the lease
    assert "RUNNING" not in final, final


def test_a_write_killed_mid_transaction_leaves_a_store_that_the_next_command_uses(tmp_path: Path) -> None:
    """A command killed inside a write (SIGKILL of `edps study` alone, seen by hand) leaves a hot journal, which
    a read-only connection cannot roll back ("attempt to write a readonly database"): the next command rolls it
    back as sqlite's writers do, and never says "move it away" of a store that holds every result."""
    database = tmp_path / "mlflow.db"
    uri = fresh_store(database)
    script = ("import os, signal, sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
              "c.execute('PRAGMA cache_size = 1'); c.execute('BEGIN IMMEDIATE'); "
              "c.execute(\"update experiments set name = 'half-written'\"); "
              # a page spilled from the cache: the journal is synced with its header, as in a killed commit
              "c.execute('create table filler as with recursive n(i) as (select 1 union all select i + 1 from n "
              "where i < 200) select randomblob(1000) from n'); "
              "os.kill(os.getpid(), signal.SIGKILL)")
    killed = subprocess.run([sys.executable, "-c", script, str(database)])
    assert killed.returncode == -signal.SIGKILL
    assert (tmp_path / "mlflow.db-journal").stat().st_size > 0  # hot: its writer is gone
    _age(database)
    result = run_edps(["status"], cwd=tmp_path, MLFLOW_TRACKING_URI=uri)
    assert "not a usable sqlite database" not in result.stderr
    assert _one_line(result.stderr) == "edps: error: the tracking store holds no study runs yet"  # read, not refused
    assert [e.name for e in MlflowClient(uri).search_experiments()] == ["Default"]  # the write rolled back
