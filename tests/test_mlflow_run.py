"""`mlflow run . --env-manager local` of the `main` entry point, as a user runs it."""

import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from conftest import REPO, clean_environment, fresh_store


def _mlflow_run(uri: str, tmp_path, *parameters: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "mlflow", "run", str(REPO), "--env-manager", "local",
               "--experiment-name", "mlflow-run-test"]
    for parameter in parameters:
        command += ["-P", parameter]
    return subprocess.run(command, cwd=tmp_path, env=clean_environment(MLFLOW_TRACKING_URI=uri),
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_mlflow_run_main_entry_point(tmp_path):
    # A store to work in (a first `mlflow run` on no store: test_newcomer.py, test_mlflow_environment.py), and
    # a study whose goals the first check reaches: what is tested is whose run the study is, not its training. A
    # goal ladder costs nothing more here and shows the MLproject passes one.
    uri = fresh_store(tmp_path / "mlflow.db")
    result = _mlflow_run(uri, tmp_path, "bs=64", "trials=2", "goals=0.6,0.5", "max_steps=40", "check_interval=20")
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    client = MlflowClient(uri)
    experiment_id = client.get_experiment_by_name("mlflow-run-test").experiment_id
    runs = client.search_runs([experiment_id])
    studies = [r for r in runs if r.data.tags.get("edps.kind") == "study"]
    trials = [r for r in runs if r.data.tags.get("edps.kind") == "trial"]
    assert len(studies) == 1 and len(trials) == 2
    study = studies[0]
    # The run that `mlflow run` created is the study run: its own params and ours side by side.
    assert study.data.params["bs"] == "64" and study.data.params["spec.batch_size"] == "64"
    assert study.info.status == "FINISHED" and "steps_to_result" in study.data.metrics
    assert study.data.tags["edps.goals"] == "0.6,0.5" and study.data.params["goals"] == "0.6,0.5"
    assert {"steps_to_result/goal_0.6", "steps_to_result/goal_0.5"} <= set(study.data.metrics)
    assert {t.data.tags["mlflow.parentRunId"] for t in trials} == {study.info.run_id}

    refused = _mlflow_run(uri, tmp_path, "bs=0")
    assert refused.returncode != 0
    assert "edps: error: batch size must be a positive integer, got 0" in refused.stderr
    assert "Traceback" not in refused.stderr
    failed = [r for r in client.search_runs([experiment_id]) if r.info.run_id != study.info.run_id
              and r.data.tags.get("edps.kind") not in ("trial", "study_index")]
    # MLflow made that run before our code started; it is FAILED and says why, with nothing else in it.
    assert len(failed) == 1 and failed[0].info.status == "FAILED"
    assert failed[0].data.tags["edps.error"].startswith("batch size must be a positive integer")
    assert not any(k.startswith("spec.") for k in failed[0].data.params)
