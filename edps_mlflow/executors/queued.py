"""The queued-job executor: each pending study of a sweep a job of a batch system, at most ``workers`` at once,
over a small submission protocol (``JobBackend``: submit; per job its state, log tail and cancel). MLflow
Projects implements it (``executors/mlflow_project.py``); a SLURM backend would be the same protocol.

Before submitting a study the executor claims it: done (skipped), or live elsewhere (watched instead). Its run
exists, tagged and kept live, before its job starts, whose entry point adopts it; a job that ends without a
finished study is reported with its log's last lines, and the sweep goes on (docs/executors.md).
"""

from __future__ import annotations

import tempfile
import time
from collections import deque
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TextIO

from edps_mlflow.config import StudySpec
from edps_mlflow.errors import EdpsError
from edps_mlflow.executors.base import SweepRun, study_label
from edps_mlflow.mlproject import study_parameters
from edps_mlflow.names import KIND_STUDY
from edps_mlflow.progress import SweepProgress
from edps_mlflow.resources import available_cores
from edps_mlflow.results import RunState, StudyReport
from edps_mlflow.store.ownership.claim import ClaimRules, OnLive, claim, live_runs, mark_dead, yield_run
from edps_mlflow.store.ownership.lease import expired_reason, lease_seconds, renew_heartbeat
from edps_mlflow.store.read.runs import (LeasedRun, get_leased, keyed_runs, latest_finished_study, running_trial_runs,
                                         trial_runs_finished)
from edps_mlflow.store.write.study import claim_submitted_run, create_submitted_run, log_launch_log
from edps_mlflow.sweep_spec import SweepOptions, SweepSpec

POLL_SECONDS = 1.0
TRIAL_COUNT_SECONDS = 5.0  # between reads of the trials the running studies finished
LOG_TAIL_LINES = 20


class Job(Protocol):
    """One submitted study."""

    run_id: str  # the MLflow run its entry point adopts
    log_path: Path | None  # its output on this machine, when it has one here

    def state(self) -> RunState:
        """RUNNING (or queued) until the job ends, then FINISHED, FAILED or KILLED (EdpsError: cannot ask)."""

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> list[str]:
        """The last lines of its output, or where to find it."""

    def cancel(self) -> None:
        """Stop it (nothing when it already ended)."""

    def describe_end(self) -> str:
        """How it ended (``exit code 1``)."""


class JobBackend(Protocol):
    """A batch system that runs one study per job: ``edps study`` with the study's parameters
    (``mlproject.study_command``) and ``MLFLOW_RUN_ID`` set to the study's run."""

    # True: submit() makes the study's run itself (MLflow Projects); False: the executor makes it first
    # and passes its id (a backend that knows nothing of MLflow).
    makes_runs: bool

    def describe(self) -> str:
        """Where the studies go (``MLflow Projects, local backend``)."""

    def submit(self, study: StudySpec, parameters: dict[str, str], run_id: str | None, log_path: Path) -> Job:
        """Submit one study with the ``main`` entry point's ``parameters``, adopting ``run_id`` when
        ``makes_runs`` is False; an EdpsError when it fails."""

    def study_workers(self, places: int) -> int | None:
        """Training processes per study when ``places`` studies run at once (None: the job sizes its own)."""

    def close(self) -> None:
        """Remove what the backend staged for its jobs (all submitted)."""


@dataclass
class _Running:
    """A study in one of the places: a job we submitted, or (``job`` None) another process's live run we watch."""

    spec: StudySpec
    label: str
    run_id: str
    job: Job | None


class QueuedExecutor:
    """Jobs of a ``JobBackend``, at most ``workers`` (``--workers``, default: the cores) at once."""

    def __init__(self, backend: JobBackend) -> None:
        self.backend = backend

    def check(self, spec: SweepSpec, options: SweepOptions) -> None:
        pass

    def run(self, studies: list[StudySpec], sweep: SweepRun, options: SweepOptions, progress: SweepProgress,
            out: TextIO) -> list[str]:
        try:
            return _JobQueue(self.backend, sweep, options, progress, out).run(studies)
        finally:
            self.backend.close()


