"""The optimizer registry (optimizers/): for every registered optimizer a packed trial that equals its lone torch
trial to the bit; names, settings from points, the shared schedule, the spaces, and digits studies that reach."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from edps_mlflow.engine import BatchStream, LocalStepBound, PackedTrainer, train_trials
from edps_mlflow.errors import EdpsError
from edps_mlflow.optimizers import get_optimizer, optimizer_names, parse_optimizer
from edps_mlflow.optimizers.base import LearningRateSchedule
from edps_mlflow.search import BETA2, SearchSpace
from edps_mlflow.workloads import WORKLOADS

from conftest import REPO
from helpers import DIGITS, SMOOTH, digits_data, engine_settings, noise_data, setups_for, study_spec


@pytest.mark.parametrize("name", optimizer_names())
def test_a_packed_trial_equals_its_lone_torch_trial_to_the_bit(name):
    """Three trials with different metaparameters (the first points of the optimizer's default space, the third
    warmed up and decayed) at sparsity 0.5, packed in lockstep and each alone with its torch optimizer, both fed the
    packed path's gradients (vmap's and a plain backward's differ in the last bit, which is no optimizer's doing);
    the second stops after 6 steps (keep). The others' weights after 12 steps: the same to the bit, pruned ones zero."""
    data = noise_data()
    points = get_optimizer(name).space.points(3)
    points[2].update(warmup_steps=3.0, decay_steps=8.0, end_learning_rate_factor=0.1)
    setups = setups_for(study_spec(optimizer=name, sparsity=0.5, batch_size=16), points, workload=SMOOTH, data=data)
    packed = PackedTrainer(SMOOTH, setups, torch.device("cpu"))
    lone = [{n: p.clone() for n, p in setup.initial_parameters.items()} for setup in setups]
    optimizers = [s.optimizer.kind.torch_optimizer(list(p.values()), s.optimizer) for s, p in zip(setups, lone)]
    stream = BatchStream(data.train_size, 16, 0, torch.device("cpu"))
    for step in range(12):
        if step == 6:
            packed.keep([0, 2])
            setups, lone, optimizers = [setups[0], setups[2]], [lone[0], lone[2]], [optimizers[0], optimizers[2]]
        batch = stream.next()
        images, labels = data.train_images[batch], data.train_labels[batch]
        rates = [setup.optimizer.schedule.learning_rate_at(step) for setup in setups]
        gradients, _ = packed._gradients(packed.params, images, labels)
        for k, (setup, parameters, optimizer) in enumerate(zip(setups, lone, optimizers)):
            optimizer.param_groups[0]["lr"] = rates[k]
            for n, parameter in parameters.items():
                parameter.grad = gradients[n][k] * setup.mask.tensors[n]
            optimizer.step()
        packed.step(images, labels, rates)
    for k, (setup, parameters) in enumerate(zip(setups, lone)):
        for n, parameter in parameters.items():
            assert torch.equal(packed.params[n][k], parameter), (name, k, n)
            assert not packed.params[n][k][setup.mask.tensors[n] == 0].any(), (name, k, n)
    assert rates[1] != points[2]["learning_rate"], "the schedule moved the third trial's rate"


