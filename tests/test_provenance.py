"""What a study leaves for a person reading the MLflow UI: provenance, datasets, names, descriptions,
and where its artifacts go."""

import io
from pathlib import Path

from mlflow.tracking import MlflowClient

from edps_mlflow import __version__
from edps_mlflow.config import StudySpec
from edps_mlflow.study import ExecutionOptions, run_study


def test_a_study_run_says_who_ran_what_on_which_data(sqlite_store, tmp_path):
    spec = StudySpec.build("digits-simple-cnn", "sgd", 0.0, 256, trials=3, max_steps=60)
    out = io.StringIO()
    outcome = run_study(spec, ExecutionOptions(workers=1, threads=1, experiment="provenance"), out=out)
    client = MlflowClient(sqlite_store)
    experiment = client.get_experiment_by_name("provenance")
    # The experiment explains itself, and its artifacts sit next to the database, not in the cwd.
    assert "study" in experiment.tags["mlflow.note.content"] and "trial" in experiment.tags["mlflow.note.content"]
    assert experiment.artifact_location == (tmp_path / "mlflow-artifacts" / "provenance").as_uri()
    assert (tmp_path / "mlflow-artifacts" / "provenance").is_dir() and not (tmp_path / "mlruns").exists()

    study = client.get_run(outcome.study_run_id)
    tags = study.data.tags
    assert tags["mlflow.user"] and tags["mlflow.source.type"] == "LOCAL"
    assert tags["mlflow.source.name"].startswith("edps")
    assert tags["edps.code_version"].startswith(__version__)
    if (Path(__file__).resolve().parents[1] / ".git").exists():
        assert len(tags["mlflow.source.git.commit"]) == 40
        assert tags["edps.code_version"].split("+g")[1][:12] == tags["mlflow.source.git.commit"][:12]
    # The page's title and its description lead with the result and the trial that reached it, linked: the page
    # lists only the 10 newest child runs, above the description.
    best = outcome.best_record()
    result = "no result" if best is None else f"{outcome.steps_to_result} steps by t{best.trial.index:03d}"
    assert tags["mlflow.runName"] == f"bs=256 sp=0 sgd digits-simple-cnn: {result}"
    note = tags["mlflow.note.content"]
    first, rest = note.split("\n\n", 1)
    if best is None:
        assert first.startswith("**no trial reached the goal** (validation error <= ")
    else:
        assert first.startswith(f"**steps-to-result {outcome.steps_to_result}** (validation error <= ")
        assert f"[trial {best.trial.index}](#/experiments/{experiment.experiment_id}/runs/{best.run_id}?" in first
    assert "batch size 256" in rest and f"{len(outcome.records)} trials" in rest
    # The data, as MLflow datasets with a digest, one per split.
    inputs = {d.tags[0].value: d.dataset for d in study.inputs.dataset_inputs}
    assert set(inputs) == {"training", "validation"}
    assert inputs["training"].digest != inputs["validation"].digest and inputs["training"].name == "digits training"
    assert f"/#/experiments/{experiment.experiment_id}/runs/{outcome.study_run_id}" in out.getvalue()

    # Trial runs: the index and the outcome first (what the UI's narrow name column shows), then the
    # metaparameters, then the study. Their metrics are what has a history (validation/error and its distance to
    # the goal beside it, at every check) and the summary numbers the runs table sorts; one-value facts are params.
    for record in outcome.records.values():
        trial = client.get_run(record.run_id)
        name = trial.data.tags["mlflow.runName"]
        expected = f"reached@{record.steps_to_result}" if record.status.value == "reached" \
            else record.status.value.replace("_", " ")
        assert name.startswith(f"t{record.trial.index:03d} {expected} lr=") and name.endswith("bs=256 sp=0")
        assert trial.data.tags["mlflow.source.name"] == tags["mlflow.source.name"]
        metrics, params = trial.data.metrics, trial.data.params
        assert set(metrics) - {"validation/error", "validation/error_minus_goal", "train/loss", "learning_rate"} <= {
            "steps_trained", "steps_to_result", "best_validation_error"}, metrics
        assert params["batch_size"] == "256" and float(params["sparsity"]) == 0.0
        assert {"trial/seconds", "validation/checks_cut_short", "learning_rate"} <= set(params)
        assert float(params["goal"]) == spec.goal_error
        if record.steps_trained:
            errors = client.get_metric_history(record.run_id, "validation/error")
            margins = client.get_metric_history(record.run_id, "validation/error_minus_goal")
            assert [(m.step, m.value) for m in margins] == [(m.step, m.value - spec.goal_error) for m in errors]
            assert float(params["train/seconds_per_step"]) == record.seconds_per_step
