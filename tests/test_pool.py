"""Worker processes die with their parent, however it died (real processes, real SIGKILL)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from conftest import REPO, clean_environment
from edps_mlflow.pool import ORPHANED_EXIT_CODE

# A parent whose two workers each take one task and then loop until stopped; it writes each
# worker's pid to pids.txt as the worker reports it.
POOL_PARENT = """
import os
import time

from edps_mlflow.pool import PoolSpec, run_pool


def loop(worker):
    for task in worker.tasks():
        worker.send(os.getpid())
        while True:
            time.sleep(0.05)


def record(pid):
    with open("pids.txt", "a") as pids:
        pids.write(f"{pid}\\n")


if __name__ == "__main__":
    run_pool(PoolSpec("test-worker", loop, ((),) * 2), ["a", "b"], record)
"""

SLOW_STUDY = ["--bs", "16", "--trials", "8", "--check-interval", "10", "--goal-error", "0.001",
              "--max-steps", "20000", "--log-interval", "1", "--experiment", "pool-test"]


def _alive(process: psutil.Process) -> bool:
    try:  # is_running() also tells a reused pid apart; a zombie has finished, it only waits to be reaped
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _seconds_until_gone(processes: list[psutil.Process], timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if not any(_alive(p) for p in processes):
            return time.monotonic() - started
        time.sleep(0.05)
    survivors = [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in processes if _alive(p)]
    pytest.fail(f"still alive {timeout:.0f} s after their parent was killed: {survivors}")


def _start(args: list[str], cwd: Path, **environment: str) -> subprocess.Popen:
    # A session of its own, so that the test can clean up the group whatever happens; the test
    # itself only ever kills single pids.
    with open(cwd / "stderr.txt", "w") as stderr:  # a file: a full pipe would block the parent
        return subprocess.Popen([sys.executable, *args], cwd=cwd, stdout=subprocess.DEVNULL, stderr=stderr,
                                env=clean_environment(PYTHONPATH=str(REPO), **environment), start_new_session=True)


def _clean_up(parent: subprocess.Popen) -> None:
    try:
        os.killpg(parent.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    parent.wait()


def _stderr(cwd: Path) -> str:
    return (cwd / "stderr.txt").read_text()[-3000:]


def _wait_for(condition, parent: subprocess.Popen, cwd: Path, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if parent.poll() is not None:
            pytest.fail(f"the parent exited with {parent.returncode} before {what}: {_stderr(cwd)}")
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def _pool_workers(parent: subprocess.Popen, tmp_path: Path) -> list[psutil.Process]:
    pids = tmp_path / "pids.txt"

    def reported() -> list[psutil.Process] | None:
        lines = pids.read_text().split() if pids.exists() else []
        return [psutil.Process(int(pid)) for pid in lines] if len(lines) == 2 else None

    return _wait_for(reported, parent, tmp_path, 60, "both workers ran their task")


def _spawned_children(parent: subprocess.Popen) -> list[psutil.Process]:
    try:
        return [c for c in psutil.Process(parent.pid).children(recursive=True)
                if "spawn_main" in " ".join(c.cmdline())]
    except psutil.NoSuchProcess:
        return []


def _kill_parent_alone(parent: subprocess.Popen) -> list[psutil.Process]:
    """SIGKILL the parent only (not its group); returns every descendant it had just before."""
    descendants = psutil.Process(parent.pid).children(recursive=True)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(timeout=10)
    return descendants


def test_workers_die_when_their_parent_is_sigkilled(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(POOL_PARENT)
    parent = _start([str(script)], tmp_path)
    try:
        workers = _pool_workers(parent, tmp_path)
        descendants = _kill_parent_alone(parent)
        assert {w.pid for w in workers} <= {d.pid for d in descendants}
        seconds = _seconds_until_gone(descendants, 5)
        print(f"pool: {len(descendants)} descendants gone {seconds:.2f} s after the parent's SIGKILL")
    finally:
        _clean_up(parent)


def test_a_worker_killed_on_its_own_fails_the_parent_with_its_exit_code(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(POOL_PARENT)
    parent = _start([str(script)], tmp_path)
    try:
        workers = _pool_workers(parent, tmp_path)
        workers[0].kill()
        parent.wait(timeout=30)
        stderr = _stderr(tmp_path)
        assert parent.returncode != 0
        assert re.search(rf"test-worker-\d \(pid {workers[0].pid}\) exited with code -9 \(killed by SIGKILL\)",
                         stderr), stderr
        _seconds_until_gone(workers, 5)  # the parent stopped the other one
    finally:
        _clean_up(parent)


def test_a_worker_whose_parent_is_already_gone_exits_at_once(tmp_path):
    # The parent may die before the worker asks for the parent-death signal: the kernel would
    # never send it, so the worker checks who its parent is right after asking.
    not_my_parent = os.getppid()  # the grandparent of the process below, as if it had adopted it
    code = (f"from edps_mlflow.pool import _die_with_parent; _die_with_parent({not_my_parent}); "
            "print('still running')")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=30,
                          env=clean_environment(PYTHONPATH=str(REPO)))
    assert done.returncode == ORPHANED_EXIT_CODE and "still running" not in done.stdout, done.stderr


def test_the_watchdog_alone_ends_an_orphan(tmp_path):
    # What covers systems without PR_SET_PDEATHSIG: a thread that polls the parent pid.
    orphan = ("import os, threading, time; from edps_mlflow.pool import _watch_parent; "
              "threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start(); time.sleep(60)")
    middle = ("import subprocess, sys, time; "
              f"subprocess.Popen([sys.executable, '-c', {orphan!r}]); time.sleep(60)")
    parent = _start(["-c", middle], tmp_path)
    try:
        children = _wait_for(lambda: psutil.Process(parent.pid).children(), parent, tmp_path, 30, "the child started")
        time.sleep(1)  # let it start its watchdog
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        seconds = _seconds_until_gone(children, 5)
        print(f"watchdog: orphan gone {seconds:.2f} s after its parent's SIGKILL")
    finally:
        _clean_up(parent)


def test_study_workers_die_when_the_study_process_is_sigkilled(tmp_path):
    # `edps study` re-executes itself once (same pid) and then starts its trial workers.
    parent = _start(["-c", "from edps_mlflow.cli import main; main()", "study", "--workers", "2", *SLOW_STUDY],
                    tmp_path, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        # As soon as both workers exist: they may still be importing what they need.
        _wait_for(lambda: len(_spawned_children(parent)) >= 2, parent, tmp_path, 90, "the study started its workers")
        descendants = _kill_parent_alone(parent)
        seconds = _seconds_until_gone(descendants, 5)
        print(f"study: {len(descendants)} descendants gone {seconds:.2f} s after the parent's SIGKILL")
    finally:
        _clean_up(parent)


def test_sweep_workers_die_when_the_sweep_process_is_sigkilled(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = _start(["-c", "from edps_mlflow.cli import main; main()", "sweep", "--batch-sizes", "16,32",
                     "--trials", "4", "--workers", "2", "--check-interval", "10", "--goal-error", "0.001",
                     "--max-steps", "20000", "--log-interval", "1", "--experiment", "pool-test"],
                    tmp_path, MLFLOW_TRACKING_URI=uri)

    def training() -> bool:
        # Kill while the sweep workers are inside studies, writing to the store.
        client = MlflowClient(uri)
        experiment = client.get_experiment_by_name("pool-test")
        return bool(experiment) and len(client.search_runs(
            [experiment.experiment_id], "tags.`edps.kind` = 'trial' and attributes.status = 'RUNNING'")) >= 2

    try:
        # The sweep creates the store before it starts workers; opening it earlier here (a client
        # opens it when created) would race the creation of its tables.
        _wait_for(lambda: len(_spawned_children(parent)) >= 2, parent, tmp_path, 90, "the sweep started its workers")
        _wait_for(training, parent, tmp_path, 120, "both sweep workers trained")
        descendants = _kill_parent_alone(parent)
        seconds = _seconds_until_gone(descendants, 5)
        print(f"sweep: {len(descendants)} descendants gone {seconds:.2f} s after the parent's SIGKILL")
    finally:
        _clean_up(parent)


# A worker that takes a lock of its own (as a study's trial pool does inside a sweep's worker) and ends without
# releasing it, as a worker stopped with SIGKILL or one whose parent died (os._exit) does.
LEAKING_PARENT = """
import multiprocessing
import os

