"""Measurements during training, one interface: the paper's Lipschitz constant and McCandlish et al.'s gradient
noise scale (docs/probes.md defines both). A probe runs every ``probe_interval`` steps on all trials of a chunk at
once (vectorised over the trial axis), around one step's update, and returns a value per trial for each metric; it
copies what it needs and draws from its own generator, so a probed run follows the trajectory of a plain one.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Protocol

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from edps_mlflow import names
from edps_mlflow.config import PROBE_NAMES
from edps_mlflow.errors import EdpsError
from edps_mlflow.workloads import Loss

GAMMAS = tuple(round(0.1 * i, 1) for i in range(1, 10))
# What a trainer shows the probes: the network, its current stacked (K-trial) weights, the masks.
ProbeView = tuple[nn.Module, Callable[[], dict[str, Tensor]], dict[str, Tensor] | None]


@dataclass
class ProbeContext:
    """What a probe may look at: the network, the stacked (K-trial) weights and masks, the data."""

    template: nn.Module
    parameters: Callable[[], dict[str, Tensor]]  # current stacked weights [K, ...], read-only
    masks: dict[str, Tensor] | None
    images: Tensor  # the full training split, on the device
    labels: Tensor
    step: int  # the step whose update happens between before_step and after_step
    seed: int
    loss: Loss  # the workload's training loss
    chunk_size: int = 1000


class Probe(Protocol):
    name: str

    def before_step(self, context: ProbeContext) -> None: ...

    def after_step(self, context: ProbeContext) -> dict[str, list[float]]: ...

    def keep(self, positions: list[int]) -> None:
        """Trials at other positions finished: drop their state."""


def _batch_gradient(template: nn.Module, params: dict[str, Tensor], images: Tensor, labels: Tensor,
                    loss: Loss) -> dict[str, Tensor]:
    """Per-trial gradients [K, ...] of the mean loss on one shared batch: one vmap-ed forward and one backward
    of the summed losses (trials are independent, so trial k's weights get trial k's own gradient)."""
    leaves = {n: p.detach().clone().requires_grad_(True) for n, p in params.items()}
    logits_of = vmap(lambda weights, x: functional_call(template, weights, (x,)), in_dims=(0, None))
    with torch.enable_grad():
        outputs = logits_of(leaves, images)
        total = sum(loss(outputs[k], labels) for k in range(outputs.shape[0]))
        gradients = torch.autograd.grad(total, list(leaves.values()))
    return dict(zip(leaves, gradients))


def mean_gradient(context: ProbeContext, params: dict[str, Tensor]) -> dict[str, Tensor]:
    """Per-trial gradient of the mean loss over the training split (in chunks), masked."""
    images, labels = context.images, context.labels
    count = labels.shape[0]
    trials = next(iter(params.values())).shape[0]
    chunk = max(10, context.chunk_size // max(1, trials))
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    for start in range(0, count, chunk):
        x, y = images[start:start + chunk], labels[start:start + chunk]
        for name, value in _batch_gradient(context.template, params, x, y, context.loss).items():
            total[name] += value * (y.shape[0] / count)
    if context.masks is not None:
        total = {n: g * context.masks[n] for n, g in total.items()}
    return total


def _norms(vectors: dict[str, Tensor]) -> Tensor:
    """Per-trial Euclidean norm over all tensors: [K]."""
    return torch.sqrt(sum(v.reshape(v.shape[0], -1).pow(2).sum(1) for v in vectors.values()))


class LipschitzProbe:
    name = "lipschitz"

    def __init__(self) -> None:
        self.start: dict[str, Tensor] | None = None
        self.start_gradient: dict[str, Tensor] | None = None

    @torch.no_grad()
    def before_step(self, context: ProbeContext) -> None:
        self.start = {n: p.detach().clone() for n, p in context.parameters().items()}
        self.start_gradient = mean_gradient(context, self.start)

    @torch.no_grad()
    def after_step(self, context: ProbeContext) -> dict[str, list[float]]:
        assert self.start is not None and self.start_gradient is not None
        end = context.parameters()
        direction = {n: end[n].detach() - self.start[n] for n in end}
        step_norm = _norms(direction)
        best = torch.full_like(step_norm, float("nan"))
        for gamma in GAMMAS:
            point = {n: self.start[n] + gamma * direction[n] for n in direction}
            moved = mean_gradient(context, point)
            ratio = _norms({n: moved[n] - self.start_gradient[n] for n in moved}) / (gamma * step_norm)
            best = torch.where(torch.isnan(best) | (ratio > best), ratio, best)
        self.start = self.start_gradient = None
        values = [v if math.isfinite(v) else float("nan") for v in best.tolist()]
        return {names.METRIC_PROBE_LIPSCHITZ: values}

    def keep(self, positions: list[int]) -> None:
        pass  # no state between calls


class NoiseScaleProbe:
    name = "noise_scale"

    def __init__(self, big_batch: int = 1024, small_batch: int = 64, smoothing: float = 0.9) -> None:
        self.big_batch, self.small_batch, self.smoothing = big_batch, small_batch, smoothing
        self.average_trace: Tensor | None = None
        self.average_norm: Tensor | None = None
        self.values: dict[str, list[float]] = {}

    @torch.no_grad()
    def before_step(self, context: ProbeContext) -> None:
        count = context.labels.shape[0]
        big = min(self.big_batch, count - count % self.small_batch)
        if big < 2 * self.small_batch:
            raise EdpsError(f"the noise-scale probe needs at least {2 * self.small_batch} training examples")
        # Its own generator: the training stream's order is never touched.
        generator = torch.Generator().manual_seed(hash((context.seed, context.step)) & 0x7FFFFFFF)
        chosen = torch.randperm(count, generator=generator)[:big].to(context.images.device)
        params = {n: p.detach() for n, p in context.parameters().items()}
        small_norms, big_sum = [], None
        for start in range(0, big, self.small_batch):
            index = chosen[start:start + self.small_batch]
            gradient = _batch_gradient(context.template, params, context.images[index], context.labels[index],
                                       context.loss)
            if context.masks is not None:
                gradient = {n: g * context.masks[n] for n, g in gradient.items()}
            small_norms.append(_norms(gradient).pow(2))
            big_sum = gradient if big_sum is None else {n: big_sum[n] + gradient[n] for n in gradient}
        parts = big // self.small_batch
        small = torch.stack(small_norms).mean(0)
        big_norm = _norms({n: g / parts for n, g in big_sum.items()}).pow(2)
        b_small, b_big = float(self.small_batch), float(big)
        norm_estimate = (b_big * big_norm - b_small * small) / (b_big - b_small)
        trace_estimate = (small - big_norm) / (1.0 / b_small - 1.0 / b_big)
        if self.average_trace is None:
            self.average_trace, self.average_norm = trace_estimate.clone(), norm_estimate.clone()
        else:
            self.average_trace = self.smoothing * self.average_trace + (1 - self.smoothing) * trace_estimate
            self.average_norm = self.smoothing * self.average_norm + (1 - self.smoothing) * norm_estimate
        self.values = {names.METRIC_PROBE_NOISE_SCALE: (self.average_trace / self.average_norm).tolist(),
                       names.METRIC_PROBE_GRAD_NORM_SQ: norm_estimate.tolist(),
                       names.METRIC_PROBE_TRACE_SIGMA: trace_estimate.tolist()}

    def after_step(self, context: ProbeContext) -> dict[str, list[float]]:
        values, self.values = self.values, {}
        return values

    def keep(self, positions: list[int]) -> None:
        if self.average_trace is not None:
            index = torch.tensor(positions, device=self.average_trace.device)
            self.average_trace = self.average_trace.index_select(0, index)
            self.average_norm = self.average_norm.index_select(0, index)


PROBES: dict[str, Callable[[], Probe]] = {"lipschitz": LipschitzProbe, "noise_scale": NoiseScaleProbe}
# The specs validate probe names without importing torch; the two lists must name the same probes.
assert set(PROBES) == set(PROBE_NAMES)


class ProbeHook:
    """The probes of one chunk of trials, run around every ``interval``-th training step (with none, only the
    step runs)."""

    def __init__(self, probes: tuple[str, ...], interval: int, images: Tensor, labels: Tensor, seed: int,
                 loss: Loss) -> None:
        self.probes = [PROBES[name]() for name in probes]
        self.interval, self.images, self.labels, self.seed, self.loss = interval, images, labels, seed, loss

    def around_step(self, step: int, view: Callable[[], ProbeView],
                    train_step: Callable[[], Tensor]) -> tuple[Tensor, dict[str, list[float]], float]:
        """Run ``train_step`` (the update that produces ``step``), with the probes around it when due: the step's
        per-trial losses, the probe values (a list per metric, a value per trial) and the probes' seconds."""
        if not self.probes or step % self.interval != 0:
            return train_step(), {}, 0.0
        started = time.perf_counter()
        template, parameters, masks = view()
        context = ProbeContext(template, parameters, masks, self.images, self.labels, step, self.seed, self.loss)
        for probe in self.probes:
            probe.before_step(context)
        seconds = time.perf_counter() - started
        losses = train_step()
        started = time.perf_counter()
        values: dict[str, list[float]] = {}
        for probe in self.probes:
            values.update(probe.after_step(context))
        return losses, values, seconds + time.perf_counter() - started

    def keep(self, positions: list[int]) -> None:
        for probe in self.probes:
            probe.keep(positions)
