"""A sweep: the grid of studies batch sizes x sparsities x optimizers of one workload.

    edps sweep --workload digits-simple-cnn --batch-sizes 2..1024 --sparsities 0,0.5,0.9
    edps sweep ... --executor ray --ray-address auto

The tracking store is the registry. Before launching, the sweep looks up every study key: a
FINISHED study run means done; finished trial runs without one mean partly done (those trials are
reused, not retrained); the rest is to do. Runs left RUNNING by a killed process are marked FAILED,
and a study that was cut short continues in its own study run. Killing a sweep at any moment and
starting it again finishes the grid with nothing finished trained twice.
"""

from __future__ import annotations

import io
import math
import os
import sys
import time
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, TextIO

from edps_mlflow import registry
from edps_mlflow.config import OptimizerKind, StudySpec, content_key
from edps_mlflow.errors import EdpsError
from edps_mlflow.pool import PoolSpec, Worker, run_pool, sigterm_interrupts
from edps_mlflow.study import ExecutionOptions, available_cores, run_study
from edps_mlflow.tracking import (
    SweepTracker,
    client_for,
    initialise_store,
    resolve_experiment,
    resolved_tracking_uri,
)
from edps_mlflow.workloads import get_workload


@dataclass(frozen=True)
class SweepSpec:
    workload: str
    optimizers: tuple[OptimizerKind, ...]
    batch_sizes: tuple[int, ...]
    sparsities: tuple[float, ...]
    trials: int
    goal_error: float
    max_steps: int
    check_interval: int
    seed: int
    probes: tuple[str, ...] = ()
    probe_interval: int = 1000

    def studies(self) -> list[StudySpec]:
        return [StudySpec(self.workload, optimizer, sparsity, batch_size, self.trials, self.goal_error,
                          self.max_steps, self.check_interval, self.seed, self.probes, self.probe_interval)
                for optimizer in self.optimizers for sparsity in self.sparsities for batch_size in self.batch_sizes]

    def validate(self) -> None:
        for name, values in (("optimizers", self.optimizers), ("batch sizes", self.batch_sizes),
                             ("sparsities", self.sparsities)):
            if not values:
                raise EdpsError(f"a sweep needs at least one value of {name}")
            if len(set(values)) != len(values):
                raise EdpsError(f"{name} repeat a value: {', '.join(str(v) for v in values)}")
        for study in self.studies():
            study.validate()

    @property
    def sweep_key(self) -> str:
        return content_key({
            "kind": "sweep", "workload": self.workload, "optimizers": [o.value for o in self.optimizers],
            "batch_sizes": list(self.batch_sizes), "sparsities": list(self.sparsities), "trials": self.trials,
            "goal_error": self.goal_error, "max_steps": self.max_steps, "check_interval": self.check_interval,
            "seed": self.seed, **({"probes": list(self.probes), "probe_interval": self.probe_interval}
                                  if self.probes else {})})


def parse_batch_sizes(text: str | None, train_size: int) -> tuple[int, ...]:
    """``2..1024`` (powers of two), ``16,64,256``, or None: 2 .. the largest power of two <= train size."""
    if text is None or not text.strip():
        return tuple(2 ** e for e in range(1, int(math.log2(train_size)) + 1))
    text = text.strip()
    try:
        if ".." in text:
            low, high = (int(part) for part in text.split("..", 1))
            if low < 1 or high < low or low & (low - 1) or high & (high - 1):
                raise ValueError
            return tuple(2 ** e for e in range(int(math.log2(low)), int(math.log2(high)) + 1))
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise EdpsError(f"batch sizes must be a list like 16,64,256 or a power-of-two range like 2..1024, "
                        f"got {text!r}") from None


