"""Batch-invariant optimiser coordinates (coordinates.py): beta2 as a half-life in examples, a decoupled weight
decay as its timescale tau in epochs; the mapping against hand numbers, what a trial records, old keys, the
refusals, and a real tiny Adam study on digits."""

import io
import math
from dataclasses import replace

import pytest
from mlflow.tracking import MlflowClient

from edps_mlflow import names as n
from edps_mlflow.config import StudySpec, TrialSpec
from edps_mlflow.coordinates import TAU, Coordinates, beta2_of, half_life, invariant_space, weight_decay_of
from edps_mlflow.errors import EdpsError
from edps_mlflow.optimizers import get_optimizer
from edps_mlflow.search import ADAM_LEARNING_RATE, WEIGHT_DECAY, SearchSpace
from edps_mlflow.study import ExecutionOptions, run_study
from edps_mlflow.workloads import get_workload

DIGITS = get_workload("digits-simple-cnn")  # 1,618 training examples


def _spec(optimizer: str, batch_size: int, **fields) -> StudySpec:
    return StudySpec.build("digits-simple-cnn", optimizer, 0.0, batch_size, search_coordinates="invariant", **fields)


def test_the_mapping_against_hand_numbers():
    assert beta2_of(1000.0, 100) == pytest.approx(0.5 ** 0.1) == pytest.approx(0.9330329915368074)
    # 0.999 at B = 256 halves in 256 ln 2 / -ln 0.999 = 177,357 examples; the same half-life at B = 16: 0.9999375.
    assert half_life(0.999, 256) == pytest.approx(177_356.94, rel=1e-6)
    assert beta2_of(half_life(0.999, 256), 256) == pytest.approx(0.999, rel=1e-12)
    assert beta2_of(half_life(0.999, 256), 16) == pytest.approx(0.999 ** (1 / 16), rel=1e-12)
    # tau = B / (lr wd D): 128 / (1e-3 x 10 x 1600) = 8.
    assert weight_decay_of(10.0, 1e-3, 128, 1600) == pytest.approx(8.0)
    assert 128 / (1e-3 * weight_decay_of(10.0, 1e-3, 128, 1600) * 1600) == pytest.approx(10.0)


def test_the_half_life_range_spans_beta2_0_9_to_0_9999_at_every_batch_size_and_tau_is_in_epochs():
    dimension = _spec("adam", 256).search_space(DIGITS).dimensions[1]
    assert dimension.name == "beta2_half_life"
    assert dimension.low == pytest.approx(math.log(0.5) / math.log(0.9))  # 6.58 examples
    assert dimension.high == pytest.approx(1618 * math.log(0.5) / math.log(0.9999))  # 11.2M examples
    for batch_size in (1, 2, 64, 1024, 1618):
        assert beta2_of(dimension.low, batch_size) <= 0.9 + 1e-12
        assert beta2_of(dimension.high, batch_size) >= 0.9999 - 1e-12
    assert (TAU.low, TAU.high) == (1.0, 1e4)


def test_points_share_the_unit_cube_and_carry_both_values_whose_raw_ones_move_with_the_batch_size():
    small, large = (_spec("adamw", b).search_space(DIGITS) for b in (16, 512))
    # tau takes the weight decay's Sobol coordinate; the half-life joins after.
    assert small.names == ("learning_rate", "tau", "beta2_half_life")
    raw = DIGITS.search_space("adamw").points(5)
    for a, b, r in zip(small.points(5), large.points(5), raw):
        assert set(a) == {"learning_rate", "tau", "beta2_half_life", "beta2", "weight_decay"}
        assert (a["learning_rate"], a["tau"], a["beta2_half_life"]) == (b["learning_rate"], b["tau"],
                                                                        b["beta2_half_life"])
        assert a["learning_rate"] == r["learning_rate"]
        assert TAU.unit(a["tau"]) == pytest.approx(WEIGHT_DECAY.unit(r["weight_decay"]), abs=1e-12)
        assert a["beta2"] == beta2_of(a["beta2_half_life"], 16) and b["beta2"] == beta2_of(b["beta2_half_life"], 512)
        assert b["weight_decay"] == pytest.approx(32 * a["weight_decay"])
        assert a["weight_decay"] == weight_decay_of(a["tau"], a["learning_rate"], 16, 1618)
    # The first point: lr 1e-3, tau 100 epochs, half-life 8,589 examples; at B = 16 weight decay 16 / (0.1 x 1618).
    first = small.points(1)[0]
    assert first["tau"] == pytest.approx(100.0) and first["weight_decay"] == pytest.approx(16 / (1e-3 * 100 * 1618))


