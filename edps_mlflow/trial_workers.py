"""Where the trials of a study train: in this process, or in single-thread worker processes. The study's chunks
of trials are split into shares (``shares``), each trained by one process interleaving its chunks
(engine.interleave); the best reached step lives in shared memory, so it stops every trial in every worker. Workers
never touch MLflow: they send their events to the parent, the only writer to the tracking store.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np
import torch

from edps_mlflow.config import Schedule, StudySpec, TrialSpec
from edps_mlflow.data.splits import DataSplits
from edps_mlflow.engine import ChunkRun, EngineSettings, LocalStepBound, Observer, SharedPace, StepBound, interleave
from edps_mlflow.pool import PoolSpec, Worker, run_pool, shared_int, shared_ints
from edps_mlflow.resources import configure_training_process, device_type
from edps_mlflow.results import Check, PruningRecord, TrialResult
from edps_mlflow.pruning.cache import ScoreCache
from edps_mlflow.pruning.mask import Mask
from edps_mlflow.trials import prepare_trial
from edps_mlflow.workloads import get_workload


class TrainingSink(Observer, Protocol):
    def trial_started(self, trial_index: int, mask: Mask | None, pruning: PruningRecord | None = None) -> None: ...


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
    schedule: Schedule = Schedule.BREADTH_FIRST
    # The pruning score cache's directory (pruning/cache.py); None: every trial computes its own scores.
    score_cache: str | None = None


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


class _Chunk:
    """One chunk of trials that prepares them (seeded init + pruning) only when it first trains, so that a
    chunk the study's best step rules out before its turn skips the pruning scores too."""

    def __init__(self, job: TrainingJob, indices: Sequence[int], data: DataSplits, sink: TrainingSink) -> None:
        self.job, self.indices, self.data, self.sink = job, indices, data, sink
        self.run: ChunkRun | None = None
        self.skipped = False

    @property
    def step(self) -> int:
        return self.run.step if self.run is not None else 0

    @property
    def done(self) -> bool:
        return self.skipped or (self.run is not None and self.run.done)

    @property
    def last_loss(self) -> float:
        return self.run.last_loss if self.run is not None else math.inf

    def advance(self, bound: StepBound) -> None:
        if self.run is None and bound.limit() <= 0:
            # The study already has a result no trial of this chunk could beat.
            for index in self.indices:
                self.sink.trial_started(index, None)
                self.sink.on_finish(TrialResult.superseded_before_start(index, len(self.job.settings.goal_bounds)))
            self.skipped = True
            return
        if self.run is None:
            workload = get_workload(self.job.spec.workload)
            cache = ScoreCache(self.job.score_cache) if self.job.score_cache else None
            setups = [prepare_trial(workload, self.data, TrialSpec(self.job.spec, index, self.job.points[index]),
                                    cache) for index in self.indices]
            for setup in setups:
                self.sink.trial_started(setup.index, setup.mask, setup.pruning)
            self.run = ChunkRun(workload, self.data, setups, self.job.settings, self.sink)
        self.run.advance(bound)


def shares(chunks: Sequence[Sequence[int]], processes: int, schedule: Schedule) -> list[list[list[int]]]:
    """What each process trains interleaved: breadth-first, one share per process with the chunks dealt
    round-robin (each process then holds the promising chunks of the trial order early on); depth-first,
    one share per chunk, taken in order by whichever process is free."""
    if schedule is Schedule.DEPTH_FIRST:
        return [[list(chunk)] for chunk in chunks]
    return [[list(c) for c in chunks[i::processes]] for i in range(min(processes, len(chunks)))]


def train_share(job: TrainingJob, share: Sequence[Sequence[int]], data: DataSplits, bound: StepBound,
                sink: TrainingSink, pace: SharedPace | None = None) -> None:
    interleave([_Chunk(job, chunk, data, sink) for chunk in share], bound, pace)


def train_inline(job: TrainingJob, chunks: Sequence[Sequence[int]], data: DataSplits, bound: StepBound,
                 sink: TrainingSink) -> None:
    configure_training_process(device_type(job.device), job.threads, job.spec.allow_tf32)
    for share in shares(chunks, 1, job.schedule):
        train_share(job, share, data, bound, sink)


class _QueueSink:
    """The sink of a worker process: every call goes to the parent (``_record``), by the method's name."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def trial_started(self, trial_index: int, mask: Mask | None, pruning: PruningRecord | None = None) -> None:
        arrays = None if mask is None else {n: t.numpy().astype(bool) for n, t in mask.tensors.items()}
        self.worker.send(("trial_started", trial_index, arrays, pruning))

    def on_check(self, trial_index: int, check: Check) -> None:
        self.worker.send(("on_check", trial_index, check))

    def on_probe(self, trial_index: int, step: int, values: dict[str, float]) -> None:
        self.worker.send(("on_probe", trial_index, step, values))

    def on_finish(self, result: TrialResult) -> None:
        self.worker.send(("on_finish", result))


def _trial_worker(worker: Worker, job: TrainingJob, best_value: Any, share_steps: Any) -> None:
    configure_training_process(device_type(job.device), job.threads, job.spec.allow_tf32)
    workload = get_workload(job.spec.workload)
    data = workload.load_data(job.data_dir).to(torch.device(job.device))
    bound = SharedStepBound(best_value, job.settings.max_steps, job.settings.check_interval,
                            job.exact_early_stopping)
    sink = _QueueSink(worker)
    for slot, share in worker.tasks():
        pace = SharedPace(share_steps, slot) if slot is not None else None
        train_share(job, share, data, bound, sink, pace)


def _record(event: tuple[Any, ...], sink: TrainingSink) -> None:
    """Replay one worker call on the parent's sink (a mask travels as boolean arrays)."""
    method, *arguments = event
    if method == "trial_started" and arguments[1] is not None:
        arguments[1] = Mask({n: torch.from_numpy(a.astype(np.float32)) for n, a in arguments[1].items()})
    getattr(sink, method)(*arguments)


def train_in_workers(job: TrainingJob, chunks: Sequence[Sequence[int]], workers: int, best_step: int | None,
                     sink: TrainingSink) -> None:
    """Train ``chunks`` in ``workers`` worker processes; events reach ``sink`` in this process."""
    best_value = shared_int(SharedStepBound.initial_value(job.settings.max_steps, job.settings.check_interval,
                                                          best_step))
    tasks = shares(chunks, workers, job.schedule)
    # Breadth-first shares keep pace with each other (one slot each); depth-first ones run freely.
    paced = job.schedule is Schedule.BREADTH_FIRST and len(tasks) > 1
    share_steps = shared_ints(len(tasks) if paced else 1, 0)
    spec = PoolSpec(name="edps-worker", target=_trial_worker,
                    worker_args=((job, best_value, share_steps),) * workers)
    run_pool(spec, [(slot if paced else None, share) for slot, share in enumerate(tasks)],
             lambda event: _record(event, sink))
