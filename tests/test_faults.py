"""Faults on purpose: concurrent first use of a store, SIGKILL at random moments, concurrent sweeps,
a tracking server that goes away. Real processes, real signals, the digits workload."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import REPO, clean_environment, run_edps

EDPS = [sys.executable, "-c", "from edps_mlflow.cli import main; main()"]
SMALL_STUDY = ["study", "--trials", "1", "--goal-error", "0.06", "--max-steps", "200", "--check-interval", "20",
               "--workers", "1", "--log-interval", "5"]
# Builds the store as every edps command does, then stops (no torch: a kill lands in initialisation).
INITIALISE = "import sys; from edps_mlflow.tracking import open_store; open_store(sys.argv[1])"


def _popen(args: list[str], cwd: Path, **environment: str) -> subprocess.Popen:
    return subprocess.Popen(args, cwd=cwd, env=clean_environment(PYTHONPATH=str(REPO), **environment),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


@pytest.mark.slow
def test_four_studies_at_once_on_a_new_store_all_succeed(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    processes = [_popen([*EDPS, *SMALL_STUDY, "--bs", str(bs), "--experiment", "concurrent"], tmp_path,
                        MLFLOW_TRACKING_URI=uri) for bs in (16, 32, 64, 128)]
    outputs = [p.communicate(timeout=240) for p in processes]
    assert [p.returncode for p in processes] == [0, 0, 0, 0], [err[-1500:] for _, err in outputs]
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("concurrent")
    studies = client.search_runs([experiment.experiment_id], "tags.`edps.kind` = 'study'")
    assert sorted(r.data.tags["edps.batch_size"] for r in studies) == ["128", "16", "32", "64"]
    assert all(r.info.status == "FINISHED" for r in studies)


@pytest.mark.slow
def test_sigkill_during_initialisation_leaves_a_usable_store(tmp_path):
    rng = random.Random(os.getpid())
    moments = sorted(round(rng.uniform(0.5, 6.0), 2) for _ in range(3))
    for number, moment in enumerate(moments):
        database = tmp_path / f"store-{number}" / "mlflow.db"
        database.parent.mkdir()
        uri = f"sqlite:///{database}"
        victim = _popen([sys.executable, "-c", INITIALISE, uri], tmp_path)
        time.sleep(moment)
        os.killpg(victim.pid, signal.SIGKILL)
        victim.communicate()
        # Killed at any moment: no store, or a complete one; never a half-migrated file in its place.
        after = _popen([sys.executable, "-c", INITIALISE, uri], tmp_path)
        _, stderr = after.communicate(timeout=120)
        assert after.returncode == 0, (moment, stderr[-1500:])
        assert MlflowClient(uri).search_experiments()
    # And a real command on the last of them.
    done = run_edps([*SMALL_STUDY, "--bs", "64", "--experiment", "after-kill"], cwd=tmp_path,
                    MLFLOW_TRACKING_URI=uri, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    print(f"killed during initialisation at {moments} s; each store usable afterwards")


def test_a_half_migrated_store_is_one_clear_line(tmp_path):
    database = tmp_path / "mlflow.db"
    connection = sqlite3.connect(database)
    connection.executescript("create table alembic_version (version_num varchar(32) not null);"
                             "insert into alembic_version values ('451aebb31d03');"
                             "create table experiments (experiment_id integer primary key, name text);")
    connection.close()
    result = run_edps(["status", "--experiment", "anything"], cwd=tmp_path, timeout=120,
                      MLFLOW_TRACKING_URI=f"sqlite:///{database}")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "half-migrated" in lines[0] and "remove it" in lines[0], result.stderr


@pytest.mark.slow
def test_the_same_study_three_times_at_once_trains_once(tmp_path):
    """Two plain studies and one with --wait, started together: one trains, a plain loser stops with
    one line, the waiting one ends with the winner's result. Nothing is trained twice."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [*EDPS, *SMALL_STUDY, "--trials", "2", "--bs", "32", "--experiment", "same-study"]
    processes = [_popen([*args, *extra], tmp_path, MLFLOW_TRACKING_URI=uri) for extra in ([], [], ["--wait"])]
    outputs = [p.communicate(timeout=300) for p in processes]
    codes = [p.returncode for p in processes]
    assert codes[2] == 0, outputs[2][1][-2000:]
    assert codes.count(0) >= 2 and set(codes) <= {0, 2}, [(c, err[-800:]) for c, (_, err) in zip(codes, outputs)]
    for code, (_, stderr) in zip(codes, outputs):
        if code == 2:
            assert len(stderr.strip().splitlines()) == 1 and "live run" in stderr and "--wait" in stderr, stderr
    client = MlflowClient(uri)
    experiment_id = client.get_experiment_by_name("same-study").experiment_id
    runs = client.search_runs([experiment_id])
    studies = [r for r in runs if r.data.tags.get("edps.kind") == "study" and r.info.status == "FINISHED"]
    trials = [r.data.tags["edps.trial_key"] for r in runs if r.data.tags.get("edps.kind") == "trial"]
    assert len(studies) == 1 and len(trials) == len(set(trials)) == 2
    assert all(r.info.status != "RUNNING" for r in runs)
    steps = studies[0].data.metrics.get("steps_to_result")
    waited = outputs[2][0]
    assert f"steps_to_result = {int(steps)}" in waited if steps is not None else True
    doctor = run_edps(["doctor", "--experiment", "same-study"], cwd=tmp_path, MLFLOW_TRACKING_URI=uri)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr


def test_mlflow_run_id_of_a_finished_study_is_refused(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = run_edps([*SMALL_STUDY, "--bs", "64", "--experiment", "launcher"], cwd=tmp_path, MLFLOW_TRACKING_URI=uri)
    assert first.returncode == 0, first.stderr[-2000:]
    client = MlflowClient(uri)
    experiment_id = client.get_experiment_by_name("launcher").experiment_id
    study = client.search_runs([experiment_id], "tags.`edps.kind` = 'study'")[0]
    again = run_edps([*SMALL_STUDY, "--bs", "128", "--experiment", "launcher"], cwd=tmp_path,
                     MLFLOW_TRACKING_URI=uri, MLFLOW_RUN_ID=study.info.run_id)
    assert again.returncode == 2
    assert again.stderr.strip().count("\n") == 0 and "MLFLOW_RUN_ID" in again.stderr, again.stderr
    after = client.get_run(study.info.run_id)
    assert after.info.status == "FINISHED" and "edps.error" not in after.data.tags


def test_an_unreachable_server_fails_fast_with_one_line(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.monotonic()
    result = run_edps(["status", "--experiment", "x"], cwd=tmp_path, timeout=120,
                      MLFLOW_TRACKING_URI=f"http://user:secret@127.0.0.1:{port}")
    seconds = time.monotonic() - started
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "secret" not in lines[0], result.stderr
    assert seconds < 40, seconds
    print(f"unreachable server: failed in {seconds:.1f} s")
