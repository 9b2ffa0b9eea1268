"""The workload owns its loss, its error metric and its input layout: the engine (single and packed
paths), SNIP and the probes ask it. Tiny non-image workloads built here, trained for real."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

from edps_mlflow.config import TrialSpec
from edps_mlflow.data.splits import DataSplits
from edps_mlflow.engine import ChunkRun, EngineSettings, LocalStepBound, train_trials
from edps_mlflow.models import init_fan_in_truncated_normal
from edps_mlflow.pruning.snip import snip_mask
from edps_mlflow.resources import uses_channels_last
from edps_mlflow.results import TrialStatus
from edps_mlflow.trials import prepare_trial
from edps_mlflow.workloads import GoalMetric, InputLayout, Workload, argmax_errors, cross_entropy, cross_entropy_sum

from helpers import setups_for, study_spec

VOCABULARY, LENGTH, CLASSES = 12, 6, 4
GOAL_TOP_TWO = 0.1


class TokenNet(nn.Module):
    """Embedding + linear over 2-D integer token inputs [N, T]; the class is readable from the first token."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCABULARY, 8)
        self.fc = nn.Linear(LENGTH * 8, CLASSES)
        # The project's initialisation covers Conv2d and Linear; the embedding seeds its own.
        with torch.no_grad():
            self.embedding.weight.copy_(torch.randn(VOCABULARY, 8, generator=torch.Generator().manual_seed(0)))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.fc(self.embedding(tokens).reshape(tokens.shape[0], -1))


def _token_data() -> DataSplits:
    generator = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, VOCABULARY, (700, LENGTH), generator=generator)
    labels = tokens[:, 0] % CLASSES
    return DataSplits(tokens[:600], labels[:600], tokens[600:], labels[600:])


