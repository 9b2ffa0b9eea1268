"""Probes along whole runs, as the paper measures the Lipschitz constant: `--probe-trials best` (the
study trains without probes, then trains its best trial again with them, to its goal) and
`--probe-trials all` (every trial probes and trains its whole run). Real studies on digits, a real
local store."""

import json

import pytest
from mlflow.tracking import MlflowClient

from analysis.cli import main as analyze
from edps_mlflow.config import ProbeTrials, StudySpec
from edps_mlflow.errors import EdpsError
from edps_mlflow.study import ExecutionOptions, run_study

# The best trial reaches at step 40 (bs 256 and 512); a cap of 60 lets the other trials train past where exact
# early stopping would cut them, which is what --probe-trials all must not do.
PROTOCOL = dict(trials=3, goal_error=0.1, max_steps=60, check_interval=20, probe_interval=20)


def spec(probes=(), probe_trials="best", batch_size=256):
    return StudySpec.build("digits-simple-cnn", "sgd", 0.0, batch_size, probes=probes, probe_trials=probe_trials,
                           **PROTOCOL)


def options(**extra):
    # One thread, as every test that trains in this process (one worker would otherwise take every core).
    return ExecutionOptions(workers=1, threads=1, experiment="probe-trials", log_interval=60.0, **extra)


def runs(client, kind, **tags):
    experiment = client.get_experiment_by_name("probe-trials").experiment_id
    conditions = " and ".join([f"tags.`edps.kind` = '{kind}'"] + [f"tags.`{k}` = '{v}'" for k, v in tags.items()])
    return client.search_runs([experiment], conditions)


def test_keys_say_which_trials_probe():
    plain, best, every = spec(), spec(("lipschitz",)), spec(("lipschitz",), "all")
    assert best.probe_trials is ProbeTrials.BEST and every.probe_trials is ProbeTrials.ALL
    # Three different studies, one measurement: probes never change a result.
    assert len({plain.study_key, best.study_key, every.study_key}) == 3
    assert plain.result_key == best.result_key == every.result_key == plain.study_key
    # A best-only study trains the plain study's trials; its probed re-run is the all-trials study's trial.
    assert best.training_spec == plain and best.probe_spec == every
    assert every.trains_whole_runs and not best.trains_whole_runs and not plain.trains_whole_runs
    # Without probes the choice means nothing and changes no key.
    assert spec((), "all").study_key == spec((), "best").study_key == plain.study_key
    with pytest.raises(EdpsError, match="unknown probe trials 'some'; choose best or all"):
        spec(("lipschitz",), "some")


def test_best_mode_reuses_the_plain_study_and_probes_its_best_trial_along_the_whole_run(sqlite_store, tmp_path,
                                                                                        capsys):
    plain = run_study(spec(), options())
    client = MlflowClient(sqlite_store)
    assert plain.steps_to_result is not None
    best_index = plain.best_record().trial.index

    probed = run_study(spec(("lipschitz",)), options())
    out = capsys.readouterr().out
    # Every trial is the plain study's (same trial keys): nothing trained but the best trial's probed run.
    assert probed.reused == 3 and probed.trained == 0
    assert probed.steps_to_result == plain.steps_to_result
    assert f"training the best trial (trial {best_index}) again with lipschitz every 20 steps" in out
    study = client.get_run(probed.study_run_id)
    tags = study.data.tags
    assert tags["edps.probed_trials"] == "best"
    assert tags["edps.result_key"] == client.get_run(plain.study_run_id).data.tags["edps.study_key"]
    probe_run = client.get_run(tags["edps.best_probe_run"])
    assert probe_run.data.tags["mlflow.parentRunId"] == study.info.run_id
    assert probe_run.data.tags["edps.trial_key"] != plain.best_record().trial.trial_key
    assert " probed " in probe_run.data.tags["mlflow.runName"]
    # The probed run follows the same trajectory: the same step reaches the goal, and it probed every
    # 20 steps along the way, however early stopping would have cut a trial.
    assert probe_run.data.tags["edps.status"] == "reached"
    assert probe_run.data.metrics["steps_to_result"] == plain.steps_to_result
    steps = [m.step for m in client.get_metric_history(probe_run.info.run_id, "probe/lipschitz")]
    assert steps == list(range(20, plain.steps_to_result + 1, 20))
    assert study.data.metrics["probe/seconds"] > 0
    assert "Probes: the best trial" in tags["mlflow.note.content"]
    document = json.loads(open(client.download_artifacts(study.info.run_id, "study.json", str(tmp_path))).read())
    assert document["probed_trials"]["best_probe_run_id"] == probe_run.info.run_id

    # Asked again: the study is done; an all-trials study reuses the best trial's probed run.
    again = run_study(spec(("lipschitz",)), options())
    assert again.trained == 0 and not again.records
    every = run_study(spec(("lipschitz",), "all"), options())
    capsys.readouterr()
    assert every.records[best_index].reused and every.records[best_index].run_id == probe_run.info.run_id

    # The analysis counts the three studies as one point, and reads the constant along the best run.
    analyze(["export", "--tracking-uri", sqlite_store, "--experiment", "probe-trials"])
    exported = capsys.readouterr().out.strip().splitlines()
    assert len(exported) == 2  # the header and one study
    analyze(["lipschitz", "--tracking-uri", sqlite_store, "--experiment", "probe-trials", "--format", "json"])
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 1 and rows[0]["batch_size"] == 256 and rows[0]["trials_used"] == 1
    assert rows[0]["probe_steps"] == len(steps) and 0 < rows[0]["lipschitz_median"] <= rows[0]["lipschitz_max"]
    assert rows[0]["source"] == "best trial, whole run"


def test_all_mode_trains_every_trial_to_its_end(sqlite_store):
    outcome = run_study(spec(("lipschitz",), "all", batch_size=512), options())
    client = MlflowClient(sqlite_store)
    study = runs(client, "study")[0]
    # No trial is cut by exact early stopping: each ran to its goal, the cap or divergence.
    assert study.data.tags["edps.early_stopping"] == "full_trials"
    assert all(r.status.value != "superseded" for r in outcome.records.values())
    best = outcome.best_record()
    assert study.data.tags["edps.probed_trials"] == "all"
    assert study.data.tags["edps.best_probe_run"] == best.run_id
    for record in outcome.records.values():
        history = client.get_metric_history(record.run_id, "probe/lipschitz")
        assert [m.step for m in history] == list(range(20, record.steps_trained + 1, 20))


def test_a_study_without_a_reaching_trial_has_nothing_to_probe(sqlite_store, capsys):
    hopeless = StudySpec.build("digits-simple-cnn", "sgd", 0.0, 256, trials=1, goal_error=0.001, max_steps=20,
                               check_interval=20, probes=("lipschitz",), probe_interval=10)
    outcome = run_study(hopeless, options())
    assert outcome.steps_to_result is None
    assert "no trial reached the goal, so there is no best trial to probe" in capsys.readouterr().out
    study = runs(MlflowClient(sqlite_store), "study")[0]
    assert study.data.tags["edps.probed_trials"] == "best" and "edps.best_probe_run" not in study.data.tags