def test_a_trial_reads_the_raw_values_and_keeps_both():
    spec = _spec("adamw", 64)
    point = spec.search_space(DIGITS).points(2)[1]
    trial = TrialSpec(spec, 1, point).optimizer
    assert (trial.settings.beta2, trial.settings.weight_decay) == (point["beta2"], point["weight_decay"])
    # A coordinate without the raw value it gives is no metaparameter of the optimizer.
    with pytest.raises(EdpsError, match="adam has no metaparameter 'beta2_half_life'"):
        get_optimizer("adam").trial({"learning_rate": 1e-3, "beta2_half_life": 100.0})


def test_lion_gets_both_coordinates_and_adam_the_half_life_only():
    assert _spec("lion", 64).search_space(DIGITS).names == ("learning_rate", "tau", "beta2_half_life")
    assert _spec("adam", 64).search_space(DIGITS).names == ("learning_rate", "beta2_half_life")


def test_old_keys_hold_and_invariant_studies_key_apart():
    raw = StudySpec.build("digits-simple-cnn", "adam", 0.0, 64)
    assert raw.search_coordinates is Coordinates.RAW and "search_coordinates" not in raw.key_fields()
    assert replace(raw, search_coordinates="raw").study_key == raw.study_key
    invariant = replace(raw, search_coordinates="invariant")
    assert invariant.key_fields()["search_coordinates"] == "invariant" and invariant.study_key != raw.study_key


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "nesterov"])
def test_an_optimizer_without_coordinates_is_refused(optimizer):
    with pytest.raises(EdpsError, match=f"optimizer {optimizer} has no batch-invariant coordinates"):
        _spec(optimizer, 64)


def test_bad_coordinates_half_lives_and_taus_are_refused():
    with pytest.raises(EdpsError, match="unknown search coordinates 'tau'; choose raw or invariant"):
        StudySpec.build("digits-simple-cnn", "adam", 0.0, 64, search_coordinates="tau")
    with pytest.raises(EdpsError, match="a beta2 half-life must be a positive number of examples, got 0"):
        beta2_of(0, 64)
    with pytest.raises(EdpsError, match="tau must be a positive number of epochs, got -1"):
        weight_decay_of(-1, 1e-3, 64, 1618)
    settings = {"beta2", "weight_decay"}
    for fixed in (("beta2_half_life", 0.0), ("tau", -2.0)):
        space = SearchSpace((ADAM_LEARNING_RATE,), fixed=(fixed,))
        with pytest.raises(EdpsError, match=f"the search space's {fixed[0]} must be positive"):
            invariant_space(space, "adamw", settings, 64, 1618)
    # A workload that fixes a half-life keeps it: beta2 follows the batch size, nothing more is tuned.
    kept = invariant_space(SearchSpace((ADAM_LEARNING_RATE,), fixed=(("beta2_half_life", 1000.0),)), "adam",
                           {"beta2"}, 100, 1618)
    assert kept.names == ("learning_rate",) and kept.points(1)[0]["beta2"] == pytest.approx(0.5 ** 0.1)


def test_a_tiny_adam_study_records_both_values_on_its_trials_and_its_best(sqlite_store):
    from analysis.load import load_studies

    spec = _spec("adamw", 32, trials=3, max_steps=60, check_interval=20, goal_error=0.5)
    outcome = run_study(spec, ExecutionOptions(workers=1, threads=1, experiment="invariant"), out=io.StringIO())
    client = MlflowClient()
    trials = client.search_runs([outcome.experiment_id], f"tags.`{n.TAG_KIND}` = '{n.KIND_TRIAL}'")
    assert len(trials) == 3
    for run in trials:
        params = {k: float(v) for k, v in run.data.params.items()
                  if k in ("learning_rate", "beta2", "beta2_half_life", "weight_decay", "tau")}
        assert params["beta2"] == pytest.approx(beta2_of(params["beta2_half_life"], 32))
        assert params["weight_decay"] == pytest.approx(weight_decay_of(params["tau"], params["learning_rate"], 32,
                                                                       1618))
    study = client.get_run(outcome.study_run_id).data.params
    assert study["spec.search_coordinates"] == "invariant"
    table = load_studies(("invariant",), sqlite_store)
    row = table.iloc[0]
    assert outcome.steps_to_result is not None
    for name in ("beta2", "beta2_half_life", "weight_decay", "tau", "learning_rate"):
        assert isinstance(row[f"best_{name}"], float) and row[f"best_{name}"] == pytest.approx(
            float(study[f"best.{name}"]))
