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
    assert tags["mlflow.runName"] == "bs=256 sp=0 sgd digits-simple-cnn"
    note = tags["mlflow.note.content"]
    assert "batch size 256" in note and ("steps-to-result" in note or "no trial reached" in note)
    assert f"{len(outcome.records)} trials" in note
    # The data, as MLflow datasets with a digest, one per split.
    inputs = {d.tags[0].value: d.dataset for d in study.inputs.dataset_inputs}
    assert set(inputs) == {"training", "validation"}
    assert inputs["training"].digest != inputs["validation"].digest and inputs["training"].name == "digits training"
    assert f"/#/experiments/{experiment.experiment_id}/runs/{outcome.study_run_id}" in out.getvalue()

    # Trial runs: the index and the outcome first (what the UI's narrow name column shows), then the
    # metaparameters, then the study; the exact value stays a metric.
    for record in outcome.records.values():
        trial = client.get_run(record.run_id)
        name = trial.data.tags["mlflow.runName"]
        expected = f"reached@{record.steps_to_result}" if record.status.value == "reached" \
            else record.status.value.replace("_", " ")
        assert name.startswith(f"t{record.trial.index:03d} {expected} lr=") and name.endswith("bs=256 sp=0")
        assert trial.data.tags["mlflow.source.name"] == tags["mlflow.source.name"]