def test_the_registry_names_parses_and_imports_no_torch_until_asked():
    assert optimizer_names()[:5] == ("sgd", "momentum", "nesterov", "adam", "adamw")
    assert parse_optimizer("lion") == "lion" and type(study_spec("adamw").optimizer) is str
    with pytest.raises(EdpsError, match="unknown optimizer 'lbfgs'; known optimizers: sgd, momentum, nesterov, "):
        parse_optimizer("lbfgs")
    # Parsing a name imports no family module; the spaces, a trial's settings, a sweep's specs, the memory it plans
    # and `edps trials` import no torch.
    probe = ("import sys; from edps_mlflow.optimizers import OPTIMIZERS, get_optimizer, parse_optimizer; "
             "parse_optimizer('lion'); print(any(m.startswith('edps_mlflow.optimizers.') for m in sys.modules)); "
             "[get_optimizer(n).trial(get_optimizer(n).space.points(2)[1]) for n in OPTIMIZERS]; "
             "from edps_mlflow.sweep_spec import SweepSpec; from edps_mlflow.resources import held_bytes_per_trial; "
             "SweepSpec.build('cifar10-resnet8', tuple(OPTIMIZERS), None, (0.0, 0.9)).studies(); "
             "[held_bytes_per_trial(6090, n, True, 1618) for n in OPTIMIZERS]; from edps_mlflow.cli import cli; "
             "cli.main(['trials', '--workload', 'digits-simple-cnn', '--optimizer', 'lion'], standalone_mode=False); "
             "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=True).stdout
    lines = out.splitlines()
    assert (lines[0], lines[-1], len(lines)) == ("False", "False", 2 + 1 + 32), out
    for name in optimizer_names():
        assert get_optimizer(name).name == name and get_optimizer(name).space.names[0] == "learning_rate"
    assert [get_optimizer(n).state_buffers for n in optimizer_names()] == [0, 1, 1, 2, 2, 1]


def test_settings_from_points_and_bad_values():
    adamw = get_optimizer("adamw").trial({"learning_rate": 1e-3, "weight_decay": 0.1, "beta2": 0.99,
                                          "warmup_steps": 20.0})
    assert (adamw.settings.beta1, adamw.settings.beta2, adamw.settings.weight_decay) == (0.9, 0.99, 0.1)
    assert adamw.schedule == LearningRateSchedule(1e-3, warmup_steps=20)
    assert get_optimizer("nesterov").trial({"learning_rate": 0.1, "momentum": 0.9}).settings.momentum == 0.9
    with pytest.raises(EdpsError, match="adam has no metaparameter 'weight_decay'"):
        get_optimizer("adam").trial({"learning_rate": 1e-3, "weight_decay": 0.1})
    with pytest.raises(EdpsError, match="sgd has no metaparameter 'momentum'"):
        get_optimizer("sgd").trial({"learning_rate": 0.1, "momentum": 0.9})
    with pytest.raises(EdpsError, match="beta1, beta2 < 1"):
        get_optimizer("adam").trial({"learning_rate": 1e-3, "beta2": 1.0})
    with pytest.raises(EdpsError, match="warmup_steps must be a non-negative integer"):
        get_optimizer("lion").trial({"learning_rate": 1e-4, "warmup_steps": -1.0})


def test_warm_up_then_linear_decay_schedule():
    schedule = LearningRateSchedule(0.01, warmup_steps=4, decay_steps=10, end_learning_rate_factor=0.5)
    assert schedule.learning_rate_at(0) == pytest.approx(0.01 / 4)
    assert schedule.learning_rate_at(1) == pytest.approx(0.01 * (1 - 0.5 * 0.1) * 2 / 4)
    assert schedule.learning_rate_at(3) == pytest.approx(0.01 * (1 - 0.5 * 0.3))
    assert schedule.learning_rate_at(4) == pytest.approx(0.01 * (1 - 0.5 * 0.4))
    assert schedule.learning_rate_at(100) == pytest.approx(0.005)
    decay = LearningRateSchedule(0.5, decay_steps=100, end_learning_rate_factor=0.01)
    assert decay.learning_rate_at(0) == 0.5 and decay.learning_rate_at(50) == pytest.approx(0.5 * (1 - 0.99 * 0.5))
    assert decay.learning_rate_at(10_000) == pytest.approx(0.005)
    assert schedule.scheduled and not LearningRateSchedule(0.01).scheduled
    assert LearningRateSchedule(0.01).learning_rate_at(7) == 0.01


@pytest.mark.parametrize("name", ["adamw", "lion"])
def test_packed_and_single_paths_agree_on_digits_outcomes(name):
    """The engine's two paths on digits at sparsity 0.5, the default space's first three points: the same status
    and steps for every trial, and one reaches the goal."""
    spec = study_spec(name, sparsity=0.5, batch_size=32, goal_error=0.1, max_steps=200, check_interval=20)
    setups = setups_for(spec, DIGITS.search_space(name).points(3))
    settings = engine_settings(spec)
    data = digits_data()
    packed = train_trials(DIGITS, data, setups, settings, LocalStepBound(200, 20, False))
    single = []
    for setup in setups:
        single += train_trials(DIGITS, data, [setup], replace(settings, channels_last=False),
                               LocalStepBound(200, 20, False))
    outcomes = [(r.index, r.status, r.steps_to_result) for r in sorted(packed, key=lambda r: r.index)]
    assert outcomes == [(r.index, r.status, r.steps_to_result) for r in single]
    assert any(steps is not None for _, _, steps in outcomes), outcomes


def test_every_workload_tunes_every_optimizer_and_spaces_carry_fixed_values():
    for workload in WORKLOADS.values():
        assert [workload.search_space(n).names[0] for n in optimizer_names()] == ["learning_rate"] * 6
        assert "weight_decay" in workload.search_space("adamw").names
    assert get_optimizer("adam").space.points(1) == [{"learning_rate": pytest.approx(1e-3)}]
    space = SearchSpace((get_optimizer("adam").space.dimensions[0], BETA2), fixed=(("warmup_steps", 50.0),))
    points = space.points(4)
    assert all(point["warmup_steps"] == 50.0 and 0.99 <= point["beta2"] <= 0.9999 for point in points)
    # The tuned dimensions are those of the space without the fixed value: the same Sobol points.
    plain = SearchSpace(space.dimensions).points(4)
    assert [{k: v for k, v in p.items() if k != "warmup_steps"} for p in points] == plain
    with pytest.raises(ValueError, match="once"):
        SearchSpace((BETA2,), fixed=(("beta2", 0.9),))
