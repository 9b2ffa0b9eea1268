"""Trial runs of both layouts read alike: one-value numbers as metrics (trial runs written before issue 41)
and as params under the same names (since)."""

from mlflow.tracking import MlflowClient

from edps_mlflow import names as n
from edps_mlflow.config import StudySpec, study_family
from edps_mlflow.store.client import connect
from edps_mlflow.store.read.trials import finished_trials


def _trial_run(client: MlflowClient, experiment_id: str, spec: StudySpec, key: str, *, old: bool) -> str:
    tags = {n.TAG_KIND: n.KIND_TRIAL, n.TAG_STUDY_FAMILY: study_family(spec), n.TAG_TRIAL_KEY: key,
            n.TAG_STUDY_KEY: spec.study_key, n.TAG_STATUS: "reached"}
    run_id = client.create_run(experiment_id, tags=tags).info.run_id
    numbers = {n.METRIC_SECONDS_PER_STEP: 0.1 + 0.2, n.METRIC_PACK_SIZE: 32.0 / 3}
    client.log_metric(run_id, n.METRIC_STEPS_TO_RESULT, 40)
    client.log_metric(run_id, n.METRIC_STEPS_TRAINED, 40)
    for name, value in numbers.items():
        if old:
            client.log_metric(run_id, name, value)
        else:  # as the tracker logs them: repr, so that they read back exactly
            client.log_param(run_id, name, repr(value))
    client.set_terminated(run_id, "FINISHED")
    return run_id


def test_a_reused_trial_reads_its_time_per_step_from_either_layout(sqlite_store):
    spec = StudySpec.build("digits-simple-cnn", "sgd", 0.0, 64, trials=2, max_steps=60)
    client = MlflowClient(sqlite_store)
    experiment_id = client.create_experiment("layouts")
    runs = {old: _trial_run(client, experiment_id, spec, f"key-{old}", old=old) for old in (True, False)}
    found = finished_trials(connect(sqlite_store), experiment_id, spec)
    for old, run_id in runs.items():
        trial = found[f"key-{old}"]
        assert trial.run_id == run_id and trial.steps_to_result == 40
        assert trial.seconds_per_step == 0.1 + 0.2 and trial.pack_size == 32.0 / 3  # bit for bit
