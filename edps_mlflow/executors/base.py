"""The executor protocol, and what every executor is given: the sweep's run and the studies to run. Every study
an executor starts goes through ``study.run_study`` (a queued job: through the ``main`` entry point), whose claim
finds the study done, waits for a live run of it elsewhere, or makes its run: so an executor may be killed, rerun
or run twice at once, and each study is measured once.
"""

from __future__ import annotations

import io
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, TextIO

from edps_mlflow.config import StudySpec
from edps_mlflow.curves import CurveId
from edps_mlflow.progress import SweepProgress
from edps_mlflow.resources import available_cores
from edps_mlflow.results import StudyReport
from edps_mlflow.store.client import connect
from edps_mlflow.store.ownership.lease import LeaseLost
from edps_mlflow.store.read.runs import latest_finished_study

if TYPE_CHECKING:
    from edps_mlflow.store.write.sweep import SweepTracker
    from edps_mlflow.sweep_spec import SweepOptions, SweepSpec


@dataclass(frozen=True)
class SweepRun:
    """A sweep attached to its store: where its studies are written and the run they are children of."""

    client: Any  # store.client.StoreClient
    tracking_uri: str
    experiment_name: str
    experiment_id: str
    tracker: "SweepTracker"
    key: str  # the sweep key its studies carry (the grid's, or an adaptive sweep's)

    @property
    def run_id(self) -> str:
        return self.tracker.run_id

    def require_ours(self) -> None:
        """Stop (``LeaseLost``) when the sweep's heartbeat found its run taken over by another process."""
        self.tracker.owned.require_fresh()


class Executor(Protocol):
    """Runs the pending studies of a sweep; see the module docstring for what it may assume."""

    def check(self, spec: "SweepSpec", options: "SweepOptions") -> None:
        """Everything this executor needs, checked before any work (one line when something is missing)."""

    def run(self, studies: list[StudySpec], sweep: SweepRun, options: "SweepOptions", progress: SweepProgress,
            out: TextIO) -> list[str]:
        """Run every study (in the caller's order); the failures, one line each, or an ``EdpsError`` when it
        cannot go on. Between studies it calls ``sweep.require_ours()``: a sweep stalled past its lease stops."""

    # Optional: ``workers(options)``, studies at once (default: --workers, else the cores), and ``session(options,
    # out)``, a context held around every ``run`` of one sweep (an adaptive sweep's rounds): Ray's instance, workers.


def executor_workers(executor: Any, options: "SweepOptions") -> int:
    """How many studies the executor runs at once (its ``workers(options)`` where it has one)."""
    workers = getattr(executor, "workers", None)
    return int(workers(options)) if workers is not None else options.workers or available_cores()


def executor_session(executor: Any, options: "SweepOptions", out: TextIO) -> AbstractContextManager[None]:
    session = getattr(executor, "session", None)
    return session(options, out) if session is not None else nullcontext()


def study_label(study: StudySpec) -> str:
    """``sgd sparsity=0.9 pruning=grasp bs=64`` (no method named for the dense network), ``... bs=64 seed=2`` for a
    replicate of another seed than 0 (the labels of a sweep's studies differ: its progress line keys them)."""
    return f"{CurveId.of(study).label()} bs={study.batch_size}" + (f" seed={study.seed}" if study.seed else "")


@dataclass(frozen=True)
class StudyTask:
    """One study for a process on any machine: everything it needs, picklable."""

    spec: StudySpec
    tracking_uri: str
    experiment_id: str
    experiment_name: str
    sweep_run_id: str
    sweep_key: str
    data_dir: str | None
    full_trials: bool
    device: str | None
    threads: int
    accept_unverified_data: bool = False


def study_tasks(studies: list[StudySpec], sweep: SweepRun, options: "SweepOptions", threads: int) -> list[StudyTask]:
    return [StudyTask(spec=s, tracking_uri=sweep.tracking_uri, experiment_id=sweep.experiment_id,
                      experiment_name=sweep.experiment_name, sweep_run_id=sweep.run_id, sweep_key=sweep.key,
                      data_dir=options.data_dir, full_trials=options.full_trials, device=options.device,
                      threads=threads, accept_unverified_data=options.accept_unverified_data) for s in studies]


def run_study_task(task: StudyTask, on_trial: Callable[[str, int | None], None] | None = None,
                   on_steps: Callable[[int, int], None] | None = None) -> StudyReport:
    """Run one study of a sweep; idempotent, so that a retried task (Ray) never trains twice. A study stalled past
    its lease (``LeaseLost``) was taken over by another process: the task then waits for that run."""
    client = connect(task.tracking_uri)
    done = latest_finished_study(client, task.experiment_id, task.spec.study_key,
                                 task.spec.full_trials(task.full_trials))
    if done is not None:
        return StudyReport(done.key, done.steps_to_result, skipped=True)
    # Here, not at the top: the study loads torch (over a second), which the sweep's parent never needs.
    from edps_mlflow.study import ExecutionOptions, run_study

    # A live run of this study elsewhere (another sweep, a lone study) is waited for, never duplicated.
    options = ExecutionOptions(
        full_trials=task.full_trials, device=task.device, workers=1, experiment=task.experiment_name,
        data_dir=task.data_dir, log_interval=60.0, tracking_uri=task.tracking_uri,
        parent_run_id=task.sweep_run_id, sweep_key=task.sweep_key, threads=task.threads, wait=True,
        adopt_launcher_run=False, accept_unverified_data=task.accept_unverified_data)
    try:
        outcome = run_study(task.spec, options, out=io.StringIO(), on_trial=on_trial, on_steps=on_steps)
    except LeaseLost:
        outcome = run_study(task.spec, options, out=io.StringIO())
    return StudyReport(task.spec.study_key, outcome.steps_to_result, skipped=not outcome.records)
