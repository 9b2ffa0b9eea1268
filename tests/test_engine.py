
from dataclasses import replace

import pytest
import torch

from edps_mlflow.engine import BatchStream, LocalStepBound, PackedTrainer, train_trials
from edps_mlflow.resources import choose_pack_size
from edps_mlflow.results import TrialStatus

from helpers import (DIGITS, SMOOTH, digits_data, engine_settings, noise_data, packed_parameters, reference_torch_run,
                     setups_for, study_spec)


def test_packed_trials_train_as_separate_plain_runs():
    """60 steps of K=3 packed trials against three plain modules with their torch optimizer (a network with no
    ties): the vmapped gradients agree with a backward's within rounding (tests/test_optimizers.py has each
    optimizer's update to the bit)."""
    data = noise_data()
    spec = study_spec(optimizer="momentum", sparsity=0.5, batch_size=16)
    points = [{"learning_rate": lr, "momentum": m} for lr, m in [(0.1, 0.9), (0.03, 0.99), (0.01, 0.95)]]
    setups = setups_for(spec, points, workload=SMOOTH, data=data)
    trainer = PackedTrainer(SMOOTH, setups, torch.device("cpu"))
    stream = BatchStream(data.train_size, 16, spec.seed, torch.device("cpu"))
    steps = 60
    for _ in range(steps):
        batch = stream.next()
        trainer.step(data.train_images[batch], data.train_labels[batch], None)
    for position, setup in enumerate(setups):
        expected = reference_torch_run(setup, 16, steps, spec.seed, data, workload=SMOOTH)
        got = packed_parameters(trainer, position)
        for name in expected:
            torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6)


def test_packed_simple_cnn_matches_torch_over_a_few_steps():
    """The real network (max-pool, ReLU): a few steps, before any near-tie could flip."""
    data = noise_data()
    spec = study_spec(optimizer="nesterov", sparsity=0.5, batch_size=16)
    setups = setups_for(spec, [{"learning_rate": 0.1, "momentum": 0.9}, {"learning_rate": 0.02, "momentum": 0.99}],
                        data=data)
    trainer = PackedTrainer(DIGITS, setups, torch.device("cpu"))
    stream = BatchStream(data.train_size, 16, spec.seed, torch.device("cpu"))
    for _ in range(10):
        batch = stream.next()
        trainer.step(data.train_images[batch], data.train_labels[batch], None)
    for position, setup in enumerate(setups):
        expected = reference_torch_run(setup, 16, 10, spec.seed, data)
        for name, value in packed_parameters(trainer, position).items():
            torch.testing.assert_close(value, expected[name], rtol=1e-5, atol=1e-6)


def test_batch_stream_is_one_endless_reshuffled_sequence():
    stream = BatchStream(10, 3, seed=0, device=torch.device("cpu"))
    sequence = torch.cat([stream.next() for _ in range(10)]).tolist()
    epochs = [sequence[i:i + 10] for i in range(0, 30, 10)]
    # Every epoch is a permutation of all examples, each in a different order; a batch may straddle two.
    assert all(sorted(epoch) == list(range(10)) for epoch in epochs)
    assert len({tuple(epoch) for epoch in epochs}) == 3
    with pytest.raises(ValueError):
        BatchStream(10, 11, seed=0, device=torch.device("cpu"))


def _study_result(results):
    reached = [r.steps_to_result for r in results if r.status is TrialStatus.REACHED]
    return min(reached) if reached else None


@pytest.mark.parametrize("pack", [1, 4])
def test_exact_early_stopping_gives_the_full_trials_result(pack):
    # Six trials: one reaches late (900 steps), one early (200, the result), two never do (to the cap): the
    # cases that decide what early stopping may cut. More trials or a higher cap add cost, not cases.
    spec = study_spec(optimizer="sgd", batch_size=32, goal_error=0.06, max_steps=1000)
    points = DIGITS.search_space("sgd").points(6)
    setups = setups_for(spec, points)
    settings = engine_settings(spec)
    data = digits_data()

    def run(exact: bool):
        bound = LocalStepBound(spec.max_steps, spec.check_interval, exact_early_stopping=exact)
        results = []
        for start in range(0, len(setups), pack):
            results += train_trials(DIGITS, data, setups[start:start + pack], settings, bound)
        return results

    full = run(exact=False)
    early = run(exact=True)
    assert _study_result(full) is not None
    assert _study_result(early) == _study_result(full)
    assert all(r.status is not TrialStatus.SUPERSEDED for r in full)
    assert any(r.status is TrialStatus.SUPERSEDED for r in early)
    assert sum(r.steps_trained for r in early) < sum(r.steps_trained for r in full)
    # Every trial that reached earlier than the others' stop agrees between the modes.
    by_index = {r.index: r for r in full}
    for result in early:
        if result.status is TrialStatus.REACHED:
            assert by_index[result.index].steps_to_result == result.steps_to_result


def test_packed_and_single_paths_agree_on_outcomes():
    spec = study_spec(optimizer="momentum", batch_size=4, goal_error=0.1, max_steps=600)
    points = DIGITS.search_space("momentum").points(4)
    setups = setups_for(spec, points)
    settings = engine_settings(spec)
    data = digits_data()
    packed = train_trials(DIGITS, data, setups, settings, LocalStepBound(600, 100, False))
    single = []
    for setup in setups:
        single += train_trials(DIGITS, data, [setup],
                               settings.__class__(**{**settings.__dict__, "channels_last": False}),
                               LocalStepBound(600, 100, False))
    assert [(r.index, r.status, r.steps_to_result) for r in sorted(packed, key=lambda r: r.index)] == \
           [(r.index, r.status, r.steps_to_result) for r in single]


