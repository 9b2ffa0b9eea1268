"""The ``mlflow-project`` executor: each pending study of a sweep a run of the MLproject's ``main``
entry point, submitted through MLflow Projects (mlproject.py), at most ``workers`` at once.

    edps sweep --executor mlflow-project --workers 2 --batch-sizes 16,64

One study run per study key, as with the other executors:

- Before submitting a study the sweep looks it up: done (skipped), or a live run of it elsewhere
  (another sweep, a lone study, or a run this sweep submitted before it was killed): that run is
  waited for, in one of the ``workers`` places, instead of a new submission.
- MLflow creates the run when it submits; the sweep tags it as the study's run (kind, key, parent,
  heartbeat) at once and renews its heartbeat while the run's process (or job) is alive, so that the
  run is live before its entry point starts. The entry point adopts that run (``MLFLOW_RUN_ID``) and
  beats itself: a killed sweep leaves its submitted runs training, and a resumed sweep waits for them.
- Of two runs of one key made at the same moment the later gives way (leases.py), on either side.
- A run that ends without a finished study is reported with its id and the last lines of its log,
  and the sweep goes on with the others; the sweep then ends with one line naming the failures.

This module imports no mlflow: it submits through mlproject.py, reads through registry.py and
writes through tracking.py.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from edps_mlflow import registry
from edps_mlflow.config import StudySpec
from edps_mlflow.errors import EdpsError
from edps_mlflow.leases import earlier_live_rival, expired_reason, live_runs
from edps_mlflow.mlproject import Backend, ProjectLaunch, SubmittedStudy, stage_docker_project, study_parameters, submit
from edps_mlflow.names import KIND_STUDY
from edps_mlflow.progress import SweepProgress
from edps_mlflow.results import RunState, StudyReport
from edps_mlflow.tracking import (
    StoreClient,
    claim_submitted_run,
    lease_seconds,
    log_launch_log,
    mark_dead,
    renew_heartbeat,
    yield_run,
)

POLL_SECONDS = 1.0
TRIAL_COUNT_SECONDS = 5.0  # between looks at the store for the trials the running studies finished


@dataclass(frozen=True)
class ProjectSweep:
    """What the executor needs of the sweep: its store, run and the studies' execution settings."""

    client: StoreClient
    tracking_uri: str
    experiment_id: str
    workload: str
    sweep_run_id: str
    sweep_key: str
    data_dir: str | None
    full_trials: bool
    device: str | None
    launch: ProjectLaunch
    project: Path


@dataclass
class _Running:
    """A study in one of the places: a run we submitted (``submission``), or a live run of another
    process that we wait for (``submission`` None)."""

    spec: StudySpec
    label: str
    run_id: str
    submission: SubmittedStudy | None
    started: float


