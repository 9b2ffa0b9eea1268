"""Where the trials of a study train: in this process, or in single-thread worker processes.

Workers never touch MLflow. They send events (trial started with its mask, check, finished) to
the parent, which is the only writer to the tracking store. The best reached step lives in shared
memory so that exact early stopping works across workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np
import torch

from edps_mlflow.config import StudySpec, TrialSpec
from edps_mlflow.data.splits import DataSplits
from edps_mlflow.engine import EngineSettings, LocalStepBound, StepBound, train_trials
from edps_mlflow.pool import PoolSpec, Worker, run_pool, shared_int
from edps_mlflow.resources import configure_training_process
from edps_mlflow.results import Check, TrialResult
from edps_mlflow.pruning import Mask
from edps_mlflow.trials import prepare_trial
from edps_mlflow.workloads import get_workload


class TrainingSink(Protocol):
    def trial_started(self, trial_index: int, mask: Mask | None) -> None: ...

    def on_check(self, trial_index: int, check: Check) -> None: ...

    def on_probe(self, trial_index: int, step: int, values: dict[str, float]) -> None: ...

    def on_finish(self, result: TrialResult) -> None: ...


@dataclass(frozen=True)
class TrainingJob:
    """Everything a worker needs, picklable."""

    spec: StudySpec
    points: tuple[dict[str, float], ...]
    settings: EngineSettings
    data_dir: str | None
    device: str
    threads: int
    exact_early_stopping: bool


class SharedStepBound(LocalStepBound):
    """LocalStepBound's rule with the best step in shared memory, for worker processes. Before any
    trial has reached, the shared value holds ``max_steps + check_interval`` (read as no best step)."""

    def __init__(self, value: Any, max_steps: int, check_interval: int, exact_early_stopping: bool) -> None:
        self.value = value
        super().__init__(max_steps, check_interval, exact_early_stopping)

    @staticmethod
    def initial_value(max_steps: int, check_interval: int, best_step: int | None) -> int:
        return best_step if best_step is not None else max_steps + check_interval

    @property
    def best_step(self) -> int | None:
        value = self.value.value
        return value if value <= self.max_steps else None

    @best_step.setter
    def best_step(self, step: int | None) -> None:
        if step is not None:  # the initial None from the base class: the shared value already says so
            self.value.value = step

    def offer(self, step: int) -> None:
        with self.value.get_lock():
            super().offer(step)


def train_chunk(job: TrainingJob, chunk: Sequence[int], data: DataSplits, bound: StepBound,
                sink: TrainingSink) -> None:
    """Prepare (seeded init + SNIP) and train one chunk of trials in lockstep."""
    workload = get_workload(job.spec.workload)
    if bound.limit() < job.settings.check_interval:
        # The study already has a result no trial of this chunk could beat: skip SNIP too.
        for index in chunk:
            sink.trial_started(index, None)
            sink.on_finish(TrialResult.superseded_before_start(index))
        return
    setups = [prepare_trial(workload, data, TrialSpec(job.spec, index, job.points[index])) for index in chunk]
    for setup in setups:
        sink.trial_started(setup.index, setup.mask)
    train_trials(workload.build_model, data, setups, job.settings, bound, sink)


def train_inline(job: TrainingJob, chunks: Sequence[Sequence[int]], data: DataSplits, bound: StepBound,
                 sink: TrainingSink) -> None:
    configure_training_process(job.device.split(":")[0], job.threads, job.spec.allow_tf32)
    for chunk in chunks:
        train_chunk(job, chunk, data, bound, sink)


class _QueueSink:
    """The sink of a worker process: every event goes to the parent, which records it."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def trial_started(self, trial_index: int, mask: Mask | None) -> None:
        arrays = None if mask is None else {n: t.numpy().astype(bool) for n, t in mask.tensors.items()}
        self.worker.send(("started", trial_index, arrays))

    def on_check(self, trial_index: int, check: Check) -> None:
        self.worker.send(("check", trial_index, check))

    def on_probe(self, trial_index: int, step: int, values: dict[str, float]) -> None:
        self.worker.send(("probe", trial_index, step, values))

    def on_finish(self, result: TrialResult) -> None:
        self.worker.send(("finished", result))


def _trial_worker(worker: Worker, job: TrainingJob, best_value: Any) -> None:
    configure_training_process(job.device.split(":")[0], job.threads, job.spec.allow_tf32)
    workload = get_workload(job.spec.workload)
    data = workload.load_data(job.data_dir).to(torch.device(job.device))
    bound = SharedStepBound(best_value, job.settings.max_steps, job.settings.check_interval,
                            job.exact_early_stopping)
    sink = _QueueSink(worker)
    for chunk in worker.tasks():
        train_chunk(job, chunk, data, bound, sink)


def _record(event: tuple[Any, ...], sink: TrainingSink) -> None:
    """Replay one worker event on the parent's sink."""
    kind = event[0]
    if kind == "started":
        arrays = event[2]
        mask = None if arrays is None else Mask(
            {n: torch.from_numpy(a.astype(np.float32)) for n, a in arrays.items()})
        sink.trial_started(event[1], mask)
    elif kind == "check":
        sink.on_check(event[1], event[2])
    elif kind == "probe":
        sink.on_probe(event[1], event[2], event[3])
    elif kind == "finished":
        sink.on_finish(event[1])


def train_in_workers(job: TrainingJob, chunks: Sequence[Sequence[int]], workers: int, best_step: int | None,
                     sink: TrainingSink) -> None:
    """Train ``chunks`` in ``workers`` worker processes; events reach ``sink`` in this process."""
    best_value = shared_int(SharedStepBound.initial_value(job.settings.max_steps, job.settings.check_interval,
                                                          best_step))
    # The parent decides what an interrupt means; trial workers hold no state worth a clean stop.
    spec = PoolSpec(name="edps-worker", target=_trial_worker, worker_args=((job, best_value),) * workers)
    run_pool(spec, [list(chunk) for chunk in chunks], lambda event: _record(event, sink))
