"""Goal ladders, held without a store: every rung's steps-to-result equals a one-goal study of that rung, bit for
bit, on the single-trial path and in packed chunks, with and without early abort, and the ladder trains exactly the
hardest one-goal study's trial-steps; a ladder's keys; which ladders a study accepts (bad ladders on the command
line: tests/test_cli_bad_input.py)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edps_mlflow.config import StudySpec, TrialSpec
from edps_mlflow.engine import LocalStepBound, train_trials
from edps_mlflow.errors import EdpsError
from edps_mlflow.ladder import goal_results
from edps_mlflow.results import TrialRecord

from helpers import DIGITS, digits_data, engine_settings, setups_for

GOALS = (0.2, 0.1, 0.05)


def _ladder_spec(goals: tuple[float, ...] = GOALS) -> StudySpec:
    # Batch size 16, four trials ordered so that the hardest rung's best comes first: the rungs' results are 40, 80
    # and 140 steps, each from a different trial, and exact early stopping cuts the others short.
    return StudySpec("digits-simple-cnn", "sgd", 0.0, 16, 4, goals[-1], 200, 20, 0, goals=goals)


def _points() -> list[dict[str, float]]:
    points = DIGITS.search_space("sgd").points(6)
    return [points[i] for i in (4, 1, 5, 0)]


def _train(spec: StudySpec, pack: int, early_abort: bool):
    """The trials in chunks of ``pack`` (1: the single-trial path) sharing one exact early-stopping bound."""
    setups = setups_for(spec, _points())
    bound = LocalStepBound(spec.max_steps, spec.check_interval)
    results = []
    for start in range(0, len(setups), pack):
        results += train_trials(DIGITS, digits_data(), setups[start:start + pack],
                                engine_settings(spec, early_abort), bound)
    return results


def _records(spec: StudySpec, results) -> dict[int, TrialRecord]:
    points = _points()
    return {r.index: TrialRecord(trial=TrialSpec(spec, r.index, points[r.index]), status=r.status,
                                 steps_to_result=r.steps_to_result, steps_trained=r.steps_trained,
                                 best_validation_error=r.best_validation_error, run_id=None, reused=False,
                                 goal_steps=r.goal_steps) for r in results}


@pytest.mark.parametrize("pack", [1, 2])
def test_every_rung_equals_its_one_goal_study_and_the_ladder_costs_the_hardest(pack):
    spec = _ladder_spec()
    alone = {goal: _train(spec.rung(goal), pack, early_abort=True) for goal in spec.ladder}
    expected = [min((r.steps_to_result for r in alone[goal] if r.steps_to_result is not None), default=None)
                for goal in spec.ladder]
    assert len(set(expected)) == len(expected) and None not in expected, "the rungs must differ to test anything"
    hardest = alone[spec.ladder[-1]]
    for early_abort in (True, False):
        ladder = _train(spec, pack, early_abort)
        from_records = [r.steps_to_result for r in goal_results(spec, _records(spec, ladder))]
        from_trials = [min((r.goal_steps[rung] for r in ladder if r.goal_steps[rung] is not None), default=None)
                       for rung in range(len(spec.ladder))]
        assert from_records == from_trials == expected, (early_abort, [r.goal_steps for r in ladder])
        # The hardest rung decides when every trial stops: each trains exactly as in the hardest one-goal study.
        assert [(r.index, r.status, r.steps_to_result, r.steps_trained) for r in ladder] == \
               [(r.index, r.status, r.steps_to_result, r.steps_trained) for r in hardest]
        assert all(r.goal_steps[-1] == r.steps_to_result for r in ladder)
        # A rung met is met at or before every harder one.
        assert all(a <= b for r in ladder for a, b in zip(r.goal_steps, r.goal_steps[1:]) if b is not None)


FINGERPRINT = "0123456789abcdef" * 4


def test_a_one_rung_ladder_is_the_plain_study_and_a_rung_is_keyed_as_its_one_goal_study():
    plain = StudySpec.build("digits-simple-cnn", "sgd", 0.0, 64)
    one = StudySpec.build("digits-simple-cnn", "sgd", 0.0, 64, goals=(0.03,))
    assert one == plain and one.goals == () and one.study_key == plain.study_key
    # The golden key of "digits sgd dense" (tests/test_golden_keys.py) holds through the one-rung spelling.
    assert one.study_key == "d0a08df269d694d764506c7e205265b26a315df1e14769d79c045c831a6d1af9"
    ladder = StudySpec.build("digits-simple-cnn", "sgd", 0.0, 64, goals=(0.1, 0.05, 0.03))
    assert ladder.goal_error == 0.03 and ladder.ladder == (0.1, 0.05, 0.03)
    assert ladder.study_key != plain.study_key  # plain: the ladder's hardest goal alone
    point = {"learning_rate": 0.1}
    assert TrialSpec(ladder, 0, point).trial_key != TrialSpec(plain, 0, point).trial_key
    for goal in ladder.ladder:
        alone = StudySpec.build("digits-simple-cnn", "sgd", 0.0, 64, goal_error=goal)
        assert ladder.rung(goal) == alone and ladder.rung(goal).study_key == alone.study_key


_GOAL = st.one_of(st.floats(min_value=-0.5, max_value=1.5, allow_nan=False), st.sampled_from([0.0, 1.0, 0.5, 0.03]))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_GOAL, min_size=1, max_size=5))
def test_a_ladder_is_accepted_iff_its_rungs_strictly_fall_within_the_range(goals):
    valid = all(0.0 < g < 1.0 for g in goals) and all(b < a for a, b in zip(goals, goals[1:]))
    try:
        spec = StudySpec("digits-simple-cnn", "sgd", 0.0, 64, 4, goals[-1], 1000, 20, 0, goals=tuple(goals))
    except EdpsError as error:
        assert not valid, (goals, str(error))
        assert "\n" not in str(error)
        return
    assert valid, goals
    assert spec.ladder == tuple(goals) and spec.goals == (tuple(goals) if len(goals) > 1 else ())


def test_a_refused_ladder_is_named_as_it_was_given():
    # Written with :g, 0.05000001 read back as 0.05: "each smaller than the one before, got 0.1,0.05,0.05".
    with pytest.raises(EdpsError, match=r"got 0\.1,0\.05,0\.05000001$"):
        StudySpec("digits-simple-cnn", "sgd", 0.0, 64, 4, 0.05000001, 1000, 20, 0, goals=(0.1, 0.05, 0.05000001))