def test_huge_learning_rate_diverges():
    spec = study_spec(optimizer="momentum", batch_size=32, max_steps=300)
    setups = setups_for(spec, [{"learning_rate": 1e6, "momentum": 0.9999}])
    result = train_trials(DIGITS, digits_data(), setups, engine_settings(spec),
                          LocalStepBound(300, 100))[0]
    assert result.status is TrialStatus.DIVERGED
    assert result.steps_to_result is None and result.steps_trained == 100


def test_early_abort_evaluation_is_exact_for_steps_to_result():
    # Trial 1 reaches at 200; trials 0 and 2 never do (not by 800 either): they train to the cap with their
    # checks cut short.
    spec = study_spec(optimizer="sgd", batch_size=64, goal_error=0.05, max_steps=400)
    setups = setups_for(spec, DIGITS.search_space("sgd").points(3))
    data = digits_data()
    checks = {True: [], False: []}

    class Recorder:
        def __init__(self, key):
            self.key = key

        def on_check(self, index, check):
            checks[self.key].append((index, check.step, check.validation_error))

        def on_finish(self, result):
            pass

    outcomes = {}
    for abort in (True, False):
        outcomes[abort] = [
            (r.status, r.steps_to_result) for setup in setups
            for r in train_trials(DIGITS, data, [setup], engine_settings(spec, early_abort=abort),
                                  LocalStepBound(spec.max_steps, 100, False), Recorder(abort))]
    assert outcomes[True] == outcomes[False]
    assert all(error is not None for _, _, error in checks[False])
    cut = [c for c in checks[True] if c[2] is None]
    assert cut, "the goal is hard enough that some early checks are cut short"
    complete = {(i, s): e for i, s, e in checks[False]}
    for index, step, error in checks[True]:
        if error is not None:
            assert error == complete[(index, step)]
        else:
            assert complete[(index, step)] > spec.goal_error


def test_curve_points_leave_the_goal_test_exact():
    """Full passes at the curve interval give every trial a validation-error curve; the other checks may
    abort early; the outcomes equal those of a fully evaluated run."""
    spec = study_spec(optimizer="sgd", batch_size=64, goal_error=0.05, max_steps=400)  # curve points at 200, 400
    setups = setups_for(spec, DIGITS.search_space("sgd").points(3))
    data = digits_data()
    checks = []

    class Recorder:
        def on_check(self, index, check):
            checks.append((index, check.step, check.validation_error))

        def on_finish(self, result):
            pass

    curve = replace(engine_settings(spec, early_abort=True), curve_interval=200)
    with_curve = [(r.status, r.steps_to_result) for setup in setups
                  for r in train_trials(DIGITS, data, [setup], curve, LocalStepBound(spec.max_steps, 100, False),
                                        Recorder())]
    full = [(r.status, r.steps_to_result) for setup in setups
            for r in train_trials(DIGITS, data, [setup], engine_settings(spec, early_abort=False),
                                  LocalStepBound(spec.max_steps, 100, False))]
    assert with_curve == full
    assert all(error is not None for _, step, error in checks if step % 200 == 0)
    assert any(error is None for _, step, error in checks if step % 200 != 0), "other checks still abort early"
    for index in range(len(setups)):
        assert [s for i, s, e in checks if i == index and e is not None and s % 200 == 0], "each trial has a curve"


def test_pack_size_choice():
    cpu, gpu = "cpu", "cuda"
    assert choose_pack_size(cpu, 2, 100) == 32
    assert choose_pack_size(cpu, 16, 100) == 1
    assert choose_pack_size(cpu, 2, 5) == 5
    assert choose_pack_size(gpu, 128, 100) == 32
    assert choose_pack_size(gpu, 512, 100) == 8
    assert choose_pack_size(gpu, 4096, 100) == 1


def test_training_seconds_per_step_exclude_checks_and_are_shared_within_a_pack():
    """Each trial's training seconds are its share of the lockstep steps it took (no checks, no evaluation):
    positive, below its wall time, and the pack size is the mean number of trials that shared its steps."""
    spec = study_spec(optimizer="sgd", batch_size=16, max_steps=300)
    setups = setups_for(spec, [{"learning_rate": 1e6}, {"learning_rate": 0.05}, {"learning_rate": 0.02}])
    settings = engine_settings(spec, early_abort=False)  # full evaluation at every check: a visible cost
    results = {r.index: r for r in train_trials(DIGITS, digits_data(), setups, settings,
                                                LocalStepBound(300, 100, exact_early_stopping=False))}
    diverged = results[0]
    assert diverged.status is TrialStatus.DIVERGED and diverged.steps_trained == 100 and diverged.pack_size == 3
    for index in (1, 2):
        result = results[index]
        assert result.steps_trained == 300
        # Its first 100 steps were shared by three trials, the other 200 by two.
        assert result.pack_size == pytest.approx((100 * 3 + 200 * 2) / 300)
        assert 0 < result.train_seconds < result.seconds
        assert result.seconds_per_step == pytest.approx(result.train_seconds / 300)
    # The two trials that trained together to the end were charged the same share.
    assert results[1].train_seconds == pytest.approx(results[2].train_seconds)
    alone = train_trials(DIGITS, digits_data(), setups[1:2], settings,
                         LocalStepBound(300, 100, exact_early_stopping=False))[0]
    assert alone.pack_size == 1 and 0 < alone.train_seconds < alone.seconds