def parse_numbers(text: str, name: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise EdpsError(f"{name} must be a comma-separated list of numbers, got {text!r}") from None


class PlanState(str, Enum):
    DONE = "done"
    PARTIAL = "partly done"
    TODO = "to do"


@dataclass(frozen=True)
class PlannedStudy:
    spec: StudySpec
    state: PlanState
    finished_trials: int
    steps_to_result: int | None


@dataclass(frozen=True)
class StudyTask:
    """One study for an executor: everything a process on any machine needs, picklable."""

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


@dataclass(frozen=True)
class StudyReport:
    study_key: str
    steps_to_result: int | None
    trials: int
    trained: int
    seconds: float
    skipped: bool


def plan_sweep(client: Any, experiment_id: str, spec: SweepSpec) -> list[PlannedStudy]:
    stored = registry.study_runs(client, experiment_id, spec.workload)
    finished = {s.study_key: s for s in stored if s.status == "FINISHED"}
    trial_counts = registry.finished_trial_counts(client, experiment_id, spec.workload)
    plan = []
    for study in spec.studies():
        key = study.study_key
        if key in finished:
            plan.append(PlannedStudy(study, PlanState.DONE, study.trials, finished[key].steps_to_result))
        elif trial_counts.get(key):
            plan.append(PlannedStudy(study, PlanState.PARTIAL, trial_counts[key], None))
        else:
            plan.append(PlannedStudy(study, PlanState.TODO, 0, None))
    return plan


def run_study_task(task: StudyTask) -> StudyReport:
    """Run one study of a sweep; idempotent, so that a retried task (Ray) never trains twice."""
    started = time.perf_counter()
    client = client_for(task.tracking_uri)
    key = task.spec.study_key
    stored = [s for s in registry.study_runs(client, task.experiment_id, task.spec.workload) if s.study_key == key]
    done = [s for s in stored if s.status == "FINISHED"]
    if done:
        return StudyReport(key, done[0].steps_to_result, task.spec.trials, 0, 0.0, skipped=True)
    # Continue this sweep's own earlier study run for the key, if a killed process left one.
    previous = [s for s in stored if s.parent_run_id == task.sweep_run_id]
    options = ExecutionOptions(
        full_trials=task.full_trials, device=task.device, workers=1, experiment=task.experiment_name,
        data_dir=task.data_dir, log_interval=60.0, tracking_uri=task.tracking_uri,
        parent_run_id=task.sweep_run_id, attach_run_id=previous[0].run_id if previous else None,
        sweep_key=task.sweep_key, threads=task.threads)
    outcome = run_study(task.spec, options, out=io.StringIO())
    return StudyReport(key, outcome.steps_to_result, len(outcome.records), outcome.trained,
                       time.perf_counter() - started, skipped=False)


class SweepProgress:
    """Studies done / running / to do, trials per second and an estimate of the time left."""

    def __init__(self, total: int, done: int, to_run: int, workers: int, out: TextIO, interval: float) -> None:
        self.total, self.done, self.to_run, self.workers = total, done, to_run, workers
        self.finished_here = 0
        self.running = 0
        self.trials_trained = 0
        self.study_seconds = 0.0
        self.out, self.interval = out, interval
        self.started = time.monotonic()
        self._last = 0.0

    def started_study(self) -> None:
        self.running += 1
        self.render()

    def finished_study(self, report: StudyReport, label: str) -> None:
        self.running = max(0, self.running - 1)
        self.finished_here += 1
        self.done += 1
        self.trials_trained += report.trained
        self.study_seconds += report.seconds
        result = report.steps_to_result if report.steps_to_result is not None else "no result"
        self.render(force=True, event=f"{label}: steps_to_result {result}"
                    + (" (already done)" if report.skipped else ""))

    def render(self, force: bool = False, event: str | None = None) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        elapsed = now - self.started
        remaining = self.total - self.done
        rate = self.trials_trained / elapsed if elapsed > 0 else 0.0
        if self.finished_here:
            eta = self.study_seconds / self.finished_here * remaining / max(1, self.workers)
            eta_text = f"~{eta / 60:.1f} min left"
        else:
            eta_text = "time left unknown yet"
        line = (f"[{elapsed:7.1f}s] studies {self.done}/{self.total} done, {self.running} running, "
                f"{max(0, remaining - self.running)} to do | {rate:.2f} trials/s | {eta_text}")
        print((f"{event}\n" if event else "") + line, file=self.out, flush=True)


def _sweep_worker(worker: Worker, device: str | None) -> None:
    for task in worker.tasks():
        task = replace(task, device=device)
        worker.send(("started", task.spec.study_key))
        try:
            # The parent turns Ctrl-C into SIGTERM for its workers; SIGTERM ends a study as KILLED.
            # Between studies there is nothing to mark KILLED: a plain SIGTERM ends the worker.
            with sigterm_interrupts():
                report = run_study_task(task)
        except EdpsError as error:
            worker.send(("error", f"{task.spec.study_key[:12]}: {error}"))
            return
        worker.send(("finished", report))


def run_local(tasks: list[StudyTask], devices: list[str | None], progress: SweepProgress,
              labels: dict[str, str]) -> None:
    """Studies in parallel worker processes: one per GPU (pinned), else CPU workers."""

    def on_event(event: tuple[Any, ...]) -> None:
        if event[0] == "started":
            progress.started_study()
        elif event[0] == "finished":
            progress.finished_study(event[1], labels[event[1].study_key])
        elif event[0] == "error":
            raise EdpsError(event[1])

    # A stopped worker marks its study's runs KILLED before it exits: give it time to write that.
    spec = PoolSpec(name="edps-sweep-worker", target=_sweep_worker,
                    worker_args=tuple((device,) for device in devices), stop_timeout=30.0)
    run_pool(spec, tasks, on_event, on_idle=progress.render)


def run_ray(tasks: list[StudyTask], address: str | None, gpus_per_study: float, cpus_per_study: float,
            local_cpus: int, progress: SweepProgress, labels: dict[str, str]) -> None:
    """Each study a Ray task; Ray retries lost workers, and resumption covers what is left."""
    try:
        import ray
    except ImportError:
        raise EdpsError("the ray executor needs Ray: pip install 'edps-mlflow[ray]'") from None
    environment = {name: os.environ[name] for name in (
        "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_") if name in os.environ}
    environment["OMP_NUM_THREADS"] = "1"
    init: dict[str, Any] = {"runtime_env": {"env_vars": environment}, "include_dashboard": False,
                            "log_to_driver": False, "ignore_reinit_error": True}
    if address:
        init["address"] = address
    else:
        init["num_cpus"] = local_cpus
    try:
        ray.init(**init)
    except (ConnectionError, RuntimeError) as error:
        raise EdpsError(f"cannot start or reach Ray at {address or 'a local instance'}: {error}") from None
    try:
        remote = ray.remote(num_gpus=gpus_per_study, num_cpus=cpus_per_study, max_retries=3)(run_study_task)
        pending = {remote.remote(task): task for task in tasks}
        for _ in tasks:
            progress.started_study()
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            if not ready:
                progress.render()
                continue
            for reference in ready:
                pending.pop(reference)
                report = ray.get(reference)
                progress.finished_study(report, labels[report.study_key])
    finally:
        ray.shutdown()


@dataclass(frozen=True)
class SweepOptions:
    experiment: str | None = None
    executor: str = "local"
    workers: int | None = None
    ray_address: str | None = None
    device: str | None = None
    data_dir: str | None = None
    full_trials: bool = False
    log_interval: float = 10.0


def _label(study: StudySpec) -> str:
    return f"{study.optimizer.value} sparsity={study.sparsity:g} bs={study.batch_size}"


def run_sweep(spec: SweepSpec, options: SweepOptions, out: TextIO | None = None) -> dict[str, int | None]:
    """Plan against the registry, run what is missing, return study_key -> steps_to_result."""
    out = out or sys.stdout
    spec.validate()
    workload = get_workload(spec.workload)
    for optimizer in spec.optimizers:
        workload.search_space(optimizer.value)
    if options.executor not in ("local", "ray"):
        raise EdpsError(f"unknown executor {options.executor!r}; known executors: local, ray")
    data = workload.load_data(options.data_dir)
    too_large = [b for b in spec.batch_sizes if b > data.train_size]
    if too_large:
        raise EdpsError(f"batch size {too_large[0]} exceeds the {data.train_size} training examples of {workload.name}")
    import torch

    gpus = torch.cuda.device_count() if options.device in (None, "cuda") else 0
    if options.device == "cuda" and gpus == 0:
        raise EdpsError("device cuda requested but no CUDA device is available")

    tracking_uri = resolved_tracking_uri()
    initialise_store(tracking_uri)
    client = client_for(tracking_uri)
    experiment_name = options.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or f"edps/{spec.workload}"
    experiment_id = resolve_experiment(client, experiment_name, experiment_name)
    key = spec.sweep_key
    tracker = SweepTracker.open(client, experiment_id, registry.sweep_run_id(client, experiment_id, key),
                                f"sweep {spec.workload} {len(spec.studies())} studies")
    try:
        stale = registry.running_runs_of_sweep(client, experiment_id, key)
        tracker.mark_failed(stale)
        plan = plan_sweep(client, experiment_id, spec)
        counts = {state: sum(1 for p in plan if p.state is state) for state in PlanState}
        tracker.log_start(key, spec.workload, {
            "workload": spec.workload, "optimizers": ",".join(o.value for o in spec.optimizers),
            "batch_sizes": ",".join(map(str, spec.batch_sizes)), "sparsities": ",".join(map(str, spec.sparsities)),
            "trials": spec.trials, "goal_error": spec.goal_error, "max_steps": spec.max_steps,
            "check_interval": spec.check_interval, "seed": spec.seed},
            {"studies": len(plan), "done": counts[PlanState.DONE], "partial": counts[PlanState.PARTIAL],
             "todo": counts[PlanState.TODO]})
        print(f"sweep {key[:12]} ({spec.workload}): {len(plan)} studies, run {tracker.run_id} in experiment "
              f"{experiment_name!r} at {tracking_uri}", file=out)
        if stale:
            print(f"marked {len(stale)} runs left RUNNING by a killed process as FAILED", file=out)
        print(f"plan: {counts[PlanState.DONE]} done, {counts[PlanState.PARTIAL]} partly done "
              f"(finished trials are reused), {counts[PlanState.TODO]} to do", file=out, flush=True)
        for item in plan:
            if item.state is PlanState.PARTIAL:
                print(f"  partly done: {_label(item.spec)} ({item.finished_trials}/{item.spec.trials} trials)",
                      file=out)

        pending = [p.spec for p in plan if p.state is not PlanState.DONE]
        # Large batches first: they dominate the cost, so starting them early shortens the tail.
        pending.sort(key=lambda s: -s.batch_size)
        cores = available_cores()
        if options.executor == "local":
            devices: list[str | None] = ([f"cuda:{i}" for i in range(gpus)] if gpus else
                                         ["cpu"] * max(1, min(options.workers or cores, len(pending) or 1)))
        else:
            devices = []
        workers = len(devices) if devices else (options.workers or cores)
        threads = max(1, cores // workers) if not gpus else 1
        tasks = [StudyTask(spec=s, tracking_uri=tracking_uri, experiment_id=experiment_id,
                           experiment_name=experiment_name, sweep_run_id=tracker.run_id, sweep_key=key,
                           data_dir=options.data_dir, full_trials=options.full_trials,
                           device=options.device, threads=threads) for s in pending]
        labels = {s.study_key: _label(s) for s in spec.studies()}
        progress = SweepProgress(len(plan), counts[PlanState.DONE], len(pending), workers, out, options.log_interval)
        if tasks:
            if options.executor == "local":
                run_local(tasks, devices, progress, labels)
            else:
                run_ray(tasks, options.ray_address, 1.0 if gpus else 0.0, 1.0, workers, progress, labels)
        final = plan_sweep(client, experiment_id, spec)
        results = {p.spec.study_key: p.steps_to_result for p in final}
        missing = [p for p in final if p.state is not PlanState.DONE]
        if missing:
            raise RuntimeError(f"{len(missing)} studies did not finish")
        tracker.finish({"studies/done": len(final),
                        "studies/with_result": sum(1 for v in results.values() if v is not None),
                        "sweep/seconds": time.monotonic() - progress.started})
        print(f"sweep {key[:12]} complete: {len(final)} studies; `edps status --experiment {experiment_name}` "
              f"shows the grid", file=out, flush=True)
        return results
    except KeyboardInterrupt:
        tracker.abort(interrupted=True)
        raise
    except BaseException:
        tracker.abort(interrupted=False)
        raise
