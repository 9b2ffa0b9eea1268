"""The training engine: trains chunks of trials (one alone on the fast path, ``SingleTrainer``; several packed in
lockstep, ``PackedTrainer``) check interval by check interval (``ChunkRun``, interleaved by ``interleave``) and
returns one result per trial. It knows nothing about MLflow: it reports to an ``Observer`` and stops trials by the
study's best step (``StepBound``, exact early stopping); docs/protocol.md says what it measures, docs/performance.md
why it trains as it does.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import torch
from torch import Tensor
from torch.func import functional_call, grad_and_value, vmap

from edps_mlflow.data.splits import DataSplits
from edps_mlflow.optimizers.base import PackedState
from edps_mlflow.probes import ProbeHook, ProbeView
from edps_mlflow.results import Check, TrialResult, TrialStatus, training_limit
from edps_mlflow.supar import PackedGroup, parameter_groups
from edps_mlflow.trials import TrialSetup
from edps_mlflow.workloads import GoalMetric, InputLayout, Workload


@dataclass(frozen=True)
class EngineSettings:
    batch_size: int
    max_steps: int
    check_interval: int
    # The largest validation total that still meets each goal of the ladder, easiest first (Workload.goal_bound):
    # errors, or a summed loss. A trial ends when it meets the last; one goal is a ladder of one.
    goal_bounds: tuple[int | float, ...]
    # Seed of the data order; the same for every trial of a study, as in the original.
    data_seed: int
    early_abort_evaluation: bool = True
    # Every this many steps a check counts the whole validation split even with early abort: a curve (0: none).
    curve_interval: int = 0
    evaluation_batch_size: int = 1000
    # The fast path's memory format (resources.uses_channels_last); it applies to image inputs only.
    channels_last: bool = True
    probes: tuple[str, ...] = ()  # names from probes.PROBES; none: the loop is untouched
    probe_interval: int = 1000


class StepBound(Protocol):
    """The best reached step of the study so far, shared by every trial that is training."""

    def limit(self) -> int:
        """No trial needs to train past this step (it could only tie or lose)."""

    def offer(self, step: int) -> None:
        """Record that a trial reached the goal at ``step``."""


class Observer(Protocol):
    """What the engine reports to (a subclass hears nothing it does not override)."""

    def on_check(self, trial_index: int, check: Check) -> None: ...

    def on_probe(self, trial_index: int, step: int, values: dict[str, float]) -> None: ...

    def on_finish(self, result: TrialResult) -> None: ...


@dataclass
class LocalStepBound:
    """A StepBound for one process. ``exact_early_stopping=False`` never limits (full trials)."""

    max_steps: int
    check_interval: int
    exact_early_stopping: bool = True
    best_step: int | None = None

    def limit(self) -> int:
        return training_limit(self.max_steps, self.check_interval, self.best_step, self.exact_early_stopping)

    def offer(self, step: int) -> None:
        if self.best_step is None or step < self.best_step:
            self.best_step = step


class NullObserver(Observer):
    pass


class BatchStream:
    """An endless stream of batch indices, reshuffled every epoch: as in the original, a batch that runs past the
    end of an epoch is completed from the start of the next one; nothing is dropped."""

    def __init__(self, size: int, batch_size: int, seed: int, device: torch.device) -> None:
        if batch_size > size:
            raise ValueError(f"batch size {batch_size} exceeds the {size} training examples")
        self.size, self.batch_size, self.device = size, batch_size, device
        self.generator = torch.Generator().manual_seed(seed)
        self.position = 0
        self.order = torch.empty(0, dtype=torch.long, device=device)

    def next(self) -> Tensor:
        if self.position + self.batch_size > self.order.shape[0]:
            rest = self.order[self.position:]
            epoch = torch.randperm(self.size, generator=self.generator).to(self.device)
            self.order = torch.cat([rest, epoch])
            self.position = 0
        start = self.position
        self.position += self.batch_size
        return self.order[start:start + self.batch_size]


class SingleTrainer:
    """The plain fast path for one trial."""

    def __init__(self, workload: Workload, setup: TrialSetup, device: torch.device, channels_last: bool) -> None:
        model = workload.build_model()
        model.load_state_dict(setup.initial_parameters)
        self.loss, self.validation_total = workload.loss, workload.validation_total
        # Error counts are integers; a loss goal sums floats (in float64, so the sum only grows).
        self.exact_count = workload.goal_metric is GoalMetric.ERROR_RATE
        # Channels-last is a memory format of 4-D tensors: tokens or features stay as they are.
        images = workload.input_layout is InputLayout.IMAGES
        self.memory_format = torch.channels_last if channels_last and images else torch.contiguous_format
        self.model = model.to(device=device, memory_format=self.memory_format)
        self.parameters = list(self.model.parameters())
        self.names = [name for name, _ in self.model.named_parameters()]
        self.masks = None if setup.mask.is_dense else [setup.mask.tensors[n].to(device) for n in self.names]
        scales = setup.learning_rate_scales  # SμPar's per-weight multipliers (supar.py); none under SP
        groups = parameter_groups(self.names, self.parameters, scales, setup.optimizer.schedule.learning_rate)
        self.optimizer = setup.optimizer.kind.torch_optimizer(groups if scales else self.parameters, setup.optimizer)

    def step(self, images: Tensor, labels: Tensor, learning_rates: Sequence[float] | None) -> Tensor:
        if learning_rates is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = learning_rates[0] * group.get("lr_scale", 1.0)
        loss = self.loss(self.model(images.contiguous(memory_format=self.memory_format)), labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.masks is not None:
            # Masking the gradient keeps pruned weights and their optimizer buffers exactly zero.
            torch._foreach_mul_([p.grad for p in self.parameters], self.masks)
        self.optimizer.step()
        return loss.detach().reshape(1)

    @torch.no_grad()
    def count_errors(self, images: Tensor, labels: Tensor, allowed: int | float | None, skip: Sequence[bool],
                     batch_size: int) -> tuple[list[int | float], list[bool]]:
        """The validation total (wrong examples, or summed loss) and whether it is complete (not cut short
        once past ``allowed``)."""
        if skip[0]:
            return [0], [False]
        errors: int | float = 0 if self.exact_count else 0.0
        for start in range(0, labels.shape[0], batch_size):
            chunk = images[start:start + batch_size].contiguous(memory_format=self.memory_format)
            value = self.validation_total(self.model(chunk), labels[start:start + batch_size])
            errors += int(value) if self.exact_count else float(value)
            if allowed is not None and errors > allowed:
                return [errors], [False]
        return [errors], [True]

    def keep(self, positions: Sequence[int]) -> None:
        pass

    def probe_view(self) -> ProbeView:
        masks = None if self.masks is None else {n: m.unsqueeze(0) for n, m in zip(self.names, self.masks)}
        # NCHW copies: under vmap the channels-last layout is several times slower on CPU.
        return (self.model, lambda: {n: p.detach().contiguous().unsqueeze(0)
                                     for n, p in self.model.named_parameters()}, masks)


class PackedTrainer:
    """K trials in lockstep: stacked parameters and a vmap-ed functional model on shared batches."""

    def __init__(self, workload: Workload, setups: Sequence[TrialSetup], device: torch.device) -> None:
        self.template = workload.build_model().to(device)
        self.names = [name for name, _ in self.template.named_parameters()]
        self.params = {n: torch.stack([s.initial_parameters[n] for s in setups]).to(device) for n in self.names}
        dense = all(s.mask.is_dense for s in setups)
        self.masks = None if dense else {
            n: torch.stack([s.mask.tensors[n] for s in setups]).to(device) for n in self.names}
        kinds = {s.optimizer.kind for s in setups}
        if len(kinds) != 1:
            raise ValueError("packed trials must share one optimizer")
        self.kind = kinds.pop()
        # The names that share SμPar's learning-rate multipliers (one per trial) train as one group with its own
        # rates; under SP one group of every name at multiplier 1.
        shared: dict[tuple[float, ...], list[str]] = {}
        for name in self.names:
            shared.setdefault(tuple(s.learning_rate_scales.get(name, 1.0) for s in setups), []).append(name)
        optimizers = [s.optimizer for s in setups]
        self.groups = [PackedGroup(names, list(scales), PackedState(optimizers, {n: self.params[n] for n in names}))
                       for scales, names in shared.items()]
        if len(self.groups) > 1:
            for group in self.groups:
                group.set_rates([o.schedule.learning_rate for o in optimizers])
        self.device = device
        self.exact_count = workload.goal_metric is GoalMetric.ERROR_RATE

        loss, total = workload.loss, workload.validation_total

        def loss_of(params: dict[str, Tensor], images: Tensor, labels: Tensor) -> Tensor:
            return loss(functional_call(self.template, params, (images,)), labels)

        def errors_of(params: dict[str, Tensor], images: Tensor, labels: Tensor) -> Tensor:
            return total(functional_call(self.template, params, (images,)), labels)

        self._gradients = vmap(grad_and_value(loss_of), in_dims=(0, None, None))
        self._errors = vmap(errors_of, in_dims=(0, None, None))

    @torch.no_grad()
    def step(self, images: Tensor, labels: Tensor, learning_rates: Sequence[float] | None) -> Tensor:
        gradients, losses = self._gradients(self.params, images, labels)
        if learning_rates is not None:
            for group in self.groups:
                group.set_rates(learning_rates)
        if self.masks is not None:
            gradients = {name: gradient * self.masks[name] for name, gradient in gradients.items()}
        for group in self.groups:
            part = gradients if len(self.groups) == 1 else {name: gradients[name] for name in group.names}
            self.kind.packed_step(group.state, self.params, part)
        return losses

    @torch.no_grad()
    def count_errors(self, images: Tensor, labels: Tensor, allowed: int | float | None, skip: Sequence[bool],
                     batch_size: int) -> tuple[list[int | float], list[bool]]:
        count = len(skip)
        errors = torch.zeros(count, dtype=torch.long if self.exact_count else torch.float64, device=self.device)
        # Activations grow with K; keep one evaluation chunk's memory about constant.
        chunk_size = max(50, batch_size // count)
        skipped = torch.tensor(list(skip), device=self.device)
        for start in range(0, labels.shape[0], chunk_size):
            errors += self._errors(self.params, images[start:start + chunk_size], labels[start:start + chunk_size])
            if allowed is not None and bool(((errors > allowed) | skipped).all()):
                return errors.tolist(), [False] * count
        return errors.tolist(), [not s for s in skip]

    def keep(self, positions: Sequence[int]) -> None:
        index = torch.tensor(list(positions), device=self.device)
        self.params = {n: p.index_select(0, index) for n, p in self.params.items()}
        if self.masks is not None:
            self.masks = {n: m.index_select(0, index) for n, m in self.masks.items()}
        for group in self.groups:
            group.state.keep(positions)
            group.scales = [group.scales[k] for k in positions]

    def probe_view(self) -> ProbeView:
        return self.template, lambda: self.params, self.masks


@dataclass
class _TrialState:
    """What the loop tracks of one trial of the chunk while it trains."""

    setup: TrialSetup
    checks: int = 0
    checks_cut_short: int = 0
    best_validation_error: float | None = None
    probe_seconds: float = 0.0
    train_seconds: float = 0.0  # its share of the training steps' seconds (see ChunkRun.advance)
    shared_steps: int = 0  # the sum over its steps of the trials that trained in each
    goal_steps: list[int] = field(default_factory=list)  # the first check at or below each goal met so far

    def result(self, status: TrialStatus, step: int, seconds: float, goals: int) -> TrialResult:
        return TrialResult(
            index=self.setup.index, status=status, steps_to_result=step if status is TrialStatus.REACHED else None,
            goal_steps=tuple(self.goal_steps) + (None,) * (goals - len(self.goal_steps)),
            steps_trained=step, best_validation_error=self.best_validation_error, checks=self.checks,
            checks_cut_short=self.checks_cut_short, seconds=seconds, probe_seconds=self.probe_seconds,
            train_seconds=self.train_seconds, pack_size=self.shared_steps / step if step > 0 else 1.0)


class ChunkRun:
    """One chunk of trials (one setup: the fast path; several: packed in lockstep) that trains one check interval
    per ``advance``, holding its trainer, its own BatchStream and each trial's state between calls: every trial
    sees the same batches whatever the interleaving. ``data`` must be on the device."""

    def __init__(self, workload: Workload, data: DataSplits, setups: Sequence[TrialSetup],
                 settings: EngineSettings, observer: Observer | None = None) -> None:
        self.data, self.settings, self.observer = data, settings, observer or NullObserver()
        self.active = [_TrialState(setup) for setup in setups]
        self.results: dict[int, TrialResult] = {}
        self.step = 0
        self.seconds = 0.0  # this chunk's own time: other chunks train between its calls
        self._advance_started = time.perf_counter()
        # The mean training loss of each active trial at its last check (a hint for the scheduler only).
        self.last_losses: list[float] = []
        device = data.train_images.device
        self.trainer = (SingleTrainer(workload, setups[0], device, settings.channels_last) if len(setups) == 1
                        else PackedTrainer(workload, setups, device))
        self.stream = BatchStream(data.train_size, settings.batch_size, settings.data_seed, device)
        self.hook = ProbeHook(settings.probes, settings.probe_interval, data.train_images, data.train_labels,
                              settings.data_seed, workload.loss)
        self.scheduled = any(s.optimizer.schedule.scheduled for s in setups)
        self.loss_sums = torch.zeros(len(self.active), device=device)

    @property
    def done(self) -> bool:
        return not self.active

    @property
    def last_loss(self) -> float:
        """The lowest mean training loss of the active trials at their last check (inf before the first)."""
        return min((loss for loss in self.last_losses if math.isfinite(loss)), default=math.inf)

    def advance(self, bound: StepBound) -> None:
        """Train to the next check and check, or stop every trial the bound has already ruled out."""
        self._advance_started = time.perf_counter()
        if self.step >= bound.limit():
            # Its next check could only tie the study's best (exact: see results.training_limit).
            self._finish(list(range(len(self.active))), [TrialStatus.SUPERSEDED] * len(self.active))
        else:
            steps, probe_seconds = self._train_to_check()
            # Reading the losses waits for the device, so on a GPU too the interval's steps are done here.
            mean_losses = (self.loss_sums / steps).tolist()
            # A lockstep step of K trials is one computation: each is charged 1/K of it and remembers K (pack_size).
            share = (time.perf_counter() - self._advance_started - probe_seconds) / len(self.active)
            for state in self.active:
                state.train_seconds += share
                state.shared_steps += steps * len(self.active)
            self.loss_sums.zero_()
            statuses = self._check(bound, mean_losses)
            self.last_losses = mean_losses
            self._finish([k for k, s in enumerate(statuses) if s is not None], statuses)
        self.seconds += time.perf_counter() - self._advance_started

    def _train_to_check(self) -> tuple[int, float]:
        """Train every active trial to the next check step; how many steps that took, and the seconds the
        probes took among them."""
        settings, data, trainer = self.settings, self.data, self.trainer
        target = min(settings.max_steps, (self.step // settings.check_interval + 1) * settings.check_interval)
        steps = target - self.step
        probe_total = 0.0
        while self.step < target:
            self.step += 1
            rates = ([s.setup.optimizer.schedule.learning_rate_at(self.step - 1) for s in self.active]
                     if self.scheduled else None)
            batch = self.stream.next()
            losses, probe_values, probe_seconds = self.hook.around_step(
                self.step, trainer.probe_view,
                lambda: trainer.step(data.train_images[batch], data.train_labels[batch], rates))
            self.loss_sums += losses
            probe_total += probe_seconds
            if probe_values:
                reported = time.perf_counter()
                for k, state in enumerate(self.active):
                    state.probe_seconds += probe_seconds / len(self.active)
                    self.observer.on_probe(state.setup.index, self.step,
                                           {name: v[k] for name, v in probe_values.items()})
                # Reporting may log to the store (a study trained in this process): not training time either.
                probe_total += time.perf_counter() - reported
        return steps, probe_total

    def _finish(self, positions: list[int], statuses: Sequence[TrialStatus | None]) -> None:
        """End the trials at ``positions`` with their statuses; the trainer keeps the rest."""
        if not positions:
            return
        seconds = self.seconds + time.perf_counter() - self._advance_started
        for k in positions:
            state, status = self.active[k], statuses[k]
            assert status is not None
            self.results[state.setup.index] = state.result(status, self.step, seconds, len(self.settings.goal_bounds))
            self.observer.on_finish(self.results[state.setup.index])
        survivors = [k for k in range(len(self.active)) if k not in positions]
        if survivors:
            self.trainer.keep(survivors)
            self.hook.keep(survivors)
            self.loss_sums = self.loss_sums[torch.tensor(survivors, device=self.loss_sums.device)]
            self.last_losses = [self.last_losses[k] for k in survivors] if self.last_losses else []
        self.active = [self.active[k] for k in survivors]

    def _check(self, bound: StepBound, mean_losses: list[float]) -> list[TrialStatus | None]:
        """The validation check at this step: each active trial's new status, or None while it trains on. Early
        abort stops counting once past what the goal allows, exactly; such a check has no validation error."""
        settings, data, active, step = self.settings, self.data, self.active, self.step
        diverged = [not math.isfinite(loss) for loss in mean_losses]
        curve_point = settings.curve_interval > 0 and step % settings.curve_interval == 0
        bounds = settings.goal_bounds
        # Counting may stop past the easiest goal an active trial has yet to meet: then none meets a new one.
        allowed = max(bounds[len(state.goal_steps)] for state in active) \
            if settings.early_abort_evaluation and not curve_point else None
        errors, complete = self.trainer.count_errors(
            data.validation_images, data.validation_labels, allowed, diverged, settings.evaluation_batch_size)
        for k, state in enumerate(active):
            while not diverged[k] and len(state.goal_steps) < len(bounds) and errors[k] <= bounds[len(state.goal_steps)]:
                state.goal_steps.append(step)
        # A trial has reached when it meets the hardest goal; the bound (exact early stopping) is that goal's, which
        # also decides every easier one: best steps only grow with the goal, so no trial the bound stops could still
        # beat the best of an easier goal it has yet to meet.
        reached = [len(state.goal_steps) == len(bounds) for state in active]
        if any(reached):
            bound.offer(step)
        limit = bound.limit()
        statuses: list[TrialStatus | None] = []
        for k, state in enumerate(active):
            state.checks += 1
            validation_error = errors[k] / data.validation_size if complete[k] else None
            if not complete[k] and not diverged[k]:
                state.checks_cut_short += 1
            if validation_error is not None:
                previous = state.best_validation_error
                state.best_validation_error = validation_error if previous is None else min(previous, validation_error)
            self.observer.on_check(state.setup.index, Check(
                step=step, train_loss=mean_losses[k], validation_error=validation_error,
                learning_rate=state.setup.optimizer.schedule.learning_rate_at(step - 1)))
            statuses.append(TrialStatus.DIVERGED if diverged[k] else TrialStatus.REACHED if reached[k]
                            else TrialStatus.NOT_REACHED if step >= settings.max_steps
                            else TrialStatus.SUPERSEDED if step >= limit else None)
        return statuses


class Advancing(Protocol):
    """A chunk that trains one check interval per call: ChunkRun, or a wrapper that prepares it first."""

    @property
    def step(self) -> int: ...

    @property
    def done(self) -> bool: ...

    @property
    def last_loss(self) -> float: ...

    def advance(self, bound: StepBound) -> None: ...


class SharedPace:
    """Keeps processes that interleave shares of one study's chunks in step, so that none runs past a best step
    another is about to find: ``places`` (shared memory) holds each share's place, step * TURNS + turn (its
    furthest-behind step, and how many of its chunks at that step it has advanced). Every share has a worker of
    its own from the start and waits only for shares behind it, so the wait always ends."""

    DONE = 2**62
    TURNS = 2**20  # more than the chunks of any share, so that places order as (step, turn) do
    POLL_SECONDS = 0.002  # an advance is at least a few steps (milliseconds each)

    def __init__(self, places: Any, slot: int) -> None:
        self.places, self.slot = places, slot

    def publish(self, step: int | None, turn: int) -> None:
        """This share's place (``step`` None: the share is done)."""
        self.places[self.slot] = self.DONE if step is None else step * self.TURNS + turn

    def wait_for(self, step: int, turn: int) -> None:
        """Return once every other share has reached this place or passed it."""
        place = step * self.TURNS + turn
        while min(v for i, v in enumerate(self.places[:]) if i != self.slot) < place:
            time.sleep(self.POLL_SECONDS)


