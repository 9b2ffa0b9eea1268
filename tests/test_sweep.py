"""Sweeps: a complete grid, a real SIGKILL and resume, Ray against local, PostgreSQL behind a server."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from conftest import REPO, clean_environment, run_edps, start_mlflow_server, stop_process

GRID = ["sweep", "--batch-sizes", "16,64", "--sparsities", "0,0.5", "--trials", "3", "--goal-error", "0.06",
        "--max-steps", "600", "--log-interval", "2"]
EXPERIMENT = "sweep-test"


def _results(uri: str, experiment: str = EXPERIMENT) -> dict:
    """study key -> (steps_to_result, batch size, sparsity) of the FINISHED study runs; checks uniqueness."""
    client = MlflowClient(uri)
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    runs = client.search_runs([experiment_id], run_view_type=ViewType.ALL, max_results=5000)
    assert not [r for r in runs if r.info.status == "RUNNING"], "no run may be left RUNNING"
    studies = [r for r in runs if r.data.tags.get("edps.kind") == "study" and r.info.status == "FINISHED"]
    keys = [r.data.tags["edps.study_key"] for r in studies]
    assert len(keys) == len(set(keys)), "one finished study run per study key"
    trials = [r for r in runs if r.data.tags.get("edps.kind") == "trial" and r.info.status == "FINISHED"]
    trial_keys = [r.data.tags["edps.trial_key"] for r in trials]
    assert len(trial_keys) == len(set(trial_keys)), "no finished trial trained twice"
    # One finished sweep run; a sweep run created at the same moment as it gave way (FAILED, tagged).
    all_sweeps = [r for r in runs if r.data.tags.get("edps.kind") == "sweep"]
    sweeps = [r for r in all_sweeps if r.info.status == "FINISHED"]
    assert len(sweeps) == 1 and all(r in sweeps or "edps.yielded_to" in r.data.tags for r in all_sweeps)
    assert {r.data.tags["mlflow.parentRunId"] for r in studies} == {sweeps[0].info.run_id}
    return {r.data.tags["edps.study_key"]: (r.data.metrics.get("steps_to_result"), r.data.tags["edps.batch_size"],
                                             r.data.tags["edps.sparsity"]) for r in studies}


@pytest.fixture(scope="module")
def reference_sweep(tmp_path_factory):
    """The grid run to completion once with the local executor (the reference for the other tests)."""
    directory = tmp_path_factory.mktemp("reference-sweep")
    uri = f"sqlite:///{directory / 'mlflow.db'}"
    result = run_edps([*GRID, "--experiment", EXPERIMENT], cwd=directory, MLFLOW_TRACKING_URI=uri)
    assert result.returncode == 0, result.stderr[-3000:]
    return directory, uri, result.stdout


def test_complete_sweep_and_status(reference_sweep):
    directory, uri, stdout = reference_sweep
    assert "plan: 0 done, 0 partly done (finished trials are reused), 4 to do" in stdout
    results = _results(uri)
    assert len(results) == 4 and all(steps is not None for steps, _, _ in results.values())
    status = run_edps(["status", "--experiment", EXPERIMENT], cwd=directory, MLFLOW_TRACKING_URI=uri)
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0] == "digits-simple-cnn / sgd: steps-to-result (or trials finished)"
    assert "sparsity 0" in lines[1] and "sparsity 0.5" in lines[1]
    for steps, batch_size, sparsity in results.values():
        row = next(line for line in lines if line.split()[0] == batch_size)
        column = 1 if float(sparsity) == 0.0 else 2
        assert row.split()[column] == str(int(steps))
    # Running the same sweep again trains nothing.
    again = run_edps([*GRID, "--experiment", EXPERIMENT], cwd=directory, MLFLOW_TRACKING_URI=uri)
    assert again.returncode == 0 and "plan: 4 done, 0 partly done" in again.stdout
    assert _results(uri) == results


def test_sigkill_mid_sweep_then_resume(reference_sweep, tmp_path):
    _, reference_uri, _ = reference_sweep
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # A client creates the store's tables when it is made; made while the process under test
    # creates them too, one of the two crashes (a loaded machine makes that likely).
    client = MlflowClient(uri)
    process = subprocess.Popen(
        [sys.executable, "-c", "from edps_mlflow.cli import main; main()", *GRID, "--experiment", EXPERIMENT],
        cwd=tmp_path, env=clean_environment(PYTHONPATH=str(REPO), MLFLOW_TRACKING_URI=uri, EDPS_LEASE_SECONDS="6"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        time.sleep(0.5)
        assert process.poll() is None, process.communicate()
        experiment = client.get_experiment_by_name(EXPERIMENT) if (tmp_path / "mlflow.db").exists() else None
        if experiment is None:
            continue
        runs = client.search_runs([experiment.experiment_id], "tags.`edps.kind` = 'trial'")
        if sum(r.info.status == "FINISHED" for r in runs) >= 3 and any(r.info.status == "RUNNING" for r in runs):
            break
    else:
        pytest.fail("the sweep never got mid-way")
    os.killpg(process.pid, signal.SIGKILL)  # the sweep and its workers, with no chance to clean up
    process.communicate()
    left_running = client.search_runs([experiment.experiment_id], "attributes.status = 'RUNNING'")
    assert left_running, "a SIGKILL leaves runs RUNNING, which the resume must clean up"

    # Killed runs keep their lease until it expires: the resume waits that long (6 s here), then
    # marks them FAILED and takes over.
    resumed = run_edps([*GRID, "--experiment", EXPERIMENT, "--wait"], cwd=tmp_path, MLFLOW_TRACKING_URI=uri,
                       EDPS_LEASE_SECONDS="6")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # The resume starts from what the killed sweep finished: at least three finished trials, so at
    # least one study is done or partly done (its trials reused).
    plan = re.search(r"plan: (\d+) done, (\d+) partly done", resumed.stdout)
    assert plan and int(plan.group(1)) + int(plan.group(2)) >= 1, resumed.stdout
    assert _results(uri) == _results(reference_uri)


@pytest.mark.slow
def test_ray_executor_gives_the_local_results(reference_sweep, tmp_path):
    pytest.importorskip("ray")
    _, reference_uri, _ = reference_sweep
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = run_edps([*GRID, "--experiment", EXPERIMENT, "--executor", "ray", "--workers", "2"], cwd=tmp_path,
                      timeout=600, MLFLOW_TRACKING_URI=uri, RAY_ENABLE_UV_RUN_RUNTIME_ENV="0")
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    assert _results(uri) == _results(reference_uri)


def _postgres_available() -> str | None:
    if shutil.which("pg_ctlcluster") is None or not Path("/etc/postgresql/15/main").exists():
        return "PostgreSQL 15 (pg_ctlcluster) is not installed here"
    if os.geteuid() != 0:
        return "starting the PostgreSQL cluster needs root"
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "psycopg2 is not installed (pip install psycopg2-binary)"
    return None


@pytest.fixture(scope="module")
def postgres_uri():
    reason = _postgres_available()
    if reason:
        pytest.skip(f"PostgreSQL-backed server test skipped: {reason}")
    subprocess.run(["pg_ctlcluster", "15", "main", "start"], capture_output=True)
    sql = ("DROP DATABASE IF EXISTS edps_test; DROP ROLE IF EXISTS edps_test; "
           "CREATE ROLE edps_test LOGIN PASSWORD 'edps_test'; CREATE DATABASE edps_test OWNER edps_test;")
    for statement in sql.split("; "):
        done = subprocess.run(["su", "postgres", "-c", f'psql -q -c "{statement.rstrip(";")};"'],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    return "postgresql+psycopg2://edps_test:edps_test@127.0.0.1:5432/edps_test"


@pytest.mark.slow
def test_sweep_against_a_postgresql_backed_server(postgres_uri, reference_sweep, tmp_path):
    _, reference_uri, _ = reference_sweep
    process, url = start_mlflow_server(tmp_path, postgres_uri)
    try:
        result = run_edps([*GRID, "--experiment", EXPERIMENT], cwd=tmp_path, MLFLOW_TRACKING_URI=url)
        assert result.returncode == 0, result.stderr[-3000:]
        assert _results(url) == _results(reference_uri)
        status = run_edps(["status", "--experiment", EXPERIMENT], cwd=tmp_path, MLFLOW_TRACKING_URI=url)
        assert status.returncode == 0 and "sparsity 0.5" in status.stdout
    finally:
        stop_process(process)
