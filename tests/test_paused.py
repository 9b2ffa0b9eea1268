"""A process stalled past its lease (SIGSTOP, a suspended VM, a sleeping laptop) and woken after another
process took its work over writes nothing more: no trial it was training is finished, no study or sweep run
the other process owns is touched. It stops with one line and exit code 3.

Real processes, a real SIGSTOP of the whole process group past a short lease, a second real process that
takes over and finishes, then SIGCONT: on a sqlite store (a study) and on an `mlflow server` (a sweep).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import REPO, clean_environment, edps_here, fresh_store, run_edps, stop_groups_unlocked

LEASE = "4"  # seconds: heartbeats every 0.67 s; a pause of 6 s is past it


def _start(args: list[str], cwd: Path, uri: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "from edps_mlflow.cli import main; main()", *args], cwd=cwd,
                            env=clean_environment(PYTHONPATH=str(REPO), MLFLOW_TRACKING_URI=uri,
                                                  EDPS_LEASE_SECONDS=LEASE),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for_a_running_trial(process: subprocess.Popen, client: MlflowClient, experiment: str,
                              timeout: float = 240) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        found = client.get_experiment_by_name(experiment)
        if found is not None and client.search_runs([found.experiment_id], "tags.`edps.kind` = 'trial' and "
                                                    "attributes.status = 'RUNNING'", max_results=1):
            return found.experiment_id
        time.sleep(0.2)
    pytest.fail("the process never started a trial")


def _pause_past_the_lease(process: subprocess.Popen, database: Path | None = None) -> float:
    """SIGSTOP the command and the worker processes it started, past the lease. On sqlite, at a moment when
    it holds no lock on the database: a process stopped inside a transaction keeps its lock, and no other
    process can write until it wakes (docs/reliability.md), which is not what this tests."""
    stop_groups_unlocked([process.pid], database)
    stopped = time.time()
    time.sleep(float(LEASE) + 2)
    return stopped


def _wake(process: subprocess.Popen) -> subprocess.CompletedProcess:
    os.killpg(process.pid, signal.SIGCONT)
    try:
        stdout, stderr = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"the woken process did not stop: {stderr[-2000:]}")
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _assert_wrote_nothing_after(client: MlflowClient, experiment_id: str, stopped: float, owner_runs: set[str]) -> None:
    """No run of the stalled process ended after it was stopped but as the taking-over process left it."""
    for run in client.search_runs([experiment_id], max_results=1000):
        parent = run.data.tags.get("mlflow.parentRunId")
        if run.info.run_id in owner_runs or parent in owner_runs:
            if run.info.status == "FINISHED" and run.data.tags.get("edps.kind") == "trial":
                assert run.info.end_time / 1000 < stopped, f"trial run {run.info.run_id} finished after the pause"


@pytest.mark.slow
def test_a_study_paused_past_its_lease_writes_nothing_when_it_wakes(tmp_path):
    uri = fresh_store(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    # A small study: two trials of at most 300 steps, a check every 20.
    study = ["study", "--bs", "64", "--trials", "2", "--goal-error", "0.1", "--max-steps", "300", "--check-interval",
             "20", "--workers", "1", "--experiment", "paused"]
    stalled = _start(study, tmp_path, uri)
    experiment_id = _wait_for_a_running_trial(stalled, client, "paused")
    stalled_study = client.search_runs([experiment_id], "tags.`edps.kind` = 'study'")[0].info.run_id
    stopped = _pause_past_the_lease(stalled, tmp_path / "mlflow.db")

    # Another process finds the study's lease expired, marks the stalled runs FAILED and trains the study.
    taker = run_edps([*study, "--wait"], cwd=tmp_path, timeout=900, MLFLOW_TRACKING_URI=uri, EDPS_LEASE_SECONDS=LEASE)
    assert taker.returncode == 0, taker.stderr[-3000:]
    assert "marked" in taker.stdout and "left RUNNING by a dead process" in taker.stdout, taker.stdout

    woken = _wake(stalled)
    lines = woken.stderr.strip().splitlines()
    assert woken.returncode == 3, woken.stderr[-3000:]
    assert len(lines) == 1 and "lost its lease" in lines[0] and "Traceback" not in woken.stderr, woken.stderr
    assert client.get_run(stalled_study).info.status == "FAILED"
    _assert_wrote_nothing_after(client, experiment_id, stopped, {stalled_study})
    finished = client.search_runs([experiment_id], "tags.`edps.kind` = 'study' and attributes.status = 'FINISHED'")
    assert len(finished) == 1
    code, printed = edps_here(["doctor", "--experiment", "paused"], uri)
    assert code == 0, printed


@pytest.mark.slow
def test_a_sweep_paused_past_its_lease_leaves_the_resumed_sweep_finished(mlflow_server, tmp_path):
    client = MlflowClient(mlflow_server)
    experiment = f"paused-sweep-{time.time_ns()}"
    sweep = ["sweep", "--batch-sizes", "32,64", "--sparsities", "0", "--trials", "2", "--goal-error", "0.1",
             "--max-steps", "300", "--check-interval", "20", "--workers", "1", "--experiment", experiment]
    stalled = _start(sweep, tmp_path, mlflow_server)
    experiment_id = _wait_for_a_running_trial(stalled, client, experiment)
    sweep_run = client.search_runs([experiment_id], "tags.`edps.kind` = 'sweep'")[0].info.run_id
    stalled_studies = {r.info.run_id for r in client.search_runs([experiment_id], "tags.`edps.kind` = 'study'")}
    stopped = _pause_past_the_lease(stalled)

    # Another process resumes the sweep (its run, under a new owner) and finishes the grid.
    taker = run_edps([*sweep, "--wait"], cwd=tmp_path, timeout=900, MLFLOW_TRACKING_URI=mlflow_server,
                     EDPS_LEASE_SECONDS=LEASE)
    assert taker.returncode == 0, taker.stderr[-3000:]
    assert client.get_run(sweep_run).info.status == "FINISHED"

    woken = _wake(stalled)
    assert woken.returncode == 3, woken.stderr[-3000:]
    lines = woken.stderr.strip().splitlines()
    assert len(lines) == 1 and "lost its lease" in lines[0] and "Traceback" not in woken.stderr, woken.stderr
    time.sleep(2)  # anything the woken process still wrote would be in the store by now
    assert client.get_run(sweep_run).info.status == "FINISHED", "the woken sweep overwrote the resumed sweep's end"
    _assert_wrote_nothing_after(client, experiment_id, stopped, stalled_studies)
    code, printed = edps_here(["doctor", "--experiment", experiment], mlflow_server)
    assert code == 0, printed


@pytest.mark.slow
def test_a_killed_study_is_taken_over_at_once_by_the_next_command_here(tmp_path):
    """A SIGKILLed study leaves its runs RUNNING with a fresh heartbeat; its process is gone, and the next command
    on this machine sees that: it marks them FAILED and trains at once, not after the lease of 120 s."""
    uri = fresh_store(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    study = ["study", "--bs", "64", "--trials", "2", "--goal-error", "0.1", "--max-steps", "100", "--check-interval",
             "20", "--workers", "1", "--experiment", "killed"]
    killed = subprocess.Popen([sys.executable, "-c", "from edps_mlflow.cli import main; main()", *study], cwd=tmp_path,
                              env=clean_environment(PYTHONPATH=str(REPO), MLFLOW_TRACKING_URI=uri,
                                                    EDPS_LEASE_SECONDS="120"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    experiment_id = _wait_for_a_running_trial(killed, client, "killed")
    os.killpg(killed.pid, signal.SIGKILL)
    killed.communicate()

    started = time.time()
    taker = run_edps(study, cwd=tmp_path, timeout=300, MLFLOW_TRACKING_URI=uri, EDPS_LEASE_SECONDS="120")
    assert taker.returncode == 0, taker.stderr[-3000:]
    assert "left RUNNING by a dead process" in taker.stdout, taker.stdout
    marked = client.search_runs([experiment_id], "attributes.status = 'FAILED'")
    assert marked and all(run.info.end_time / 1000 - started < 20 for run in marked), "waited for the lease"
    errors = [run.data.tags.get("edps.error", "") for run in marked]
    assert any(f"process {killed.pid} on" in error and "exited" in error for error in errors), errors