def interleave(runs: Sequence[Advancing], bound: StepBound, pace: SharedPace | None = None) -> None:
    """Train ``runs`` to their ends breadth-first, always advancing the one furthest behind, so that every trial
    stops within a check of the study's best step as soon as any finds it. At the same step the lowest last
    training loss goes first (the likeliest to reach), then the given order. With a ``pace``, no share starts its
    n-th chunk of a round before every other share has finished its (n-1)-th."""
    turn, turn_step = 0, -1
    while True:
        pending = [(run.step, run.last_loss, position) for position, run in enumerate(runs) if not run.done]
        if not pending:
            break
        step, _, position = min(pending)
        if pace is not None:
            turn, turn_step = (turn + 1 if step == turn_step else 0), step
            pace.publish(step, turn)
            if step < bound.limit():  # stopping a trial the bound rules out needs no waiting
                pace.wait_for(step, turn)
        runs[position].advance(bound)
    if pace is not None:
        pace.publish(None, 0)


def train_trials(workload: Workload, data: DataSplits, setups: Sequence[TrialSetup],
                 settings: EngineSettings, bound: StepBound, observer: Observer | None = None) -> list[TrialResult]:
    """Train ``setups`` in lockstep to their ends (one setup: the plain fast path). ``data`` must be on the
    device."""
    if bound.limit() <= 0:
        # The study already has a result no trial could beat: nothing to build.
        results = [TrialResult.superseded_before_start(s.index, len(settings.goal_bounds)) for s in setups]
        for result in results:
            (observer or NullObserver()).on_finish(result)
        return results
    run = ChunkRun(workload, data, setups, settings, observer)
    interleave([run], bound)
    return [run.results[s.index] for s in setups]
