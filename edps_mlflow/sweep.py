"""A sweep: the grid of studies batch sizes x sparsities x optimizers of one workload.

    edps sweep --workload digits-simple-cnn --batch-sizes 2..1024 --sparsities 0,0.5,0.9
    edps sweep ... --executor ray --ray-address auto

The tracking store is the registry. Before launching, the sweep looks up every study key: a
FINISHED study run (in the same early-stopping mode) means done; finished trial runs without one
mean partly done (those trials are reused, not retrained); the rest is to do. Runs whose lease
expired (their process is dead) are marked FAILED; a study that was cut short starts a new study
run that reuses its finished trials. A live run is never duplicated (leases.py): a second sweep of
the same key stops or waits (``--wait``), and a study that another live process is training is
waited for. Killing a sweep at any moment and starting it again finishes the grid with nothing
finished trained twice.

An executor runs the studies that are not done: ``local`` (worker processes on this machine),
``ray`` (Ray tasks on a cluster) or ``mlflow-project`` (each study a run of the MLproject, submitted
through MLflow Projects to its local or Kubernetes backend: project_executor.py).
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import time
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Callable, TextIO

from edps_mlflow import registry
from edps_mlflow.config import StudySpec
from edps_mlflow.errors import EdpsError
from edps_mlflow.leases import clear_expired, describe_live, earlier_live_rival, live_runs, wait_for
from edps_mlflow.mlproject import (
    Backend,
    preview_kubernetes_job,
    project_directory,
    stage_docker_project,
    study_parameters,
)
from edps_mlflow.names import KIND_SWEEP
from edps_mlflow.pool import PoolSpec, Worker, run_pool, sigterm_interrupts
from edps_mlflow.project_executor import ProjectExecutor, ProjectSweep
from edps_mlflow.progress import SweepProgress, SweepStudy
from edps_mlflow.resources import ALLOCATOR_ENVIRONMENT, available_cores, cuda_devices, sweep_layout
from edps_mlflow.results import StudyReport
from edps_mlflow.study import ExecutionOptions, run_study
# The grid and the options, torch-free to import (the CLI validates with them first); re-exported here.
from edps_mlflow.sweep_spec import SweepOptions, SweepSpec
from edps_mlflow.tracking import (
    SweepTracker,
    connect,
    experiment_name_for,
    launcher_run,
    lease_seconds,
    open_store,
    redact_uri,
    resolve_experiment,
    resolve_tracking_uri,
    store_error_line,
    store_errors,
    ui_link,
    yield_run,
)
from edps_mlflow.workloads import get_workload

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


def plan_sweep(client: Any, experiment_id: str, spec: SweepSpec, full_trials: bool) -> list[PlannedStudy]:
    """Each study of the grid: done (a finished study run in the same early-stopping mode), partly done
    (finished trials to reuse) or to do."""
    return plan_studies(client, experiment_id, spec.workload, spec.studies(), full_trials)


def plan_studies(client: Any, experiment_id: str, workload: str, studies: list[StudySpec],
                 full_trials: bool) -> list[PlannedStudy]:
    """Each of ``studies`` (of one workload): done, partly done or to do (see :func:`plan_sweep`)."""
    stored = registry.study_runs(client, experiment_id, workload)
    finished = {(s.study_key, s.full_trials): s for s in stored if s.finished}
    # Finished trials are counted only for the studies that have a study run but are not done (a few):
    # a study without any run has no trial runs of its key (they are made under its study run).
    started = {s.study_key for s in stored}
    trial_counts = registry.planned_trial_counts(client, experiment_id, stored, [
        s.study_key for s in studies
        if s.study_key in started and (s.study_key, s.full_trials(full_trials)) not in finished])
    plan = []
    for study in studies:
        key = study.study_key
        # A study whose every trial probes trains whole runs whatever the sweep's mode (StudySpec.full_trials).
        done = finished.get((key, study.full_trials(full_trials)))
        if done is not None:
            plan.append(PlannedStudy(study, PlanState.DONE, study.trials, done.steps_to_result))
        elif trial_counts.get(key):
            plan.append(PlannedStudy(study, PlanState.PARTIAL, trial_counts[key], None))
        else:
            plan.append(PlannedStudy(study, PlanState.TODO, 0, None))
    return plan


def run_study_task(task: StudyTask, on_trial: Callable[[str, int | None], None] | None = None,
                   on_steps: Callable[[int, int], None] | None = None) -> StudyReport:
    """Run one study of a sweep; idempotent, so that a retried task (Ray) never trains twice.
    ``on_trial(status, steps_to_result)`` hears of each trial that ends, ``on_steps(trial_steps,
    furthest_step)`` of the steps trained (the local executor's progress)."""
    started = time.perf_counter()
    client = connect(task.tracking_uri)
    done = registry.latest_finished_study(client, task.experiment_id, task.spec.study_key,
                                          task.spec.full_trials(task.full_trials))
    if done is not None:
        return StudyReport(done.key, done.steps_to_result, task.spec.trials, 0, 0.0, skipped=True)
    # A live run of this study elsewhere (another sweep, a lone study) is waited for, never duplicated.
    options = ExecutionOptions(
        full_trials=task.full_trials, device=task.device, workers=1, experiment=task.experiment_name,
        data_dir=task.data_dir, log_interval=60.0, tracking_uri=task.tracking_uri,
        parent_run_id=task.sweep_run_id, sweep_key=task.sweep_key, threads=task.threads, wait=True,
        adopt_launcher_run=False)
    outcome = run_study(task.spec, options, out=io.StringIO(), on_trial=on_trial, on_steps=on_steps)
    return StudyReport(task.spec.study_key, outcome.steps_to_result, len(outcome.records) or task.spec.trials,
                       outcome.trained, time.perf_counter() - started, skipped=not outcome.records)


def _sweep_worker(worker: Worker, device: str | None) -> None:
    for task in worker.tasks():
        task = replace(task, device=device)
        worker.send(("started", task.spec.study_key))
        try:
            # The parent turns Ctrl-C into SIGTERM for its workers; SIGTERM ends a study as KILLED.
            # Between studies there is nothing to mark KILLED: a plain SIGTERM ends the worker.
            key = task.spec.study_key
            with sigterm_interrupts():
                report = run_study_task(
                    task, lambda status, steps: worker.send(("trial", key, status, steps)),
                    lambda trial_steps, furthest: worker.send(("steps", key, trial_steps, furthest)))
        except EdpsError as error:
            worker.send(("error", f"{task.spec.study_key[:12]}: {error}"))
            return
        except Exception as error:
            # A store error that outlived the retries: one line for the parent, not a traceback.
            line = store_error_line(error, task.tracking_uri)
            if line is None:
                raise
            worker.send(("error", f"{task.spec.study_key[:12]}: {line}"))
            return
        worker.send(("finished", report))


def run_local(tasks: list[StudyTask], devices: list[str | None], progress: SweepProgress,
              labels: dict[str, str]) -> None:
    """Studies in parallel worker processes: one per GPU (pinned), else CPU workers."""

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
    environment = {name: os.environ[name] for name in ALLOCATOR_ENVIRONMENT if name in os.environ}
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
        raise EdpsError(f"cannot start or reach Ray at {redact_uri(address or 'a local instance')}: "
                        f"{redact_uri(str(error))}") from None
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


def _label(study: StudySpec) -> str:
    return f"{study.optimizer.value} sparsity={study.sparsity:g} bs={study.batch_size}"


@dataclass(frozen=True)
class _OpenSweep:
    """A sweep attached to its store: where it writes and its run."""

    client: Any
    tracking_uri: str
    experiment_name: str
    experiment_id: str
    tracker: SweepTracker


def run_sweep(spec: SweepSpec, options: SweepOptions, out: TextIO | None = None) -> dict[str, int | None]:
    """Plan against the registry, run what is missing, return study_key -> steps_to_result."""
    out = out or sys.stdout
    workload = get_workload(spec.workload)
    workload.require_data(options.data_dir)
    cuda_devices(options.device, indexed=False)  # refuses cuda without a CUDA device, before any work
    if spec.protocol.data_fingerprint is None:
        # The keys of the grid need the data's fingerprint (cached per file set: no reload next time).
        spec = replace(spec, protocol=replace(spec.protocol, data_fingerprint=workload.data_fingerprint(options.data_dir)))
    if options.executor == "mlflow-project":
        _check_project_launch(spec, options)
    complete = _already_complete(spec, options, out)
    if complete is not None:
        return complete
    sweep = _open(spec, options, out)
    try:
        plan = _plan(spec, options, sweep, out)
        pending = [p.spec for p in plan if p.state is not PlanState.DONE]
        progress = sweep_progress(plan, out, options.log_interval)
        if pending:
            _dispatch(pending, spec.sweep_key, options, sweep, progress, out)
        return _finish(spec, options, sweep, progress, out)
    except KeyboardInterrupt:
        sweep.tracker.abort(interrupted=True)
        raise
    except BaseException:
        sweep.tracker.abort(interrupted=False)
        raise


def _check_project_launch(spec: SweepSpec, options: SweepOptions) -> None:
    """Everything --executor mlflow-project needs, checked before any work: the project, the tools of
    the backend and environment manager, and on Kubernetes the job MLflow would submit."""
    project = project_directory()
    launch = options.project
    tracking_uri = resolve_tracking_uri()
    launch.check_environment(tracking_uri)
    if launch.backend is Backend.KUBERNETES:
        staged = stage_docker_project(project, launch.kubernetes.base_image)
        try:
            preview_kubernetes_job(launch, staged, study_parameters(
                spec.studies()[0], "<sweep run id>", spec.sweep_key, options.data_dir, options.full_trials,
                options.device, None), tracking_uri)
        finally:
            shutil.rmtree(staged, ignore_errors=True)


@dataclass(frozen=True)
class FinishedSweep:
    """The finished run(s) of a sweep key, and the store and experiment they are in."""

    client: Any
    experiment_id: str
    runs: list[registry.LeasedRun]


def finished_sweep(workload: str, experiment: str | None, sweep_key: str) -> FinishedSweep | None:
    """The sweep runs of ``sweep_key`` when there are some and all have finished; None otherwise, and when
    `mlflow run` made a run for this command (that run must become the sweep run)."""
    if os.environ.get("MLFLOW_RUN_ID"):
        return None
    client = open_store()
    with store_errors(client):
        found = client.get_experiment_by_name(experiment_name_for(workload, experiment))
        if found is None:
            return None
        runs = registry.sweep_runs(client, found.experiment_id, sweep_key)
    if not runs or not all(r.state.is_finished for r in runs):
        return None
    return FinishedSweep(client, found.experiment_id, runs)


def _already_complete(spec: SweepSpec, options: SweepOptions, out: TextIO) -> dict[str, int | None] | None:
    """The results of a sweep whose run finished and whose every study is done: a rerun then trains
    nothing and leaves the finished sweep run (its duration, summary and description) as it was.
    None when there is anything to do, or when `mlflow run` made a run for this command."""
    done = finished_sweep(spec.workload, options.experiment, spec.sweep_key)
    if done is None:
        return None
    client, runs = done.client, done.runs
    with store_errors(client):
        plan = plan_sweep(client, done.experiment_id, spec, options.full_trials)
    if any(p.state is not PlanState.DONE for p in plan):
        return None
    print(f"sweep {spec.sweep_key[:12]} ({spec.workload}) already complete: {len(plan)} studies done in sweep run "
          f"{runs[-1].run_id}; nothing to train", file=out)
    print(ui_link(str(client.tracking_uri), done.experiment_id, runs[-1].run_id), file=out, flush=True)
    return {p.spec.study_key: p.steps_to_result for p in plan}


def _open(spec: SweepSpec, options: SweepOptions, out: TextIO, key: str | None = None,
          name: str | None = None) -> _OpenSweep:
    """The sweep's run, live and ours: the earlier run of this sweep when its owner is gone (a resume),
    else a new one. A live sweep of the same key elsewhere stops us with one line, or is waited for.
    ``key`` and ``name``: another sweep key and run name than the grid's (an adaptive sweep's)."""
    client = open_store()
    tracking_uri = client.tracking_uri
    lease = lease_seconds()
    key = key or spec.sweep_key
    label = f"sweep {key[:12]} ({spec.workload})"
    name = name or f"sweep {spec.workload} {len(spec.studies())} studies"
    with store_errors(client):
        launched = launcher_run(client)
        # Under `mlflow run` the sweep goes to the experiment of the run it made for us.
        experiment_name = launched.experiment_name if launched else experiment_name_for(spec.workload,
                                                                                           options.experiment)
        experiment_id = resolve_experiment(client, experiment_name)
        launcher = launched.run_id if launched else None
        while True:
            runs = registry.keyed_runs(client, experiment_id, KIND_SWEEP, key)
            live = live_runs(runs, lease)
            rival = live[0] if live else None
            tracker = None
            if rival is None and runs:
                tracker = SweepTracker.take_over(client, experiment_id, runs[0].run_id, key, spec.workload)
                if tracker is None:
                    continue  # taken over by another process this very moment: it is live now
            elif rival is None:
                tracker = SweepTracker.create(client, experiment_id, name, key, spec.workload, launcher)
                rival = earlier_live_rival(client, experiment_id, KIND_SWEEP, key, tracker.run_id, lease)
                if rival is not None:
                    yield_run(client, tracker.run_id, rival.run_id, keep_kind=launcher is None)
                    launcher, tracker = None, None
            if tracker is not None:
                break
            if not options.wait:
                raise EdpsError(describe_live(label, rival, lease))
            wait_for(client, rival.run_id, lease, out, label)
    tracker.start_heartbeat()
    return _OpenSweep(client, tracking_uri, experiment_name, experiment_id, tracker)


def _plan(spec: SweepSpec, options: SweepOptions, sweep: _OpenSweep, out: TextIO) -> list[PlannedStudy]:
    """Clean up after killed processes, plan against the store, and say so."""
    # Only runs of dead processes: a live study of another sweep or a lone study keeps running.
    stale = clear_expired(sweep.client, sweep.experiment_id, lease_seconds())
    plan = plan_sweep(sweep.client, sweep.experiment_id, spec, options.full_trials)
    counts = {state: sum(1 for p in plan if p.state is state) for state in PlanState}
    sweep.tracker.log_start({**spec.params(), "full_trials": options.full_trials}, {
        "studies": len(plan), "done": counts[PlanState.DONE], "partial": counts[PlanState.PARTIAL],
        "todo": counts[PlanState.TODO]})
    print(f"sweep {spec.sweep_key[:12]} ({spec.workload}): {len(plan)} studies, run {sweep.tracker.run_id} in "
          f"experiment {sweep.experiment_name!r} at {redact_uri(sweep.tracking_uri)}; artifacts under "
          f"{redact_uri(sweep.client.get_experiment(sweep.experiment_id).artifact_location)}", file=out)
    if stale:
        print(f"marked {stale} runs left RUNNING by a dead process (lease expired) as FAILED", file=out)
    print(f"plan: {counts[PlanState.DONE]} done, {counts[PlanState.PARTIAL]} partly done "
          f"(finished trials are reused), {counts[PlanState.TODO]} to do", file=out, flush=True)
    for item in plan:
        if item.state is PlanState.PARTIAL:
            print(f"  partly done: {_label(item.spec)} ({item.finished_trials}/{item.spec.trials} trials)",
                  file=out)
    return plan


def sweep_description(spec: SweepSpec, plan: list[PlannedStudy]) -> str:
    """The sweep run's description: the grid and its steps-to-result, one Markdown table per optimizer."""
    p = spec.protocol
    parts = [f"Sweep of {spec.workload}: {len(plan)} studies, {p.trials} trials each, goal {p.goal_error:g}, "
             f"a check every {p.check_interval} steps, cap {p.max_steps}. Steps-to-result ('-': no trial "
             f"reached the goal); each study is a child run."]
    steps = {(s.spec.optimizer.value, s.spec.sparsity, s.spec.batch_size): s.steps_to_result for s in plan}
    for optimizer in spec.optimizers:
        header = "| batch size | " + " | ".join(f"sparsity {s:g}" for s in spec.sparsities) + " |"
        rule = "|---|" + "---|" * len(spec.sparsities)
        rows = [f"| {b} | " + " | ".join(str(steps.get((optimizer.value, s, b)) or "-") for s in spec.sparsities)
                + " |" for b in spec.batch_sizes]
        parts.append("\n".join([f"**{optimizer.value}**", "", header, rule, *rows]))
    return "\n\n".join(parts)


def _trials_to_train(plan: list[PlannedStudy]) -> int:
    """Trials the sweep still has to train (finished ones of partly done studies are reused)."""
    return sum(max(0, p.spec.trials - p.finished_trials) for p in plan if p.state is not PlanState.DONE)


def sweep_progress(plan: list[PlannedStudy], out: TextIO, interval: float) -> SweepProgress:
    """The progress line of the plan's studies still to train, with the results of those already done."""
    pending = [p for p in plan if p.state is not PlanState.DONE]
    studies = [SweepStudy(_label(p.spec), f"{p.spec.workload} {p.spec.optimizer.value} {p.spec.sparsity:g}",
                          p.spec.batch_size, 0 if p.state is PlanState.DONE else p.spec.trials - p.finished_trials,
                          p.spec.max_steps, p.steps_to_result) for p in plan]
    return SweepProgress(len(plan), len(plan) - len(pending), _trials_to_train(plan), 1, out, interval, studies)


def _dispatch(pending: list[StudySpec], sweep_key: str, options: SweepOptions, sweep: _OpenSweep,
              progress: SweepProgress, out: TextIO) -> None:
    """Run the pending studies on the chosen executor, as studies of the sweep ``sweep_key``."""
    # Large batches first: they dominate the cost, so starting them early shortens the tail.
    pending = sorted(pending, key=lambda s: -s.batch_size)
    labels = {s.study_key: _label(s) for s in pending}
    if options.executor == "mlflow-project":
        _run_projects(pending, sweep_key, options, sweep, progress, labels, out)
        return
    if options.executor == "local":
        layout = sweep_layout(options.device, options.workers, len(pending))
        devices, workers, threads = list(layout.devices), len(layout.devices), layout.threads
    else:
        gpus = cuda_devices(options.device, indexed=False)
        devices, workers = [], (gpus or options.workers or available_cores())
        threads = 1 if gpus else max(1, available_cores() // workers)
    progress.workers = workers
    tasks = [StudyTask(spec=s, tracking_uri=sweep.tracking_uri, experiment_id=sweep.experiment_id,
                       experiment_name=sweep.experiment_name, sweep_run_id=sweep.tracker.run_id,
                       sweep_key=sweep_key, data_dir=options.data_dir, full_trials=options.full_trials,
                       device=options.device, threads=threads) for s in pending]
    if options.executor == "local":
        run_local(tasks, devices, progress, labels)
    else:
        gpus = cuda_devices(options.device, indexed=False)
        run_ray(tasks, options.ray_address, 1.0 if gpus else 0.0, 1.0, workers, progress, labels)


def _run_projects(pending: list[StudySpec], sweep_key: str, options: SweepOptions, sweep: _OpenSweep,
                  progress: SweepProgress, labels: dict[str, str], out: TextIO) -> None:
    """Each pending study a run of the MLproject (project_executor.py); failures are reported as they
    happen, and the sweep ends with one line naming them once the others are done."""
    launch = options.project
    workers = options.workers or available_cores()
    progress.workers = min(workers, len(pending))
    # On this machine the submitted studies share its cores; a Kubernetes pod sizes its own.
    study_workers = max(1, available_cores() // progress.workers) if launch.backend is Backend.LOCAL else None
    executor = ProjectExecutor(
        ProjectSweep(client=sweep.client, tracking_uri=sweep.tracking_uri, experiment_id=sweep.experiment_id,
                     workload=pending[0].workload, sweep_run_id=sweep.tracker.run_id, sweep_key=sweep_key,
                     data_dir=options.data_dir, full_trials=options.full_trials, device=options.device,
                     launch=launch, project=project_directory()),
        workers, study_workers, progress, labels, out)
    failures = executor.run(pending)
    if failures:
        raise EdpsError(f"{len(failures)} of {len(pending)} studies failed (reported above; first: {failures[0]}); "
                        f"run the same command again to retry them: finished trials and studies are reused")


def _finish(spec: SweepSpec, options: SweepOptions, sweep: _OpenSweep, progress: SweepProgress,
            out: TextIO) -> dict[str, int | None]:
    """Check the grid in the store, close the sweep run and return its results."""
    progress.close()
    final = plan_sweep(sweep.client, sweep.experiment_id, spec, options.full_trials)
    missing = [p for p in final if p.state is not PlanState.DONE]
    if missing:
        raise RuntimeError(f"{len(missing)} studies did not finish")
    results = {p.spec.study_key: p.steps_to_result for p in final}
    sweep.tracker.finish(len(final), sum(1 for v in results.values() if v is not None),
                         time.monotonic() - progress.started, sweep_description(spec, final))
    print(f"sweep {spec.sweep_key[:12]} complete: {len(final)} studies; `edps status --experiment "
          f"{sweep.experiment_name}` shows the grid", file=out)
    print(ui_link(sweep.tracking_uri, sweep.experiment_id), file=out, flush=True)
    return results
