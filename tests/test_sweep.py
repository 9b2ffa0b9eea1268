"""Sweeps: a complete grid, a real SIGKILL and resume, PostgreSQL behind a server (Ray against local: the adaptive
sweep on Ray in test_adaptive.py, and the example workload package on every executor in test_user_workloads.py)."""

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from conftest import (REPO, built_once, clean_environment, edps_here, fresh_store, run_edps, start_mlflow_server,
                      stop_process)

GRID = ["sweep", "--batch-sizes", "16,64", "--sparsities", "0,0.5", "--trials", "3", "--goal-error", "0.06",
        "--max-steps", "600", "--log-interval", "2"]
EXPERIMENT = "sweep-test"


def _results(uri: str, experiment: str = EXPERIMENT, sweep_count: int = 1) -> dict:
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
    assert len(sweeps) == sweep_count and all(r in sweeps or "edps.yielded_to" in r.data.tags for r in all_sweeps)
    parents = {r.data.tags["mlflow.parentRunId"] for r in studies}
    assert parents == {sweeps[0].info.run_id} if sweep_count == 1 else parents <= {r.info.run_id for r in sweeps}
    _bookkeeping_is_true(client, experiment_id, runs)
    return {r.data.tags["edps.study_key"]: (r.data.metrics.get("steps_to_result"), r.data.tags["edps.batch_size"],
                                             r.data.tags["edps.sparsity"]) for r in studies}


def _bookkeeping_is_true(client: MlflowClient, experiment_id: str, runs: list) -> None:
    """What study runs keep about their trials equals the store, whatever was killed when: a FINISHED study
    run's count of the trial runs it finished, its trials' outcomes, and the study index (each study run once,
    an entry in a final state only for a run in that state, the finished ones with the run's own result)."""
    from edps_mlflow.store import index as study_index
    from edps_mlflow.store.client import searcher
    from edps_mlflow.results import TrialOutcome, TrialStatus, decode_trial_outcomes

    trials = [r for r in runs if r.data.tags.get("edps.kind") == "trial"]
    studies = {r.info.run_id: r for r in runs if r.data.tags.get("edps.kind") == "study"}
    for study in studies.values():
        if study.info.status != "FINISHED":
            continue
        mine = [t for t in trials if t.data.tags.get("mlflow.parentRunId") == study.info.run_id
                and t.info.status == "FINISHED"]
        assert study.data.metrics["trials/runs_finished"] == len(mine), study.info.run_id
        table = pd.read_csv(client.download_artifacts(study.info.run_id, "trials.csv"))
        assert decode_trial_outcomes(study.data.tags["edps.trial_outcomes"]) == [
            TrialOutcome(int(row.trial_index), TrialStatus(row.status),
                         None if pd.isna(row.steps_to_result) else int(row.steps_to_result), int(row.steps_trained))
            for row in table.sort_values("trial_index").itertuples()]
    indexed = study_index.study_runs(searcher(client, [experiment_id]))
    assert sorted(r.info.run_id for r in indexed) == sorted(studies)
    for run in indexed:
        store = studies[run.info.run_id]
        assert run.info.status == store.info.status, run.info.run_id
        if run.info.status == "FINISHED":
            assert run.data.metrics.get("steps_to_result") == store.data.metrics.get("steps_to_result")


def _build_reference(directory: Path) -> list[str]:
    uri = fresh_store(directory / "mlflow.db")
    result = run_edps([*GRID, "--experiment", EXPERIMENT], cwd=directory, MLFLOW_TRACKING_URI=uri)
    assert result.returncode == 0, result.stderr[-3000:]
    return [str(directory), uri, result.stdout]


@pytest.fixture(scope="module")
def reference_sweep(tmp_path_factory):
    """The grid run to completion once per session with the local executor (the reference for the other tests)."""
    directory, uri, stdout = built_once(tmp_path_factory, "reference-sweep", _build_reference)
    return Path(directory), uri, stdout