from edps_mlflow.pool import PoolSpec, WorkerError, run_pool


def leak(worker):
    lock = multiprocessing.get_context("spawn").Lock()
    os._exit(3)


if __name__ == "__main__":
    try:
        run_pool(PoolSpec("test-worker", leak, ((),)), [], print)
    except WorkerError as error:
        print("failed as expected:", str(error).splitlines()[0])
"""


def test_a_worker_that_ends_without_releasing_its_locks_adds_no_warnings_to_the_output(tmp_path):
    """Python's resource tracker releases what such a worker held and would then print "leaked semaphore"
    warnings after the command's own last line (seen after a one-line store error in a sweep): not ours."""
    (tmp_path / "parent.py").write_text(LEAKING_PARENT)
    done = subprocess.run([sys.executable, "parent.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=clean_environment(PYTHONPATH=str(REPO)))
    assert done.returncode == 0 and "failed as expected" in done.stdout, (done.stdout, done.stderr)
    assert "resource_tracker" not in done.stderr and "leaked" not in done.stderr, done.stderr


# A parent that gives one pool two batches of tasks, then leaves the pool: each task reports the pid of the
# worker that ran it; the parent prints what each batch returned and whether the workers outlived the pool.
BATCHES_PARENT = """
import os
import signal
import time

from edps_mlflow.pool import PoolSpec, WorkerError, open_pool


def echo(worker):
    for task in worker.tasks():
        time.sleep(0.05 * task)
        worker.send((task, os.getpid()))


if __name__ == "__main__":
    seen = []
    with open_pool(PoolSpec("test-worker", echo, ((),) * 2)) as pool:
        for batch in ([1, 2, 3], [4, 5]):
            got = []
            pool.run(batch, got.append)
            print("batch", sorted(task for task, _ in got))
            seen += got
        workers = {pid for _, pid in seen}
    print("workers", len(workers))
    time.sleep(0.5)
    print("alive after", sum(1 for pid in workers if os.path.exists(f"/proc/{pid}")
                             and "Z" not in open(f"/proc/{pid}/stat").read().split()[2]))
    # A worker killed while idle: the next batch fails (it might have been given a task) ...
    try:
        with open_pool(PoolSpec("test-worker", echo, ((),) * 2)) as pool:
            got = []
            pool.run([1, 2], got.append)
            os.kill(got[0][1], signal.SIGKILL)
            time.sleep(0.5)
            pool.run([3, 4, 5], got.append)
    except WorkerError as error:
        print("next batch:", "killed by SIGKILL" in str(error))
    # ... but leaving the pool after the last batch does not, where asked: every task was done.
    with open_pool(PoolSpec("test-worker", echo, ((),) * 2), forgive_idle_deaths=True) as pool:
        got = []
        pool.run([1, 2], got.append)
        os.kill(got[0][1], signal.SIGKILL)
        time.sleep(0.5)
    print("closed after", sorted(task for task, _ in got))
"""


def test_a_pool_runs_batch_after_batch_in_the_same_workers_and_ends_them_after(tmp_path):
    """An adaptive sweep's rounds: each run() returns once its own tasks are done, in the workers started
    once; leaving the pool ends them. A worker dead between rounds fails the next round, not the close."""
    (tmp_path / "parent.py").write_text(BATCHES_PARENT)
    done = subprocess.run([sys.executable, "parent.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=clean_environment(PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["batch [1, 2, 3]", "batch [4, 5]", "workers 2", "alive after 0",
                                        "next batch: True", "closed after [1, 2]"], done.stdout
