"""The ``local`` executor: the studies in worker processes on this machine (pool.py), one per GPU (pinned) or
CPU workers sharing the cores, each running its studies one after another; within a session (an adaptive
sweep) the workers stay up from one round to the next."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any, Iterator, TextIO

from edps_mlflow.config import StudySpec
from edps_mlflow.errors import EdpsError
from edps_mlflow.executors.base import SweepRun, run_study_task, study_label, study_tasks
from edps_mlflow.pool import Pool, PoolSpec, Worker, open_pool, run_pool, sigterm_interrupts
from edps_mlflow.progress import SweepProgress
from edps_mlflow.resources import SweepLayout, available_cores, sweep_layout
from edps_mlflow.store.trouble import store_error_line
from edps_mlflow.sweep_spec import SweepOptions, SweepSpec


def _sweep_worker(worker: Worker, device: str | None) -> None:
    for task in worker.tasks():
        task, key = replace(task, device=device), task.spec.study_key
        worker.send(("started", key))
        try:
            # The parent turns Ctrl-C into SIGTERM for its workers; SIGTERM ends a study as KILLED.
            # Between studies there is nothing to mark KILLED: a plain SIGTERM ends the worker.
            with sigterm_interrupts():
                report = run_study_task(
                    task, lambda status, steps: worker.send(("trial", key, status, steps)),
                    lambda trial_steps, furthest: worker.send(("steps", key, trial_steps, furthest)))
        except Exception as error:
            # Bad input, or a store error that outlived the retries: one line for the parent, not a traceback.
            line = str(error) if isinstance(error, EdpsError) else store_error_line(error, task.tracking_uri)
            if line is None:
                raise
            worker.send(("error", f"{key[:12]}: {line}"))
            return
        worker.send(("finished", report))


class LocalExecutor:
    """Worker processes on this machine."""

    def __init__(self) -> None:
        self._pool: Pool | None = None
        self._layout: SweepLayout | None = None

    def check(self, spec: SweepSpec, options: SweepOptions) -> None:
        pass  # the device was checked with the options

    @staticmethod
    def workers(options: SweepOptions) -> int:
        """One per GPU, else ``--workers`` or one per core."""
        return len(_session_layout(options).devices)

    @contextlib.contextmanager
    def session(self, options: SweepOptions, out: TextIO) -> Iterator[None]:
        """The workers started once for every run() inside (an adaptive sweep's rounds), not once a round."""
        layout = _session_layout(options)
        # A worker dead between rounds fails the next round; after the last, the sweep's work is done.
        with open_pool(_pool_spec(layout), forgive_idle_deaths=True) as pool:
            self._pool, self._layout = pool, layout
            try:
                yield
            finally:
                self._pool, self._layout = None, None

    def run(self, studies: list[StudySpec], sweep: SweepRun, options: SweepOptions, progress: SweepProgress,
            out: TextIO) -> list[str]:
        layout = self._layout or sweep_layout(options.device, options.workers, len(studies))
        # The session's workers were sized for full rounds: a round with fewer studies (a curve's start, the
        # last walk down) gives each study the cores of the workers it leaves idle, as a pool of its own would.
        threads = sweep_layout(options.device, len(layout.devices), len(studies)).threads
        tasks = study_tasks(studies, sweep, options, threads)
        labels = {s.study_key: study_label(s) for s in studies}

        def on_event(event: tuple[Any, ...]) -> None:
            if event[0] == "started":
                progress.started_study()
            elif event[0] == "trial":
                progress.trial_finished(labels[event[1]], event[3])
            elif event[0] == "steps":
                progress.study_steps(labels[event[1]], event[2], event[3])
            elif event[0] == "finished":
                progress.finished_study(event[1], labels[event[1].study_key])
            elif event[0] == "error":
                raise EdpsError(event[1])
            sweep.require_ours()

        def on_idle() -> None:
            sweep.require_ours()
            progress.render()

        if self._pool is not None:
            self._pool.run(tasks, on_event, on_idle=on_idle)
        else:
            run_pool(_pool_spec(layout), tasks, on_event, on_idle=on_idle)
        return []


def _session_layout(options: SweepOptions) -> SweepLayout:
    return sweep_layout(options.device, options.workers, options.workers or available_cores())


def _pool_spec(layout: SweepLayout) -> PoolSpec:
    # A stopped worker marks its study's runs KILLED before it exits: give it time to write that.
    return PoolSpec(name="edps-sweep-worker", target=_sweep_worker,
                    worker_args=tuple((device,) for device in layout.devices), stop_timeout=30.0)