class FeatureNet(nn.Module):
    """A 1-D feature MLP [N, D] -> [N, C]."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(10, 16)
        self.out = nn.Linear(16, CLASSES)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.hidden(features)))


def _feature_data() -> DataSplits:
    generator = torch.Generator().manual_seed(5)
    features = torch.randn(700, 10, generator=generator)
    # Noisy labels: no network is right everywhere, so top-1 and top-2 errors differ.
    labels = (features[:, :CLASSES] + 0.4 * torch.randn(700, CLASSES, generator=generator)).argmax(1)
    return DataSplits(features[:600], labels[:600], features[600:], labels[600:])


def _workload(name: str, layout: InputLayout, build_model, data: DataSplits, **objective) -> Workload:
    return Workload(name=name, description=f"a test workload over {layout.value}", load_data=lambda _: data,
                    build_model=build_model, goal_error=0.05, max_steps=400, needs_data_dir=False, dataset=name,
                    train_size=data.train_size, validation_size=data.validation_size, input_layout=layout,
                    check_interval=20, **objective)


def _settings(workload: Workload, batch_size: int, goal_error: float, max_steps: int, check_interval: int,
              **extra) -> EngineSettings:
    return EngineSettings(batch_size, max_steps, check_interval,
                          (workload.allowed_errors(goal_error, workload.validation_size),), 0, **extra)


def _outcomes(results) -> list[tuple[int, TrialStatus, int | None]]:
    return [(r.index, r.status, r.steps_to_result) for r in sorted(results, key=lambda r: r.index)]


def test_token_workload_trains_with_snip_at_batch_64_in_single_and_packed_paths():
    """2-D token tensors at batch 64, where channels-last used to be applied by batch size alone."""
    data = _token_data()
    tokens = _workload("tokens", InputLayout.TOKENS, TokenNet, data)
    assert not uses_channels_last(InputLayout.TOKENS, 64) and uses_channels_last(InputLayout.IMAGES, 64)
    spec = study_spec(optimizer="momentum", sparsity=0.5, batch_size=64, trials=3)
    points = [{"learning_rate": lr, "momentum": 0.9} for lr in (0.3, 0.1, 0.03)]
    setups = setups_for(spec, points, workload=tokens, data=data)
    for setup in setups:  # SNIP kept exactly half of the embedding, weights and biases
        assert setup.mask.kept == round(setup.mask.total * 0.5)
    # The settings ask for channels-last as a study on images would: the engine applies it to images only.
    settings = _settings(tokens, 64, goal_error=0.05, max_steps=300, check_interval=20, channels_last=True)
    packed = train_trials(tokens, data, setups, settings, LocalStepBound(300, 20, False))
    single = [result for setup in setups
              for result in train_trials(tokens, data, [setup], settings, LocalStepBound(300, 20, False))]
    assert _outcomes(packed) == _outcomes(single)
    assert any(r.status is TrialStatus.REACHED for r in single), _outcomes(single)


@pytest.mark.parametrize("pack", [1, 2])
def test_engine_and_probes_train_on_the_workloads_loss(pack):
    """Twice the cross-entropy at half the learning rate takes bit for bit the same steps (scaling by two is
    exact in floating point): the same validation errors, twice the training loss at every check, four
    times each squared gradient norm. Had the engine or a probe used cross-entropy, they would differ."""
    data = _feature_data()
    plain = _workload("features", InputLayout.FEATURES, FeatureNet, data)
    doubled = replace(plain, loss=lambda logits, labels: 2 * cross_entropy(logits, labels))
    spec = study_spec(optimizer="nesterov", sparsity=0.5, batch_size=32, trials=2)
    rates = (0.2, 0.05)

    def run(workload: Workload, scale: float):
        points = [{"learning_rate": lr * scale, "momentum": 0.9} for lr in rates]
        setups = setups_for(spec, points, workload=workload, data=data)
        settings = _settings(workload, 32, goal_error=0.01, max_steps=60, check_interval=20, channels_last=True,
                             early_abort_evaluation=False, probes=("lipschitz", "noise_scale"), probe_interval=20)
        checks, probes = [], []

        class Log:
            def on_check(self, index, check):
                checks.append((index, check))

            def on_probe(self, index, step, values):
                probes.append((index, step, values))

            def on_finish(self, result):
                pass

        for start in range(0, len(setups), pack):
            train_trials(workload, data, setups[start:start + pack], settings, LocalStepBound(60, 20, False), Log())
        return setups, checks, probes

    plain_setups, plain_checks, plain_probes = run(plain, 1.0)
    doubled_setups, doubled_checks, doubled_probes = run(doubled, 0.5)
    # SNIP ranks by |w dL/dw|: scaling the loss scales every score alike, the same weights are kept.
    assert all(torch.equal(a.mask.tensors[n], b.mask.tensors[n])
               for a, b in zip(plain_setups, doubled_setups) for n in a.mask.tensors)
    assert len(plain_checks) == len(doubled_checks) == 6 and len(plain_probes) == 6
    for (index, check), (doubled_index, doubled_check) in zip(plain_checks, doubled_checks):
        assert (index, check.step, check.validation_error) == \
               (doubled_index, doubled_check.step, doubled_check.validation_error)
        assert doubled_check.train_loss == 2 * check.train_loss
    for (index, step, values), (_, _, doubled_values) in zip(plain_probes, doubled_probes):
        assert doubled_values["probe/grad_norm_sq"] == 4 * values["probe/grad_norm_sq"]
        assert doubled_values["probe/trace_sigma"] == 4 * values["probe/trace_sigma"]
        assert doubled_values["probe/lipschitz"] == pytest.approx(2 * values["probe/lipschitz"], rel=1e-6)


def _top_two_errors(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """An example is wrong when its label is not among its two highest logits."""
    return (logits.topk(2, dim=-1).indices != labels.unsqueeze(-1)).all(-1).sum()


@pytest.mark.parametrize("pack", [1, 2])
def test_goal_test_counts_the_workloads_errors(pack):
    """A top-2 error metric: every check's validation error is the top-2 error of the trial's weights at
    that check (computed here without the workload), not the argmax error, and the goal is met by it."""
    data = _feature_data()
    top_two = _workload("features-top2", InputLayout.FEATURES, FeatureNet, data, errors=_top_two_errors)
    spec = study_spec(optimizer="momentum", sparsity=0.0, batch_size=64, trials=2)
    points = [{"learning_rate": 0.3, "momentum": 0.9}, {"learning_rate": 0.1, "momentum": 0.9}]
    setups = setups_for(spec, points[:pack], workload=top_two, data=data)
    model, size = FeatureNet(), data.validation_size
    errors_at_checks = []

    class Log:
        """At each check, the trial's weights are still where the check evaluated them."""

        def on_check(self, index, check):
            position = [state.setup.index for state in run.active].index(index)
            if pack == 1:
                parameters = dict(run.trainer.model.named_parameters())
            else:
                parameters = {name: stacked[position] for name, stacked in run.trainer.params.items()}
            with torch.no_grad():
                ranked = functional_call(model, parameters, (data.validation_images,)).argsort(1, descending=True)
            top_one = int((ranked[:, 0] != data.validation_labels).sum()) / size
            top_two = int((ranked[:, :2] != data.validation_labels[:, None]).all(1).sum()) / size
            errors_at_checks.append((check.validation_error, top_two, top_one))

        def on_probe(self, index, step, values):
            pass

        def on_finish(self, result):
            pass

    # A goal that top-2 errors meet and argmax errors never do (the labels are noisy).
    settings = _settings(top_two, 64, goal_error=GOAL_TOP_TWO, max_steps=200, check_interval=20,
                         channels_last=True, early_abort_evaluation=False)
    run = ChunkRun(top_two, data, setups, settings, Log())
    bound = LocalStepBound(200, 20, False)
    while not run.done:
        run.advance(bound)
    assert errors_at_checks and all(reported == two for reported, two, _ in errors_at_checks)
    assert all(two < one for _, two, one in errors_at_checks)
    assert any(r.status is TrialStatus.REACHED for r in run.results.values())
    assert min(one for _, _, one in errors_at_checks) > GOAL_TOP_TWO


