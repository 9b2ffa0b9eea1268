"""The executor protocol, and what every executor is given: the sweep's run and the studies to run.

An executor runs the pending studies of a sweep, each exactly once in the store however often it is
asked: every study it starts goes through ``study.run_study`` (or, for a queued job, the ``main`` entry
point, which calls it), whose claim (``ownership.claim``) finds a study done, waits for a live run of it
elsewhere, or makes the study's run. So an executor may be killed, rerun or run twice at once.
"""

from __future__ import annotations

import io
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, TextIO

from edps_mlflow.config import StudySpec
from edps_mlflow.curves import CurveId
from edps_mlflow.progress import SweepProgress
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
    workload: str

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
        """Run every study (large batch sizes first is the caller's order); the failures, one line each.
        An executor that cannot go on raises an ``EdpsError`` instead. It calls ``sweep.require_ours()``
        between studies, so that a sweep stalled past its lease stops starting work."""

    # Optional: ``session(options, out)``, a context manager held around every ``run`` of one sweep (an adaptive
    # sweep calls ``run`` once a round), for what is worth starting once per sweep rather than once per
    # ``run`` (Ray's local instance and its workers, which import torch again when restarted). Without it,
    # each ``run`` stands alone; see ``executor_session``.


def executor_workers(executor: Any, options: "SweepOptions") -> int:
    """How many studies the executor runs at once: its ``workers(options)`` where it has one (local and Ray:
    one per GPU, else ``--workers`` or one per core), else ``--workers``, else this machine's cores (for a
    job queue, pass ``--workers``)."""
    workers = getattr(executor, "workers", None)
    if workers is not None:
        return int(workers(options))
    from edps_mlflow.resources import available_cores

    return options.workers or available_cores()


def executor_session(executor: Any, options: "SweepOptions", out: TextIO) -> AbstractContextManager[None]:
    """The executor's ``session(options, out)`` where it has one, else nothing to hold."""
    session = getattr(executor, "session", None)
    return session(options, out) if session is not None else nullcontext()


def study_label(study: StudySpec) -> str:
    """``sgd sparsity=0.9 pruning=grasp bs=64`` (no method named for the dense network)."""
    return f"{CurveId.of(study).label()} bs={study.batch_size}"


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


def study_tasks(studies: list[StudySpec], sweep: SweepRun, options: "SweepOptions", threads: int) -> list[StudyTask]:
    return [StudyTask(spec=s, tracking_uri=sweep.tracking_uri, experiment_id=sweep.experiment_id,
                      experiment_name=sweep.experiment_name, sweep_run_id=sweep.run_id, sweep_key=sweep.key,
                      data_dir=options.data_dir, full_trials=options.full_trials, device=options.device,
                      threads=threads) for s in studies]


def run_study_task(task: StudyTask, on_trial: Callable[[str, int | None], None] | None = None,
                   on_steps: Callable[[int, int], None] | None = None) -> StudyReport:
    """Run one study of a sweep; idempotent, so that a retried task (Ray) never trains twice.
    ``on_trial(status, steps_to_result)`` hears of each trial that ends, ``on_steps(trial_steps,
    furthest_step)`` of the steps trained (the local executor's progress).

    A study whose process was stalled past its lease (``LeaseLost``) has been taken over by another
    process: the task then waits for that run, as for any live run of its key, and reports its result."""
    started = time.perf_counter()
    client = connect(task.tracking_uri)
    done = latest_finished_study(client, task.experiment_id, task.spec.study_key,
                                 task.spec.full_trials(task.full_trials))
    if done is not None:
        return StudyReport(done.key, done.steps_to_result, task.spec.trials, 0, 0.0, skipped=True)
    # Here, not at the top: the study loads torch (over a second), which the sweep's parent, planning and
    # dispatching, never needs; the processes that train import it with their first study.
    from edps_mlflow.study import ExecutionOptions, run_study

    # A live run of this study elsewhere (another sweep, a lone study) is waited for, never duplicated.
    options = ExecutionOptions(
        full_trials=task.full_trials, device=task.device, workers=1, experiment=task.experiment_name,
        data_dir=task.data_dir, log_interval=60.0, tracking_uri=task.tracking_uri,
        parent_run_id=task.sweep_run_id, sweep_key=task.sweep_key, threads=task.threads, wait=True,
        adopt_launcher_run=False)
    try:
        outcome = run_study(task.spec, options, out=io.StringIO(), on_trial=on_trial, on_steps=on_steps)
    except LeaseLost:
        outcome = run_study(task.spec, options, out=io.StringIO())
    return StudyReport(task.spec.study_key, outcome.steps_to_result, len(outcome.records) or task.spec.trials,
                       outcome.trained, time.perf_counter() - started, skipped=not outcome.records)
