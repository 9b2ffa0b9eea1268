"""Whole studies in this process, trained by parallel worker processes, on a local sqlite store."""

import io
from dataclasses import replace

import pytest

from edps_mlflow.config import StudySpec
from edps_mlflow.results import TrialStatus
from edps_mlflow.study import ExecutionOptions, run_study

# Trials reach at 200 (the result, three of them) and 900; two never do, and train to the cap in full mode.
SPEC = StudySpec("digits-simple-cnn", "sgd", 0.0, batch_size=32, trials=6, goal_error=0.06,
                 max_steps=1000, check_interval=100, seed=0)


@pytest.mark.slow
def test_exact_early_stopping_and_full_trials_give_the_same_study_result(sqlite_store):
    early = run_study(SPEC, ExecutionOptions(workers=2, experiment="early"), out=io.StringIO())
    # Every trial to its end needs no shared bound: in this process (two workers would add only their start-up).
    full = run_study(SPEC, ExecutionOptions(workers=1, full_trials=True, experiment="full"), out=io.StringIO())
    assert early.steps_to_result is not None
    assert early.steps_to_result == full.steps_to_result
    assert full.count(TrialStatus.SUPERSEDED) == 0 and early.count(TrialStatus.SUPERSEDED) > 0
    assert early.trial_steps < full.trial_steps
    assert len(early.records) == len(full.records) == 6

    # A study at a neighbouring batch size runs the most promising trials first.
    out = io.StringIO()
    neighbour = run_study(replace(SPEC, batch_size=64), ExecutionOptions(workers=1, threads=1, experiment="early"), out=out)
    assert "trial order: nearest to the best trial at batch size 32" in out.getvalue()
    assert neighbour.trained == 6 and neighbour.reused == 0