@pytest.mark.slow
def test_complete_sweep_and_status(reference_sweep):
    directory, uri, stdout = reference_sweep
    assert "plan: 0 done, 0 partly done (finished trials are reused), 4 to do" in stdout
    # Progress inside the studies: every trial of the 4 x 3 reached the sweep's line.
    assert "| trials 12/12 |" in stdout.splitlines()[-3], stdout[-2000:]
    results = _results(uri)
    assert len(results) == 4 and all(steps is not None for steps, _, _ in results.values())
    code, printed = edps_here(["status", "--experiment", EXPERIMENT], uri)
    assert code == 0, printed
    lines = printed.splitlines()
    assert lines[0] == "digits-simple-cnn / sgd: steps-to-result (or trials finished)"
    assert "sparsity 0" in lines[1] and "sparsity 0.5" in lines[1]
    for steps, batch_size, sparsity in results.values():
        row = next(line for line in lines if line.split()[0] == batch_size)
        column = 1 if float(sparsity) == 0.0 else 2
        assert row.split()[column] == str(int(steps))
    # The sweep run describes its grid with each study's steps-to-result.
    client = MlflowClient(uri)
    sweep = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id], "tags.`edps.kind` = 'sweep'")[0]
    note = sweep.data.tags["mlflow.note.content"]
    assert "| batch size | sparsity 0 | sparsity 0.5 |" in note
    for steps, batch_size, sparsity in results.values():
        row = next(line for line in note.splitlines() if line.startswith(f"| {batch_size} |"))
        assert str(int(steps)) in row
    # Running the same sweep again trains nothing.
    code, printed = edps_here([*GRID, "--experiment", EXPERIMENT], uri)
    assert code == 0 and "already complete: 4 studies done" in printed, printed
    assert _results(uri) == results
    # ... and leaves the finished sweep run as it was: its end, its summary metrics.
    rerun = client.get_run(sweep.info.run_id)
    assert rerun.info.end_time == sweep.info.end_time and rerun.data.metrics == sweep.data.metrics


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
        code, printed = edps_here(["status", "--experiment", EXPERIMENT], url)
        assert code == 0 and "sparsity 0.5" in printed, printed
    finally:
        stop_process(process)


# ---- faults on purpose ----------------------------------------------------------------------
def _sweep(args: list[str], cwd: Path, **environment: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", "from edps_mlflow.cli import main; main()", *args],
        cwd=cwd, env=clean_environment(PYTHONPATH=str(REPO), **environment),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _finished_trials(uri: str) -> int:
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    if experiment is None:
        return 0
    runs = client.search_runs([experiment.experiment_id], "tags.`edps.kind` = 'trial'")
    return sum(r.info.status == "FINISHED" for r in runs)


def _doctor(uri: str) -> None:
    code, printed = edps_here(["doctor", "--experiment", EXPERIMENT], uri)
    assert code == 0, printed


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume(reference_sweep, tmp_path):
    """SIGKILL of the whole process group, then of the parent alone of the resume, at random moments; the last
    resume takes over the runs they left RUNNING (their leases expired), reuses the trials they finished and
    completes the grid with the uninterrupted sweep's results."""
    _, reference_uri, _ = reference_sweep
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # no store yet: the first victim creates it
    rng = random.Random(os.getpid())
    lease = {"MLFLOW_TRACKING_URI": uri, "EDPS_LEASE_SECONDS": "6"}
    kills = []
    # Each victim is killed a random 0-3 s after 1-3 more trials have finished: during training,
    # between trials, or while results are written.
    for target in ("group", "parent"):
        threshold = _finished_trials(uri) + rng.randint(1, 3)
        process = _sweep([*GRID, "--experiment", EXPERIMENT, "--wait"], tmp_path, **lease)
        started = time.monotonic()
        while process.poll() is None and _finished_trials(uri) < threshold:
            assert time.monotonic() - started < 300, "the sweep made no progress"
            time.sleep(0.5)
        time.sleep(rng.uniform(0.0, 3.0))
        if process.poll() is not None:
            kills.append((target, round(time.monotonic() - started, 1), "finished before the kill"))
            break
        if target == "group":
            os.killpg(process.pid, signal.SIGKILL)  # the sweep and its workers at once
        else:
            os.kill(process.pid, signal.SIGKILL)  # the parent alone: its workers must die with it
        moment = round(time.monotonic() - started, 1)
        process.communicate()
        time.sleep(1.0)
        kills.append((target, moment, f"{_finished_trials(uri)} trials finished"))
    killed_mid_way = kills[-1][2] != "finished before the kill"
    client = MlflowClient(uri)
    left_running = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id],
                                      "attributes.status = 'RUNNING'")
    assert left_running or not killed_mid_way, "a SIGKILL leaves runs RUNNING, which the resume must take over"
    resumed = run_edps([*GRID, "--experiment", EXPERIMENT, "--wait"], cwd=tmp_path, timeout=600, **lease)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    print(f"kills (target, seconds after start, store afterwards): {kills}")
    if killed_mid_way:  # the resume starts from what the victims finished (at least two trials)
        plan = re.search(r"plan: (\d+) done, (\d+) partly done", resumed.stdout)
        assert plan and int(plan.group(1)) + int(plan.group(2)) >= 1, resumed.stdout
    _doctor(uri)
    assert _results(uri) == _results(reference_uri)


