"""Probes: the Lipschitz constant on a known quadratic, an unbiased noise scale on linear regression,
and training that is exactly the same with or without probes."""

import numpy as np
import pytest
import torch
from torch import nn

from edps_mlflow.engine import LocalStepBound, train_trials
from edps_mlflow.config import parse_probes
from edps_mlflow.probes import LipschitzProbe, NoiseScaleProbe, ProbeContext
from edps_mlflow.errors import EdpsError

from helpers import DIGITS, digits_data, engine_settings, setups_for, study_spec


class Quadratic(nn.Module):
    """f(w) = 1/2 w^T H w whatever the data: the gradient is H w, its Lipschitz constant max eig(H)."""

    def __init__(self, dimension: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(dimension))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.w.unsqueeze(0).expand(images.shape[0], -1)


def test_lipschitz_probe_finds_the_largest_eigenvalue_of_a_quadratic():
    generator = torch.Generator().manual_seed(0)
    basis, _ = torch.linalg.qr(torch.randn(6, 6, generator=generator, dtype=torch.float64))
    eigenvalues = torch.tensor([9.0, 4.0, 2.0, 1.0, 0.5, 0.1], dtype=torch.float64)
    hessian = (basis * eigenvalues) @ basis.T

    def loss(output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        w = output[0]
        return 0.5 * w @ hessian @ w

    model = Quadratic(6).double()
    # Start mostly along the top eigenvector; a gradient step then moves along it too.
    weights = {"w": (basis[:, 0] + 0.01 * torch.randn(6, generator=generator, dtype=torch.float64)).unsqueeze(0)}
    current = dict(weights)
    context = ProbeContext(model, lambda: current, None, torch.zeros(10, 1, dtype=torch.float64),
                           torch.zeros(10), step=1, seed=0, loss=loss)
    probe = LipschitzProbe()
    probe.before_step(context)
    current["w"] = weights["w"] - 0.05 * (weights["w"] @ hessian)  # the update
    value = probe.after_step(context)["probe/lipschitz"][0]
    assert value == pytest.approx(9.0, rel=0.01)
    assert value <= 9.0 + 1e-9  # never above the true constant


def test_noise_scale_estimates_are_unbiased_on_linear_regression():
    rng = np.random.default_rng(0)
    count, dimension = 20_000, 5
    features = rng.normal(size=(count, dimension))
    targets = features @ rng.normal(size=dimension) + rng.normal(scale=0.5, size=count)
    weights = rng.normal(size=dimension)
    # Per-example gradients of (x.w - y)^2: 2 (x.w - y) x.
    per_example = 2 * (features @ weights - targets)[:, None] * features
    true_gradient = per_example.mean(0)
    true_norm = float(true_gradient @ true_gradient)
    true_trace = float(np.trace(np.cov(per_example, rowvar=False)))

    model = nn.Linear(dimension, 1, bias=False).double()
    images = torch.tensor(features)
    labels = torch.tensor(targets)
    params = {"weight": torch.tensor(weights).reshape(1, 1, dimension)}

    def loss(output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((output[:, 0] - y) ** 2).mean()

    traces, norms = [], []
    for seed in range(120):
        probe = NoiseScaleProbe(big_batch=1024, small_batch=64)
        context = ProbeContext(model, lambda: params, None, images, labels, step=seed, seed=seed, loss=loss)
        probe.before_step(context)
        values = probe.after_step(context)
        traces.append(values["probe/trace_sigma"][0])
        norms.append(values["probe/grad_norm_sq"][0])
    for estimates, truth in ((traces, true_trace), (norms, true_norm)):
        mean, error = np.mean(estimates), np.std(estimates) / np.sqrt(len(estimates))
        assert abs(mean - truth) < 3 * error + 1e-3 * truth, (mean, truth, error)
    assert np.mean(traces) / np.mean(norms) == pytest.approx(true_trace / true_norm, rel=0.25)


@pytest.mark.parametrize("pack", [1, 2])
def test_probes_do_not_change_training(pack):
    data = digits_data()
    spec = study_spec(optimizer="momentum", sparsity=0.5, batch_size=32, goal_error=0.05, max_steps=200)
    setups = setups_for(spec, [{"learning_rate": 0.05, "momentum": 0.9}, {"learning_rate": 0.01, "momentum": 0.99}])
    plain = engine_settings(spec)
    probed = plain.__class__(**{**plain.__dict__, "probes": ("lipschitz", "noise_scale"), "probe_interval": 100})

    class Recorder:
        def __init__(self):
            self.checks, self.probes = [], []

        def on_check(self, index, check):
            self.checks.append((index, check))

        def on_probe(self, index, step, values):
            self.probes.append((index, step, values))

        def on_finish(self, result):
            pass

    outcomes = {}
    for name, settings in (("plain", plain), ("probed", probed)):
        recorder = Recorder()
        results = []
        for start in range(0, 2, pack):
            results += train_trials(DIGITS, data, setups[start:start + pack], settings,
                                    LocalStepBound(200, 100, False), recorder)
        outcomes[name] = (recorder, results)
    (plain_recorder, plain_results), (probed_recorder, probed_results) = outcomes["plain"], outcomes["probed"]
    assert plain_recorder.checks == probed_recorder.checks  # identical losses and errors at every check
    assert [(r.status, r.steps_to_result) for r in plain_results] == \
           [(r.status, r.steps_to_result) for r in probed_results]
    assert not plain_recorder.probes and all(r.probe_seconds == 0 for r in plain_results)
    names = {name for _, _, values in probed_recorder.probes for name in values}
    assert names == {"probe/lipschitz", "probe/noise_scale", "probe/grad_norm_sq", "probe/trace_sigma"}
    assert all(r.probe_seconds > 0 for r in probed_results)
    assert all(v > 0 for _, _, values in probed_recorder.probes for v in [values["probe/lipschitz"]])


def test_probe_names_are_checked():
    assert parse_probes("noise_scale, lipschitz") == ("lipschitz", "noise_scale")
    assert parse_probes("") == ()
    with pytest.raises(EdpsError, match="unknown probe 'hessian'; known probes: lipschitz, noise_scale"):
        parse_probes("hessian")