class _JobQueue:
    def __init__(self, backend: JobBackend, sweep: SweepRun, options: SweepOptions, progress: SweepProgress,
                 out: TextIO) -> None:
        self.backend, self.sweep, self.options, self.progress, self.out = backend, sweep, options, progress, out
        self.workers = options.workers or available_cores()
        self.study_workers: int | None = None
        self.lease = lease_seconds()
        self.running: list[_Running] = []
        # study run id -> (trial runs it finished, read for the last time): the progress count
        self._runs_counted: dict[str, tuple[int, bool]] = {}
        self.failures: list[str] = []
        self.submitted_keys: set[str] = set()
        self.logs = Path(tempfile.mkdtemp(prefix=f"edps-sweep-{sweep.run_id[:8]}-logs-"))

    def run(self, pending: list[StudySpec]) -> list[str]:
        """Run every pending study; the failures, one line each."""
        self.study_workers = self.backend.study_workers(min(self.workers, len(pending)))
        queue = deque(pending)
        print(f"submitting studies to {self.backend.describe()}, at most {self.workers} at once; their logs in "
              f"{self.logs}", file=self.out, flush=True)
        last_beat = last_count = time.monotonic()
        try:
            while queue or self.running:
                self.sweep.require_ours()
                while queue and len(self.running) < self.workers:
                    self._start(queue.popleft())
                now = time.monotonic()
                if now - last_beat >= min(20.0, self.lease / 6):
                    self._renew()
                    last_beat = now
                for entry in list(self.running):
                    self._poll(entry, queue)
                if now - last_count >= TRIAL_COUNT_SECONDS:
                    self.progress.trials_done = self._trials_finished()
                    last_count = now
                self.progress.render()
                if queue or self.running:
                    time.sleep(POLL_SECONDS)
        except BaseException:
            self._cancel_all()
            raise
        return self.failures

    def _start(self, spec: StudySpec) -> None:
        sweep, key, label = self.sweep, spec.study_key, study_label(spec)
        log_path = self.logs / f"{key[:12]}.log"
        parameters = study_parameters(spec, sweep.run_id, sweep.key, self.options.data_dir, self.options.full_trials,
                                      self.options.device, self.study_workers, self.options.accept_unverified_data)
        jobs: dict[str, Job] = {}

        def create(token: str | None, epoch: int) -> str:  # the job's own claim gives the run its epoch
            if self.backend.makes_runs:
                job = self.backend.submit(spec, parameters, None, log_path)
                claim_submitted_run(sweep.client, job.run_id, spec, sweep.run_id, sweep.key)
            else:
                run_id = create_submitted_run(sweep.client, sweep.experiment_id, spec, sweep.run_id, sweep.key)
                try:
                    job = self.backend.submit(spec, parameters, run_id, log_path)
                except BaseException:
                    mark_dead(sweep.client, [run_id], "its job could not be submitted")
                    raise
            jobs[job.run_id] = job
            return job.run_id

        def give_way(run_id: str, rival: LeasedRun) -> None:
            # Another process took this study at the same moment, first: ours gives way before it starts.
            jobs.pop(run_id).cancel()
            yield_run(sweep.client, run_id, rival.run_id, keep_kind=False)

        rules = ClaimRules(kind=KIND_STUDY, key=key, label=label, on_live=OnLive.WATCH, finished=lambda: (
            latest_finished_study(sweep.client, sweep.experiment_id, key,
                                           spec.full_trials(self.options.full_trials))))
        try:
            claimed = claim(sweep.client, sweep.experiment_id, rules, create, self.out, give_way)
        except EdpsError as error:
            self._fail(f"{label}: submission failed: {error}", running=False)
            return
        if claimed.done is not None:
            self.progress.finished_study(StudyReport(key, claimed.done.steps_to_result, True), label)
            return
        if claimed.busy is not None:
            self._watch(spec, claimed.busy.run_id)
            return
        assert claimed.owned is not None
        run_id = claimed.owned.run_id
        self.submitted_keys.add(key)
        print(f"{label}: submitted as run {run_id}; log {log_path}" if jobs[run_id].log_path
              else f"{label}: submitted as run {run_id}", file=self.out, flush=True)
        self.running.append(_Running(spec, label, run_id, jobs[run_id]))
        self.progress.started_study()

    def _watch(self, spec: StudySpec, run_id: str) -> None:
        label = study_label(spec)
        print(f"{label}: the live run {run_id} of another process is training it: waiting for it", file=self.out,
              flush=True)
        self.running.append(_Running(spec, label, run_id, None))
        self.progress.started_study()

    def _poll(self, entry: _Running, queue: deque[StudySpec]) -> None:
        sweep, key = self.sweep, entry.spec.study_key
        if entry.job is not None:
            if entry.job.state() is RunState.RUNNING:
                return
        else:
            run = get_leased(sweep.client, entry.run_id)
            if run.live(self.lease):
                return
            if run.state is RunState.RUNNING:
                mark_dead(sweep.client, [run.run_id], expired_reason(self.lease, run.owner))
        self.running.remove(entry)
        done = latest_finished_study(sweep.client, sweep.experiment_id, key,
                                              entry.spec.full_trials(self.options.full_trials))
        if entry.job is not None:
            self._keep_log(entry)
        if done is not None:
            self.progress.finished_study(StudyReport(key, done.steps_to_result, False), entry.label)
        elif entry.job is None and key not in self.submitted_keys:
            # The process we waited for ended without the study: it is ours to run now.
            print(f"{entry.label}: the run {entry.run_id} ended without finishing the study: submitting it",
                  file=self.out, flush=True)
            self.progress.running = max(0, self.progress.running - 1)
            queue.appendleft(entry.spec)
        elif entry.job is None:
            self._fail(f"{entry.label}: run {entry.run_id} ended without finishing the study")
        else:
            self._job_ended(entry, entry.job)

    def _job_ended(self, entry: _Running, job: Job) -> None:
        """A job ended without a finished study: taken over by another process, or failed."""
        sweep = self.sweep
        if get_leased(sweep.client, entry.run_id).state is RunState.RUNNING:
            mark_dead(sweep.client, [entry.run_id], f"its submitted run ended ({job.describe_end()}) "
                                                    f"without finishing the study")
        live = live_runs(keyed_runs(sweep.client, sweep.experiment_id, KIND_STUDY, entry.spec.study_key),
                         self.lease)
        if live:
            # The job was stalled past its lease and another process took the study over (the job then stops,
            # exit code 3, writing nothing): that run is watched like any live run of the key.
            self.progress.running = max(0, self.progress.running - 1)
            self._watch(entry.spec, live[0].run_id)
            return
        tail = job.log_tail()
        lines = "\n".join(f"    {line}" for line in tail)
        self._fail(f"{entry.label}: submitted run {entry.run_id} failed ({job.describe_end()})"
                   + (f"; the last lines of its log:\n{lines}" if tail else ""))

    def _fail(self, text: str, running: bool = True) -> None:
        """A study ended without its result (``running``: it held a place until now)."""
        self.failures.append(text.splitlines()[0])
        if not running:
            self.progress.running += 1  # failed_study counts it out again
        self.progress.failed_study(text)

    def _keep_log(self, entry: _Running) -> None:
        """The job's output as its run's artifact, so that the UI shows why a run failed (best effort)."""
        path = entry.job.log_path if entry.job else None
        if path is None or not path.exists():
            return
        with suppress(Exception):  # the log stays on disk; the sweep goes on
            log_launch_log(self.sweep.client, entry.run_id, path)

    def _renew(self) -> None:
        """Keep the submitted runs live while their job is: the entry point beats only once started, maybe minutes
        later."""
        for entry in self.running:
            if entry.job is not None and entry.job.state() is RunState.RUNNING:
                with suppress(Exception):  # the next beat tries again; the lease absorbs misses
                    renew_heartbeat(self.sweep.client, entry.run_id)

    def _cancel_all(self) -> None:
        """The sweep was interrupted: stop the jobs it submitted (a SIGKILL leaves them training)."""
        for entry in self.running:
            if entry.job is None:
                continue
            entry.job.cancel()
            with suppress(Exception):  # interrupted: leave what cannot be written to the lease
                run = get_leased(self.sweep.client, entry.run_id)
                if run.state is RunState.RUNNING:
                    # Its trial runs too: once its run is marked, the study's own abort (if its process
                    # gets that far) finds the run taken from it and writes nothing more, by design.
                    trials = running_trial_runs(self.sweep.client, self.sweep.experiment_id, entry.run_id)
                    mark_dead(self.sweep.client, [entry.run_id, *trials], "the sweep that submitted it was interrupted")

    def _trials_finished(self) -> int:
        """Trial runs finished by the study runs this sweep has run or watched: each run's own count, read while it
        runs and once after, in one search by id."""
        counted = self._runs_counted
        for entry in self.running:
            counted.setdefault(entry.run_id, (0, False))
        running = {entry.run_id for entry in self.running}
        open_ids = [run_id for run_id, (_, final) in counted.items() if not final]
        try:
            counts = trial_runs_finished(self.sweep.client, self.sweep.experiment_id, open_ids)
        except Exception:  # noqa: BLE001 - progress only: the last count stands
            return self.progress.trials_done
        for run_id in open_ids:
            counted[run_id] = (counts.get(run_id, counted[run_id][0]), run_id not in running)
        return sum(count for count, _ in counted.values())