def test_snip_prunes_by_the_workloads_loss():
    data = _feature_data()
    plain = _workload("features", InputLayout.FEATURES, FeatureNet, data)
    smoothed = replace(plain, loss=lambda logits, labels: F.cross_entropy(logits, labels, label_smoothing=0.9))
    spec = study_spec(sparsity=0.7, trials=1)
    trial = TrialSpec(spec, 0, {"learning_rate": 0.1})
    setup = prepare_trial(smoothed, data, trial)
    model = FeatureNet()
    init_fan_in_truncated_normal(model, torch.Generator().manual_seed(trial.init_seed))
    expected = snip_mask(model, data.train_images, data.train_labels, 0.7, smoothed.loss)
    assert all(torch.equal(setup.mask.tensors[n], expected.tensors[n]) for n in expected.tensors)
    cross_entropy_mask = prepare_trial(plain, data, trial).mask
    assert any(not torch.equal(setup.mask.tensors[n], cross_entropy_mask.tensors[n]) for n in expected.tensors)


@pytest.mark.parametrize("pack", [1, 2])
def test_a_loss_goal_is_the_mean_validation_loss_and_early_abort_keeps_it_exact(pack):
    """GoalMetric.LOSS: each check's value is the mean validation cross-entropy of the trial's weights at that
    check (computed here without the engine), a trial reaches the goal at the first check at or below it, and
    stopping the sum early (the per-example losses are non-negative) changes no outcome."""
    data = _feature_data()
    goal = 0.95  # nats: the four noisy classes start at ln 4 = 1.39
    lossy = _workload("features-loss", InputLayout.FEATURES, FeatureNet, data, goal_metric=GoalMetric.LOSS)
    assert lossy.goal_bound(goal, data.validation_size) == goal * data.validation_size
    spec = study_spec(optimizer="momentum", sparsity=0.0, batch_size=64, trials=2)
    points = [{"learning_rate": 0.003, "momentum": 0.9}, {"learning_rate": 0.3, "momentum": 0.9}]
    setups = setups_for(spec, points[:pack], workload=lossy, data=data)
    model, seen = FeatureNet(), []

    class Log:
        def on_check(self, index, check):
            position = [state.setup.index for state in run.active].index(index)
            parameters = (dict(run.trainer.model.named_parameters()) if pack == 1 else
                          {name: stacked[position] for name, stacked in run.trainer.params.items()})
            with torch.no_grad():
                mean = float(F.cross_entropy(functional_call(model, parameters, (data.validation_images,)),
                                             data.validation_labels))
            seen.append((index, check.step, check.validation_error, mean))

        def on_probe(self, index, step, values):
            pass

        def on_finish(self, result):
            pass

    outcomes = {}
    for early_abort in (False, True):
        settings = _settings(lossy, 64, goal_error=0.05, max_steps=200, check_interval=20, channels_last=True,
                             early_abort_evaluation=early_abort)
        settings = replace(settings, goal_bounds=(lossy.goal_bound(goal, data.validation_size),))
        run = ChunkRun(lossy, data, setups, settings, Log())
        bound = LocalStepBound(200, 20, False)
        while not run.done:
            run.advance(bound)
        outcomes[early_abort] = _outcomes(run.results.values())
        cut_short = sum(result.checks_cut_short for result in run.results.values())
        assert (cut_short > 0) == early_abort  # the early checks, above the goal, stopped summing early
        if not early_abort:
            assert seen and all(value == pytest.approx(mean, rel=1e-5) for _, _, value, mean in seen)
            first = {}
            for index, step, _, mean in seen:
                if mean <= goal:
                    first.setdefault(index, step)
            assert {i: s for i, _, s in outcomes[False] if s is not None} == first
    assert outcomes[True] == outcomes[False]
    assert any(s is not None for _, _, s in outcomes[False])


def test_loss_sum_of_sequences_is_the_mean_per_position_summed_over_examples():
    generator = torch.Generator().manual_seed(0)
    logits, targets = torch.randn(5, 7, 11, generator=generator), torch.randint(0, 11, (5, 7), generator=generator)
    per_position = F.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1), reduction="none").reshape(5, 7)
    assert float(cross_entropy_sum(logits, targets)) == pytest.approx(float(per_position.mean(1).sum()), rel=1e-6)
    assert float(cross_entropy(logits, targets)) == pytest.approx(float(per_position.mean()), rel=1e-6)


def test_default_objective_is_the_papers():
    """Cross-entropy and the argmax error, as the engine computed them before workloads owned them."""
    logits = torch.randn(50, 10, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, 10, (50,), generator=torch.Generator().manual_seed(1))
    assert torch.equal(cross_entropy(logits, labels), F.cross_entropy(logits, labels))
    assert int(argmax_errors(logits, labels)) == int((logits.argmax(1) != labels).sum())
    from edps_mlflow.workloads import WORKLOADS

    for workload in WORKLOADS.values():
        if workload.input_layout is InputLayout.TOKENS:  # the language model: its own objective
            continue
        assert workload.input_layout is InputLayout.IMAGES and workload.goal_metric is GoalMetric.ERROR_RATE
        assert workload.loss is cross_entropy and workload.errors is argmax_errors
