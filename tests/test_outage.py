"""A tracking server that goes away in the middle of a sweep and comes back on the same port, with the same
store: a sweep rides out an outage shorter than EDPS_OUTAGE_SECONDS, and one that outlasts it gives up in one
line that names every run it could not mark FAILED (the rest are marked). Each try of a store call is one
request here (MLFLOW_HTTP_REQUEST_MAX_RETRIES=0), so that the wait measured is ours, not MLflow's retries."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import REPO, clean_environment, start_mlflow_server, stop_process

SWEEP = ["sweep", "--batch-sizes", "64", "--trials", "2", "--max-steps", "200", "--check-interval", "20",
         "--workers", "1", "--experiment", "outage"]


def _runs(url: str) -> list:
    client = MlflowClient(url)
    experiment = client.get_experiment_by_name("outage")
    if experiment is None:
        return []
    return [r for r in client.search_runs([experiment.experiment_id])
            if r.data.tags.get("edps.kind") in ("sweep", "study", "trial")]


def _sweep_through_an_outage(tmp_path: Path, down_seconds: float, outage_setting: str) -> tuple:
    """The sweep's (exit code, stdout, stderr, seconds the server was unreachable, its URL, the server)."""
    server, url = start_mlflow_server(tmp_path)
    port = int(url.rsplit(":", 1)[1])
    sweep = subprocess.Popen([sys.executable, "-c", "from edps_mlflow.cli import main; main()", *SWEEP], cwd=tmp_path,
                             env=clean_environment(PYTHONPATH=str(REPO), MLFLOW_TRACKING_URI=url,
                                                   EDPS_OUTAGE_SECONDS=outage_setting,
                                                   MLFLOW_HTTP_REQUEST_MAX_RETRIES="0"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not any(r.data.tags.get("edps.kind") == "trial" for r in _runs(url)):  # mid-work: training
            assert sweep.poll() is None and time.monotonic() < deadline, sweep.communicate()
            time.sleep(0.2)
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        down = time.monotonic()
        time.sleep(max(0.0, down_seconds - 6))  # the restart itself takes about 6 s
        server, _ = start_mlflow_server(tmp_path, port=port)
        outage = time.monotonic() - down
        stdout, stderr = sweep.communicate(timeout=120)
        return sweep.returncode, stdout, stderr, outage, url, server
    except BaseException:
        stop_process(server)
        raise
    finally:
        if sweep.poll() is None:
            os.killpg(sweep.pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_sweep_rides_out_an_outage_shorter_than_its_setting(tmp_path):
    code, stdout, stderr, outage, url, server = _sweep_through_an_outage(tmp_path, 15, "30")
    try:
        assert code == 0, stderr[-3000:]
        assert "waiting for tracking store" in stdout and "up to 30 s (EDPS_OUTAGE_SECONDS)" in stdout, stdout
        runs = _runs(url)
        assert runs and {r.info.status for r in runs} == {"FINISHED"}, [(r.info.run_id, r.info.status) for r in runs]
    finally:
        stop_process(server)
    print(f"rode out a {outage:.0f} s outage (EDPS_OUTAGE_SECONDS=30)")


@pytest.mark.slow
def test_a_sweep_that_gives_up_names_every_run_it_left_running(tmp_path):
    code, stdout, stderr, outage, url, server = _sweep_through_an_outage(tmp_path, 25, "5")
    try:
        assert code == 2, stderr[-3000:]
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
        running = [r.info.run_id for r in _runs(url) if r.info.status == "RUNNING"]
        # Each run left RUNNING is named, with what becomes of it; the others were marked.
        assert all(run_id in lines[0] for run_id in running), (running, lines[0])
        # One clause, though the study's worker named its runs before the sweep added its own.
        assert not running or lines[0].count("could not mark") == 1, lines[0]
        assert {r.info.status for r in _runs(url)} <= {"RUNNING", "FAILED", "FINISHED"}
    finally:
        stop_process(server)
    print(f"gave up on a {outage:.0f} s outage (EDPS_OUTAGE_SECONDS=5): {lines[0]}; left RUNNING: {running}")
