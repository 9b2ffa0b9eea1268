"""A tracking server that goes away in the middle of a sweep: a sweep rides out an outage shorter than
EDPS_OUTAGE_SECONDS (the server restarted on the same port, with the same store), says that it waits within a few
seconds, and when the outage outlasts the setting gives up close to it (the bound plus one request's time) in one
line in our words, naming the setting and every run it could not mark FAILED. MLflow's request settings are the
project's own (nothing set here), as a user has them."""

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
# One request's time with the project's settings, to a port that refuses (the server killed): about nothing, as
# MLflow's one retry comes at once (20 s to a server that takes connections and never answers).
REQUEST_SECONDS = 1


def _runs(url: str) -> list:
    client = MlflowClient(url)
    experiment = client.get_experiment_by_name("outage")
    if experiment is None:
        return []
    return [r for r in client.search_runs([experiment.experiment_id])
            if r.data.tags.get("edps.kind") in ("sweep", "study", "trial")]


def _sweep_until(tmp_path: Path, kind: str, outage_setting: str) -> tuple:
    """A sweep against a real server, and that server killed once a run of ``kind`` exists: (the sweep, its URL,
    the server's port, when it was killed)."""
    server, url = start_mlflow_server(tmp_path)
    environment = clean_environment(PYTHONPATH=str(REPO), MLFLOW_TRACKING_URI=url, EDPS_OUTAGE_SECONDS=outage_setting)
    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        environment.pop(name, None)  # the project's defaults, not the test run's
    sweep = subprocess.Popen([sys.executable, "-c", "from edps_mlflow.cli import main; main()", *SWEEP], cwd=tmp_path,
                             env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not any(r.data.tags.get("edps.kind") == kind for r in _runs(url)):
            assert sweep.poll() is None and time.monotonic() < deadline, sweep.communicate()
            time.sleep(0.1)
    except BaseException:
        os.killpg(sweep.pid, signal.SIGKILL)
        raise
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    return sweep, url, int(url.rsplit(":", 1)[1]), time.monotonic()


@pytest.mark.slow
def test_a_sweep_rides_out_an_outage_shorter_than_its_setting(tmp_path):
    sweep, url, port, down = _sweep_until(tmp_path, "trial", "30")
    try:
        time.sleep(9)  # the restart itself takes about 6 s
        server, _ = start_mlflow_server(tmp_path, port=port)
        outage = time.monotonic() - down
        stdout, stderr = sweep.communicate(timeout=120)
    finally:
        if sweep.poll() is None:
            os.killpg(sweep.pid, signal.SIGKILL)
    try:
        assert sweep.returncode == 0, stderr[-3000:]
        assert "waiting for tracking store" in stdout and "up to 30 s (EDPS_OUTAGE_SECONDS)" in stdout, stdout
        runs = _runs(url)
        assert runs and {r.info.status for r in runs} == {"FINISHED"}, [(r.info.run_id, r.info.status) for r in runs]
    finally:
        stop_process(server)
    print(f"rode out a {outage:.0f} s outage (EDPS_OUTAGE_SECONDS=30)")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["study", "trial"])  # killed as a study claims its run, or while it trains
def test_a_sweep_gives_up_close_to_its_setting_and_names_every_run_it_left_running(tmp_path, kind):
    sweep, url, port, down = _sweep_until(tmp_path, kind, "10")
    try:
        stdout, stderr = sweep.communicate(timeout=120)  # the server stays away until the sweep has given up
        ended = time.monotonic() - down
    finally:
        if sweep.poll() is None:
            os.killpg(sweep.pid, signal.SIGKILL)
    server, _ = start_mlflow_server(tmp_path, port=port)
    try:
        assert sweep.returncode == 2, stderr[-3000:]
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
        assert "waiting for tracking store" in stdout and "up to 10 s (EDPS_OUTAGE_SECONDS)" in stdout, stdout
        assert f"tracking store {url} unreachable for " in lines[0], lines[0]
        assert "longer than EDPS_OUTAGE_SECONDS=10 (set it higher to wait longer): " in lines[0], lines[0]
        # The bound, one request in flight, and slack for a loaded machine (the next store call, the exit).
        assert ended < 10 + REQUEST_SECONDS + 10, (ended, lines[0])  # main: 40-68 s
        running = [r for r in _runs(url) if r.info.status == "RUNNING"]
        assert {"sweep", "study"} <= {r.data.tags["edps.kind"] for r in running}, running
        # Each run left RUNNING is named, with what becomes of it, in one clause (the study's worker named its
        # runs before the sweep added its own).
        assert all(r.info.run_id in lines[0] for r in running), ([r.info.run_id for r in running], lines[0])
        assert lines[0].count("could not mark") == 1, lines[0]
    finally:
        stop_process(server)
    print(f"gave up {ended:.1f} s after the server went away (EDPS_OUTAGE_SECONDS=10): {lines[0]}")
