"""The queued-job executor over a backend that knows nothing of MLflow (tests/process_backend.py, the shape of
a SLURM backend): the executor makes and claims each study's run, the job adopts it, every study is measured
once in a run the sweep owns, and a rerun trains nothing. The MLflow-Projects backend, which makes its runs
itself, is tested in test_mlflow_project_executor.py."""

from __future__ import annotations

import io

import pytest
from mlflow.tracking import MlflowClient

from edps_mlflow.executors import EXECUTORS
from conftest import REPO, edps_here


def test_the_command_line_of_a_job_makes_the_study_the_sweep_planned(monkeypatch):
    import shlex

    from mlflow.projects.utils import load_project

    from edps_mlflow.mlproject import study_command, study_parameters
    from edps_mlflow.sweep import SweepSpec

    study = SweepSpec.build("digits-simple-cnn", ("momentum",), (32,), (0.5,), trials=3).studies()[0]
    parameters = study_parameters(study, "run1", "key1", "/data dir/with 'quotes'", True, "cpu", 2)
    ours = study_command(parameters, python="python")
    theirs = shlex.split(load_project(str(REPO)).get_entry_point("main").compute_command(parameters, None))
    assert ours == theirs  # exactly what MLflow Projects runs
    assert ours[ours.index("--data-dir") + 1] == "/data dir/with 'quotes'"


@pytest.mark.slow
def test_a_sweep_of_plain_process_jobs_claims_each_study_once(sqlite_store, tmp_path, monkeypatch):
    from edps_mlflow.sweep import SweepOptions, SweepSpec, run_sweep
    from process_backend import ProcessExecutor

    monkeypatch.setitem(EXECUTORS, "processes", "process_backend:ProcessExecutor")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    # A short protocol (the test is of the path, not of the numbers): the workload's own trains every trial to
    # thousands of steps, minutes of CPU for nothing this test checks.
    spec = SweepSpec.build("digits-simple-cnn", ("sgd",), (64, 128), trials=2, goal_error=0.1, max_steps=300,
                           check_interval=20)
    options = SweepOptions(experiment="queued", executor="processes", workers=2)
    out = io.StringIO()
    results = run_sweep(spec, options, out)
    assert len(results) == 2 and all(steps is not None for steps in results.values()), out.getvalue()
    assert "submitting studies to local processes (the test backend)" in out.getvalue()

    client = MlflowClient(sqlite_store)
    experiment_id = client.get_experiment_by_name("queued").experiment_id
    sweep_run = client.search_runs([experiment_id], "tags.`edps.kind` = 'sweep'")[0]
    studies = client.search_runs([experiment_id], "tags.`edps.kind` = 'study'")
    assert sweep_run.info.status == "FINISHED" and len(studies) == 2
    jobs = {job.run_id for backend in ProcessExecutor.backends for job in backend.submitted}
    for study in studies:
        # The run the executor made before it submitted the job is the one the job measured into.
        assert study.info.run_id in jobs and study.info.status == "FINISHED"
        assert study.data.tags["edps.submitted_by"] == sweep_run.info.run_id
        assert study.data.tags["mlflow.parentRunId"] == sweep_run.info.run_id
        assert "steps_to_result" in study.data.metrics

    again = io.StringIO()
    assert run_sweep(spec, options, again) == results
    assert "already complete" in again.getvalue()
    code, printed = edps_here(["doctor", "--experiment", "queued"], sqlite_store)
    assert code == 0, printed