class ProjectExecutor:
    def __init__(self, sweep: ProjectSweep, workers: int, study_workers: int | None, progress: SweepProgress,
                 labels: dict[str, str], out: TextIO) -> None:
        self.sweep, self.workers, self.study_workers = sweep, workers, study_workers
        self.progress, self.labels, self.out = progress, labels, out
        self.lease = lease_seconds()
        self.running: list[_Running] = []
        # study run id -> (study key, trial runs it finished, read for the last time): the progress count
        self._runs_counted: dict[str, tuple[str, int, bool]] = {}
        self.failures: list[str] = []
        self.submitted_keys: set[str] = set()
        self.logs = Path(tempfile.mkdtemp(prefix=f"edps-sweep-{sweep.sweep_run_id[:8]}-logs-"))
        # Kubernetes builds the job's image from a copy of the project whose MLproject has docker_env.
        self.project = (stage_docker_project(sweep.project, sweep.launch.kubernetes.base_image)
                        if sweep.launch.backend is Backend.KUBERNETES else sweep.project)

    def run(self, pending: list[StudySpec]) -> list[str]:
        """Run every pending study; the failures, one line each."""
        queue = deque(pending)
        if self.sweep.launch.backend is Backend.LOCAL:
            print(f"submitting studies as runs of {self.sweep.project / 'MLproject'} ({self.sweep.launch.describe()}), "
                  f"at most {self.workers} at once; their logs in {self.logs}", file=self.out, flush=True)
        else:
            print(f"submitting studies as Kubernetes jobs ({self.sweep.launch.describe()}), at most {self.workers} "
                  f"at once", file=self.out, flush=True)
        baseline = self._trial_counts()
        last_beat = last_count = time.monotonic()
        try:
            while queue or self.running:
                while queue and len(self.running) < self.workers:
                    self._start(queue.popleft())
                now = time.monotonic()
                if now - last_beat >= min(20.0, self.lease / 6):
                    self._renew()
                    last_beat = now
                for entry in list(self.running):
                    self._poll(entry, queue)
                if now - last_count >= TRIAL_COUNT_SECONDS:
                    counts = self._trial_counts()
                    self.progress.trials_done = sum(max(0, counts.get(k, 0) - baseline.get(k, 0))
                                                    for k in {s.study_key for s in pending})
                    last_count = now
                self.progress.render()
                if queue or self.running:
                    time.sleep(POLL_SECONDS)
        except BaseException:
            self._cancel_all()
            raise
        finally:
            if self.project != self.sweep.project:
                # MLflow built each job's image from the staged copy when it submitted the job.
                shutil.rmtree(self.project, ignore_errors=True)
        return self.failures

    # ---- one study -----------------------------------------------------------------------------
    def _start(self, spec: StudySpec) -> None:
        sweep, key, label = self.sweep, spec.study_key, self.labels[spec.study_key]
        done = registry.latest_finished_study(sweep.client, sweep.experiment_id, key,
                                              spec.full_trials(sweep.full_trials))
        if done is not None:
            self.progress.finished_study(StudyReport(key, done.steps_to_result, spec.trials, 0, 0.0, True), label)
            return
        live = live_runs(registry.keyed_runs(sweep.client, sweep.experiment_id, KIND_STUDY, key), self.lease)
        if live:
            self._watch(spec, live[0].run_id)
            return
        self.submitted_keys.add(key)
        log_path = self.logs / f"{key[:12]}.log" if sweep.launch.backend is Backend.LOCAL else None
        parameters = study_parameters(spec, sweep.sweep_run_id, sweep.sweep_key, sweep.data_dir, sweep.full_trials,
                                      sweep.device, self.study_workers)
        try:
            submission = submit(sweep.launch, self.project, parameters, sweep.tracking_uri, sweep.experiment_id,
                                log_path)
        except EdpsError as error:
            self._fail(f"{label}: submission failed: {error}", running=False)
            return
        claim_submitted_run(sweep.client, submission.run_id, spec, sweep.sweep_run_id, sweep.sweep_key)
        rival = earlier_live_rival(sweep.client, sweep.experiment_id, KIND_STUDY, key, submission.run_id, self.lease)
        if rival is not None:
            # Another process took this study at the same moment, first: ours gives way before it starts.
            submission.cancel()
            yield_run(sweep.client, submission.run_id, rival.run_id, keep_kind=False)
            self._watch(spec, rival.run_id)
            return
        where = f"; log {log_path}" if log_path else ""
        print(f"{label}: submitted as run {submission.run_id}{where}", file=self.out, flush=True)
        self.running.append(_Running(spec, label, submission.run_id, submission, time.monotonic()))
        self.progress.started_study()

    def _watch(self, spec: StudySpec, run_id: str) -> None:
        label = self.labels[spec.study_key]
        print(f"{label}: the live run {run_id} of another process is training it: waiting for it", file=self.out,
              flush=True)
        self.running.append(_Running(spec, label, run_id, None, time.monotonic()))
        self.progress.started_study()

    def _poll(self, entry: _Running, queue: deque[StudySpec]) -> None:
        sweep = self.sweep
        if entry.submission is not None:
            if entry.submission.state() is RunState.RUNNING:
                return
        else:
            run = registry.get_leased(sweep.client, entry.run_id)
            if run.live(self.lease):
                return
            if run.state is RunState.RUNNING:
                mark_dead(sweep.client, [run.run_id], expired_reason(self.lease))
        self.running.remove(entry)
        done = registry.latest_finished_study(sweep.client, sweep.experiment_id, entry.spec.study_key,
                                              entry.spec.full_trials(sweep.full_trials))
        if entry.submission is not None:
            self._keep_log(entry)
        if done is not None:
            report = StudyReport(entry.spec.study_key, done.steps_to_result, entry.spec.trials, entry.spec.trials,
                                 time.monotonic() - entry.started, False)
            self.progress.finished_study(report, entry.label)
            return
        if entry.submission is None:
            self.progress.running = max(0, self.progress.running - 1)
            if entry.spec.study_key not in self.submitted_keys:
                # The process we waited for ended without the study: it is ours to run now.
                print(f"{entry.label}: the run {entry.run_id} ended without finishing the study: submitting it",
                      file=self.out, flush=True)
                queue.appendleft(entry.spec)
                return
            self._fail(f"{entry.label}: run {entry.run_id} ended without finishing the study", running=False)
            return
        run = registry.get_leased(sweep.client, entry.run_id)
        if run.state is RunState.RUNNING:
            mark_dead(sweep.client, [entry.run_id], f"its submitted run ended ({entry.submission.describe_end()}) "
                                                    f"without finishing the study")
        tail = entry.submission.log_tail()
        lines = "\n".join(f"    {line}" for line in tail)
        self._fail(f"{entry.label}: submitted run {entry.run_id} failed ({entry.submission.describe_end()})"
                   + (f"; the last lines of its log:\n{lines}" if tail else ""))

    def _fail(self, text: str, running: bool = True) -> None:
        """Report a study that ended without its result (``running``: it held a place until now)."""
        self.failures.append(text.splitlines()[0])
        if not running:
            self.progress.running += 1  # failed_study counts it out again
        self.progress.failed_study(text)

    def _keep_log(self, entry: _Running) -> None:
        """The run's output as its artifact, so that the UI shows why a run failed (best effort)."""
        path = entry.submission.log_path if entry.submission else None
        if path is None or not path.exists():
            return
        try:
            log_launch_log(self.sweep.client, entry.run_id, path)
        except Exception:  # noqa: BLE001 - the log stays on disk; the sweep goes on
            pass

    # ---- all of them ---------------------------------------------------------------------------
    def _renew(self) -> None:
        """Keep the submitted runs live while their process (or job) is: the entry point beats on its
        own only once it has started, seconds (or, building an environment, minutes) later."""
        for entry in self.running:
            if entry.submission is not None and entry.submission.state() is RunState.RUNNING:
                try:
                    renew_heartbeat(self.sweep.client, entry.run_id)
                except Exception:  # noqa: BLE001 - the next beat tries again; the lease absorbs misses
                    pass

    def _cancel_all(self) -> None:
        """The sweep was interrupted: stop the runs it submitted (a SIGKILL leaves them training)."""
        for entry in self.running:
            if entry.submission is None:
                continue
            entry.submission.cancel()
            try:
                run = registry.get_leased(self.sweep.client, entry.run_id)
                if run.state is RunState.RUNNING:
                    mark_dead(self.sweep.client, [entry.run_id], "the sweep that submitted it was interrupted")
            except Exception:  # noqa: BLE001 - interrupted: leave what cannot be written to the lease
                pass

    def _trial_counts(self) -> dict[str, int]:
        """study key -> trial runs finished by the study runs this sweep has run or waited for: each run's own
        count (METRIC_TRIAL_RUNS_FINISHED), read while it runs and once after it ended, in one search by id."""
        counted = self._runs_counted
        for entry in self.running:
            counted.setdefault(entry.run_id, (entry.spec.study_key, 0, False))
        running = {entry.run_id for entry in self.running}
        open_ids = [run_id for run_id, (_, _, final) in counted.items() if not final]
        try:
            counts = registry.trial_runs_finished(self.sweep.client, self.sweep.experiment_id, open_ids)
        except Exception:  # noqa: BLE001 - progress only
            return {}
        for run_id in open_ids:
            key, last, _ = counted[run_id]
            counted[run_id] = (key, counts.get(run_id, last), run_id not in running)
        totals: dict[str, int] = {}
        for key, count, _ in counted.values():
            totals[key] = totals.get(key, 0) + count
        return totals
