"""A goal-ladder study in a real sqlite store: what its study run carries of every rung, a one-goal study of an
easier rung answered by it without training, and a larger ladder that reuses its trials with their per-rung steps
and gets what training from scratch gets."""

from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from edps_mlflow.config import StudySpec
from edps_mlflow.data.fingerprint import splits_fingerprint
from edps_mlflow.store.read.trials import finished_trials, study_trial_outcomes

from conftest import run_edps
from helpers import digits_data

GOALS = (0.2, 0.1, 0.05)
COMMON = ["study", "--bs", "64", "--max-steps", "100", "--check-interval", "20"]


def _study(tmp_path, uri: str, experiment: str, *arguments: str):
    result = run_edps([*COMMON, "--experiment", experiment, *arguments], cwd=tmp_path, MLFLOW_TRACKING_URI=uri)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _runs(client: MlflowClient, experiment: str, kind: str):
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    return client.search_runs([experiment_id], f"tags.`edps.kind` = '{kind}'")


def _rung_results(run) -> dict[float, float | None]:
    return {goal: run.data.metrics.get(f"steps_to_result/goal_{goal!r}") for goal in GOALS}


@pytest.mark.slow
def test_a_ladder_study_carries_every_rung_answers_a_rung_and_grows(sqlite_store, tmp_path):
    client = MlflowClient(sqlite_store)
    ladder = ["--goals", ",".join(map(str, GOALS))]
    _study(tmp_path, sqlite_store, "ladder", *ladder, "--trials", "3")
    [study] = _runs(client, "ladder", "study")
    tags, metrics = study.data.tags, study.data.metrics
    rungs = _rung_results(study)
    assert tags["edps.goals"] == "0.2,0.1,0.05"
    assert rungs[0.2] is not None and rungs[0.1] is not None and rungs[0.2] < rungs[0.1]
    assert metrics.get("steps_to_result") == rungs[0.05]
    spec = StudySpec.build("digits-simple-cnn", "sgd", 0.0, 64, trials=3, max_steps=100, check_interval=20,
                           goals=GOALS)
    spec = replace(spec, data_fingerprint=splits_fingerprint(digits_data()))  # as the study fingerprints its data
    assert tags["edps.study_key"] == spec.study_key
    for goal in GOALS:
        assert tags[f"edps.goal_key.{goal!r}"] == spec.rung(goal).study_key
    description = tags["mlflow.note.content"]
    assert all(f"<= {goal:g}: " in description for goal in GOALS), description
    assert f"<= 0.2: {int(rungs[0.2])} steps (trial {tags['edps.goal_best_trial.0.2']})" in description
    table = pd.read_csv(client.download_artifacts(study.info.run_id, "trials.csv", str(tmp_path)))
    for goal in GOALS[:-1]:
        assert table[f"steps_to_goal_{goal!r}"].min() == rungs[goal]
    goals_json = json.loads(open(client.download_artifacts(study.info.run_id, "study.json", str(tmp_path))).read())
    assert [g["steps_to_result"] for g in goals_json["goals"]] == [rungs[g] for g in GOALS]
    # An easier rung's trials that its tag no longer holds (too many for one) come from trials.csv, listed as that
    # goal's one-goal study lists them (an adaptive sweep's bootstrap reads them so).
    from_tag = study_trial_outcomes(client, study.info.run_id, 0.1)
    assert any(t.steps_to_result == rungs[0.1] for t in from_tag)
    client.delete_tag(study.info.run_id, "edps.goal_outcomes.0.1")
    assert study_trial_outcomes(client, study.info.run_id, 0.1) == from_tag

    # (i) A one-goal study of an easier rung is the ladder's answer: no training, no new study run.
    answered = _study(tmp_path, sqlite_store, "ladder", "--goal-error", "0.1", "--trials", "3")
    assert f"study already done: steps_to_result = {int(rungs[0.1])} in the goal ladder" in answered.stdout
    assert study.info.run_id in answered.stdout
    assert len(_runs(client, "ladder", "study")) == 1

    # (iii) The same ladder with more trials reuses the three, each with its steps at every rung, and gets what a
    # fresh five-trial ladder gets.
    stored = finished_trials(client, study.info.experiment_id, spec)
    assert len(stored) == 3 and all(len(t.goal_steps) == 3 for t in stored.values())
    assert min(t.goal_steps[0] for t in stored.values() if t.goal_steps[0] is not None) == rungs[0.2]
    grown = _study(tmp_path, sqlite_store, "ladder", *ladder, "--trials", "5")
    assert "reused 3, trained 2" in grown.stdout, grown.stdout
    _study(tmp_path, sqlite_store, "scratch", *ladder, "--trials", "5")
    [larger] = [r for r in _runs(client, "ladder", "study") if r.info.run_id != study.info.run_id]
    [scratch] = _runs(client, "scratch", "study")
    assert _rung_results(larger) == _rung_results(scratch)
    assert all(larger.data.tags[f"edps.goal_best_trial.{g!r}"] == scratch.data.tags[f"edps.goal_best_trial.{g!r}"]
               for g in GOALS if _rung_results(scratch)[g] is not None)
