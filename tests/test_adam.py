"""Adam and AdamW: the packed lockstep path against torch.optim's own runs, the single and packed paths
against each other, the schedule (warm-up), masks through Adam's moments, and the search spaces."""

from __future__ import annotations

import pytest
import torch

from edps_mlflow.config import OptimizerKind, OptimizerSettings, StudySpec
from edps_mlflow.engine import BatchStream, LocalStepBound, PackedTrainer, train_trials
from edps_mlflow.errors import EdpsError
from edps_mlflow.search import ADAM_SPACES, BETA2, SearchSpace
from edps_mlflow.workloads import WORKLOADS

from helpers import (DIGITS, SMOOTH, digits_data, engine_settings, noise_data, packed_parameters,
                     reference_torch_run, setups_for, study_spec)


def _adam_spec(kind: str, sparsity: float = 0.0, batch_size: int = 16, **protocol) -> StudySpec:
    spec = study_spec(sparsity=sparsity, batch_size=batch_size, **protocol)
    return StudySpec(spec.workload, OptimizerKind(kind), spec.sparsity, spec.batch_size, spec.trials, spec.goal_error,
                     spec.max_steps, spec.check_interval, spec.seed)


@pytest.mark.parametrize("kind,sparsity", [("adam", 0.0), ("adamw", 0.5)])
def test_packed_adam_trials_match_separate_torch_runs(kind, sparsity):
    """40 steps of K=3 packed trials, each with its own learning rate, beta2, weight decay and warm-up, against
    three torch.optim runs; pruned weights stay exactly zero through Adam's moments and AdamW's decay."""
    data = noise_data()
    spec = _adam_spec(kind, sparsity)
    decay = kind == "adamw"
    points = [{"learning_rate": 0.01, "beta2": 0.999, "warmup_steps": 10, **({"weight_decay": 0.1} if decay else {})},
              {"learning_rate": 0.003, "beta2": 0.99, "warmup_steps": 0, **({"weight_decay": 0.01} if decay else {})},
              {"learning_rate": 0.03, "beta2": 0.9999, "warmup_steps": 5, **({"weight_decay": 1.0} if decay else {})}]
    setups = setups_for(spec, points, workload=SMOOTH, data=data)
    trainer = PackedTrainer(SMOOTH, setups, torch.device("cpu"))
    stream = BatchStream(data.train_size, 16, spec.seed, torch.device("cpu"))
    steps = 40
    for step in range(steps):
        batch = stream.next()
        trainer.step(data.train_images[batch], data.train_labels[batch],
                     [s.optimizer.learning_rate_at(step) for s in setups])
    for position, setup in enumerate(setups):
        expected = reference_torch_run(setup, 16, steps, spec.seed, data, SMOOTH)
        got = packed_parameters(trainer, position)
        for name in expected:
            torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6)
            if sparsity:
                pruned = setup.mask.tensors[name] == 0
                assert torch.all(got[name][pruned] == 0)


def test_packed_and_single_adam_paths_agree_on_outcomes():
    """The engine's two paths on digits with AdamW at sparsity 0.5: the same status and steps for every trial."""
    spec = _adam_spec("adamw", sparsity=0.5, batch_size=32, goal_error=0.1, max_steps=200, check_interval=20)
    points = DIGITS.search_space("adamw").points(3)
    setups = setups_for(spec, points)
    settings = engine_settings(spec)
    data = digits_data()
    packed = train_trials(DIGITS, data, setups, settings, LocalStepBound(200, 20, False))
    single = []
    for setup in setups:
        single += train_trials(DIGITS, data, [setup], settings.__class__(**{**settings.__dict__, "channels_last": False}),
                               LocalStepBound(200, 20, False))
    outcomes = [(r.index, r.status, r.steps_to_result) for r in sorted(packed, key=lambda r: r.index)]
    assert outcomes == [(r.index, r.status, r.steps_to_result) for r in single]
    assert any(steps is not None for _, _, steps in outcomes), outcomes


def test_warm_up_then_decay_schedule():
    settings = OptimizerSettings(OptimizerKind.ADAM, 0.01, warmup_steps=4, decay_steps=10, end_learning_rate_factor=0.5)
    assert settings.learning_rate_at(0) == pytest.approx(0.01 / 4)
    assert settings.learning_rate_at(1) == pytest.approx(0.01 * (1 - 0.5 * 0.1) * 2 / 4)
    assert settings.learning_rate_at(3) == pytest.approx(0.01 * (1 - 0.5 * 0.3))
    assert settings.learning_rate_at(4) == pytest.approx(0.01 * (1 - 0.5 * 0.4))
    assert settings.learning_rate_at(100) == pytest.approx(0.005)
    assert settings.scheduled and not OptimizerSettings(OptimizerKind.ADAM, 0.01).scheduled
    assert OptimizerSettings(OptimizerKind.ADAM, 0.01).learning_rate_at(7) == 0.01


def test_adam_settings_from_points_and_bad_values():
    adamw = OptimizerSettings.from_point(OptimizerKind.ADAMW, {"learning_rate": 1e-3, "weight_decay": 0.1,
                                                                "beta2": 0.99, "warmup_steps": 20.0})
    assert (adamw.beta1, adamw.beta2, adamw.weight_decay, adamw.warmup_steps, adamw.momentum) == (0.9, 0.99, 0.1, 20, 0.0)
    with pytest.raises(EdpsError, match="weight_decay is AdamW's"):
        OptimizerSettings.from_point(OptimizerKind.ADAM, {"learning_rate": 1e-3, "weight_decay": 0.1})
    with pytest.raises(EdpsError, match="beta1, beta2 < 1"):
        OptimizerSettings(OptimizerKind.ADAM, 1e-3, beta2=1.0)
    assert (OptimizerKind.ADAM.state_buffers, OptimizerKind.MOMENTUM.state_buffers, OptimizerKind.SGD.state_buffers) \
        == (2, 1, 0)


def test_every_workload_tunes_adam_and_adamw_and_spaces_carry_fixed_values():
    for workload in WORKLOADS.values():
        assert workload.search_space("adam").names[0] == "learning_rate"
        assert "weight_decay" in workload.search_space("adamw").names
    assert ADAM_SPACES["adam"].points(1) == [{"learning_rate": pytest.approx(1e-3)}]
    space = SearchSpace((ADAM_SPACES["adam"].dimensions[0], BETA2), fixed=(("warmup_steps", 50.0),))
    points = space.points(4)
    assert all(point["warmup_steps"] == 50.0 and 0.99 <= point["beta2"] <= 0.9999 for point in points)
    # The tuned dimensions are those of the space without the fixed value: the same Sobol points.
    plain = SearchSpace(space.dimensions).points(4)
    assert [{k: v for k, v in p.items() if k != "warmup_steps"} for p in points] == plain
    with pytest.raises(ValueError, match="once"):
        SearchSpace((BETA2,), fixed=(("beta2", 0.9),))
