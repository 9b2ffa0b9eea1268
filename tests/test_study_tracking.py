"""A real study, logged over HTTP to a real `mlflow server` process started by the test session."""

import json

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from conftest import run_edps

ARGS = ["study", "--bs", "64", "--trials", "4", "--goal-error", "0.06", "--max-steps", "1000",
        "--check-interval", "100", "--sparsity", "0.5", "--log-interval", "1"]


@pytest.mark.slow
def test_study_logs_study_and_nested_trials_to_a_server_and_reuses_them(mlflow_server, tmp_path):
    experiment = "tracking-test"
    first = run_edps([*ARGS, "--experiment", experiment], cwd=tmp_path, MLFLOW_TRACKING_URI=mlflow_server)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "steps_to_result = " in first.stdout

    client = MlflowClient(mlflow_server)
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    studies = client.search_runs([experiment_id], "tags.`edps.kind` = 'study'")
    assert len(studies) == 1
    study = studies[0]
    assert study.info.status == "FINISHED"
    tags, metrics, params = study.data.tags, study.data.metrics, study.data.params
    assert tags["edps.workload"] == "digits-simple-cnn" and tags["edps.optimizer"] == "sgd"
    assert tags["edps.batch_size"] == "64" and tags["edps.sparsity"] == "0.5" and len(tags["edps.study_key"]) == 64
    assert metrics["trials/total"] == 4 and metrics["batch_size"] == 64 and metrics["sparsity"] == 0.5
    assert metrics["trials/reached"] >= 1
    steps = metrics["steps_to_result"]
    assert steps % 100 == 0 and 100 <= steps <= 1000
    assert "best.learning_rate" in params and params["spec.goal_error"] == "0.06"

    trials = client.search_runs([experiment_id], "tags.`edps.kind` = 'trial'")
    assert len(trials) == 4
    assert {t.data.tags["mlflow.parentRunId"] for t in trials} == {study.info.run_id}
    assert all(t.info.status == "FINISHED" for t in trials)
    statuses = {t.data.tags["edps.status"] for t in trials}
    assert statuses <= {"reached", "not_reached", "diverged", "superseded"}
    reached = [t for t in trials if t.data.tags["edps.status"] == "reached"]
    assert min(t.data.metrics["steps_to_result"] for t in reached) == steps
    trained = max(trials, key=lambda t: t.data.metrics["steps_trained"])
    history = client.get_metric_history(trained.info.run_id, "train/loss")
    assert [m.step for m in history] == list(range(100, int(trained.data.metrics["steps_trained"]) + 1, 100))
    assert {"learning_rate", "seed", "trial_index"} <= set(trained.data.params)
    # Metaparameters are params only (12 significant digits; trials.csv keeps the exact values), not charts.
    assert not any(key.startswith("hp/") for key in trained.data.metrics)

    # Artifacts: the mask loads without pickle, the summary counts the kept parameters.
    mask_path = client.download_artifacts(trained.info.run_id, "mask/mask.npz", str(tmp_path))
    with np.load(mask_path, allow_pickle=False) as arrays:
        kept = sum(int(arrays[name].sum()) for name in arrays.files)
    summary = json.loads(open(client.download_artifacts(trained.info.run_id, "mask/summary.json", str(tmp_path))).read())
    assert kept == summary["kept"] == round(6090 * 0.5)
    assert summary["layers"]["conv1.bias"]["kept_fraction"] == 0.0
    study_json = json.loads(open(client.download_artifacts(study.info.run_id, "study.json", str(tmp_path))).read())
    assert study_json["steps_to_result"] == steps
    table = pd.read_csv(client.download_artifacts(study.info.run_id, "trials.csv", str(tmp_path)))
    assert len(table) == 4 and set(table["run_id"]) == {t.info.run_id for t in trials}
    # What readers need of its trials is on the study run itself, and the study is in the study index.
    assert metrics["trials/runs_finished"] == 4
    assert tags["edps.trial_outcomes"] == "v1 " + " ".join(
        f"{row.trial_index}:{row.status[0]}{row.steps_trained}" + ("" if pd.isna(row.steps_to_result) else
                                                                  f"@{int(row.steps_to_result)}")
        for row in table.sort_values("trial_index").itertuples())
    index = client.search_runs([experiment_id], "attributes.run_name = 'edps study index'")
    assert len(index) == 1 and index[0].data.tags["edps.index_complete"] == "true"
    assert json.loads(index[0].data.tags[f"edps.index.{study.info.run_id}"])["status"] == "FINISHED"

    # The same study again is done: nothing trained, no second study run.
    second = run_edps([*ARGS, "--experiment", experiment], cwd=tmp_path, MLFLOW_TRACKING_URI=mlflow_server)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"study already done: steps_to_result = {int(steps)} in the finished study run {study.info.run_id}" \
        in second.stdout
    assert len(client.search_runs([experiment_id], "tags.`edps.kind` = 'trial'")) == 4
    assert len(client.search_runs([experiment_id], "tags.`edps.kind` = 'study'")) == 1

    # A study with more trials reuses the four finished trials and trains only the new ones.
    third = run_edps([*ARGS[:4], "6", *ARGS[5:], "--experiment", experiment], cwd=tmp_path,
                     MLFLOW_TRACKING_URI=mlflow_server)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "reusing 4 finished trials" in third.stdout