@pytest.mark.slow
def test_concurrent_and_overlapping_sweeps_train_each_study_once(reference_sweep, tmp_path):
    """Two identical sweeps and one sharing two of their studies, all started at once."""
    _, reference_uri, _ = reference_sweep
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    overlapping = [*GRID, "--batch-sizes", "64"]
    processes = [_sweep([*args, "--experiment", EXPERIMENT, "--workers", "1", "--wait"], tmp_path,
                        MLFLOW_TRACKING_URI=uri) for args in (GRID, GRID, overlapping)]
    outputs = [p.communicate(timeout=900) for p in processes]
    assert [p.returncode for p in processes] == [0, 0, 0], [err[-1500:] for _, err in outputs]
    _doctor(uri)
    # The results checks that each study key has one finished run and no trial key two.
    assert _results(uri, sweep_count=2) == _results(reference_uri)


@pytest.mark.slow
def test_tracking_server_killed_and_restarted_during_a_sweep(reference_sweep, tmp_path):
    _, reference_uri, _ = reference_sweep
    server, url = start_mlflow_server(tmp_path)
    port = int(url.rsplit(":", 1)[1])
    process = _sweep([*GRID, "--experiment", EXPERIMENT], tmp_path, MLFLOW_TRACKING_URI=url)
    try:
        deadline = time.monotonic() + 300
        while _finished_trials(url) < 2:
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(1)
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        down = time.monotonic()
        time.sleep(5)
        server, _ = start_mlflow_server(tmp_path, port=port)
        outage = time.monotonic() - down
        stdout, stderr = process.communicate(timeout=600)
        if process.returncode == 0:
            outcome = f"survived a {outage:.0f} s outage through retries"
        else:
            lines = stderr.strip().splitlines()
            assert len(lines) == 1 and "tracking store" in lines[0], stderr[-3000:]
            resumed = run_edps([*GRID, "--experiment", EXPERIMENT, "--wait"], cwd=tmp_path, timeout=600,
                               MLFLOW_TRACKING_URI=url, EDPS_LEASE_SECONDS="6")
            assert resumed.returncode == 0, resumed.stderr[-3000:]
            outcome = f"failed with one line after a {outage:.0f} s outage ({lines[0]}); the resume completed it"
        print(f"server killed and restarted: {outcome}")
        _doctor(url)
        assert _results(url) == _results(reference_uri)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        stop_process(server)
