"""One study: validate -> load data -> plan trials (reuse, order) -> train -> record in MLflow.

    edps study --bs 256                        # digits, SGD, dense, default goal
    edps study --workload mnist-simple-cnn --bs 128 --data-dir ~/data/mnist

The study's steps-to-result is the fewest steps over its trials that reached the goal.
"""

from __future__ import annotations

import io
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np
import pandas as pd
import torch

from edps_mlflow import __version__
from edps_mlflow.config import StudySpec, TrialSpec
from edps_mlflow.engine import (Check, EngineSettings, LocalStepBound, TrialResult, TrialStatus,
                                choose_pack_size)
from edps_mlflow.errors import EdpsError
from edps_mlflow.progress import StudyProgress
from edps_mlflow.pruning import Mask
from edps_mlflow.registry import StoredTrial, finished_trials, neighbour_best_point
from edps_mlflow.tracking import StudyTracker
from edps_mlflow.trial_workers import TrainingJob, train_in_workers, train_inline
from edps_mlflow.workloads import Workload, get_workload


@dataclass(frozen=True)
class ExecutionOptions:
    """How to run a study. None of these change the study's result, only its cost."""

    full_trials: bool = False
    device: str | None = None  # None: cuda when available, else cpu
    workers: int | None = None  # None: one per core on CPU (single-thread each), one on GPU
    pack_size: int | None = None  # None: chosen per device and batch size
    early_abort_evaluation: bool = True
    experiment: str | None = None
    data_dir: str | None = None
    log_interval: float = 10.0
    # Set by a sweep: where the study run goes and which stale run of this study it continues.
    tracking_uri: str | None = None
    parent_run_id: str | None = None
    attach_run_id: str | None = None
    sweep_key: str | None = None
    threads: int | None = None  # CPU threads per training process (None: the cores split between workers)


@dataclass(frozen=True)
class TrialRecord:
    trial: TrialSpec
    status: TrialStatus
    steps_to_result: int | None
    steps_trained: int
    best_validation_error: float | None
    run_id: str
    reused: bool
    seconds: float = 0.0
    probe_seconds: float = 0.0


@dataclass(frozen=True)
class StudyOutcome:
    study_run_id: str
    experiment_id: str
    steps_to_result: int | None
    records: dict[int, TrialRecord] = field(repr=False)
    trained: int
    reused: int
    trial_steps: int
    seconds: float

    def count(self, status: TrialStatus) -> int:
        return sum(1 for r in self.records.values() if r.status is status)


def resolve_device(requested: str | None) -> torch.device:
    if requested is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(requested)
    except RuntimeError:
        raise EdpsError(f"unknown device {requested!r}; use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise EdpsError(f"device {requested} requested but no CUDA device is available")
    if device.type not in ("cpu", "cuda"):
        raise EdpsError(f"unsupported device {requested!r}; use cpu, cuda or cuda:N")
    return device


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def order_trials(trials: list[TrialSpec], workload: Workload, neighbour: dict[str, float] | None) -> list[TrialSpec]:
    """Promising metaparameters first: nearest (in unit-cube coordinates) to a neighbour's best."""
    if neighbour is None or not trials:
        return trials
    space = workload.search_space(trials[0].study.optimizer.value)
    if set(neighbour) != set(space.names):
        return trials
    target = space.units(neighbour)
    return sorted(trials, key=lambda t: (float(np.linalg.norm(space.units(t.metaparameters) - target)), t.index))


class _Recorder:
    """Receives engine events in this process and forwards them to MLflow and the progress line."""

    def __init__(self, tracker: StudyTracker, trials: dict[int, TrialSpec], progress: StudyProgress) -> None:
        self.tracker, self.trials, self.progress = tracker, trials, progress
        self.records: dict[int, TrialRecord] = {}

    def trial_started(self, trial_index: int, mask: Mask | None) -> None:
        self.tracker.start_trial(self.trials[trial_index], mask)
        self.progress.trial_started(trial_index)

    def on_check(self, trial_index: int, check: Check) -> None:
        self.tracker.log_check(trial_index, check)
        self.progress.check(trial_index, check.step, check.validation_error)

    def on_probe(self, trial_index: int, step: int, values: dict[str, float]) -> None:
        self.tracker.log_probe(trial_index, step, values)

    def on_finish(self, result: TrialResult) -> None:
        run_id = self.tracker.finish_trial(result)
        self.records[result.index] = TrialRecord(
            trial=self.trials[result.index], status=result.status, steps_to_result=result.steps_to_result,
            steps_trained=result.steps_trained, best_validation_error=result.best_validation_error,
            run_id=run_id, reused=False, seconds=result.seconds, probe_seconds=result.probe_seconds)
        self.progress.trial_finished(result.index, result.status.value, result.steps_to_result)


def plan_reuse(trials: list[TrialSpec], stored: dict[str, StoredTrial], full_trials: bool) -> dict[int, StoredTrial]:
    """Which trials need no training: finished outcomes that running again could not change."""
    candidates = {t.index: stored[t.trial_key] for t in trials if t.trial_key in stored}
    reached = [s.steps_to_result for s in candidates.values()
               if s.status is TrialStatus.REACHED and s.steps_to_result is not None]
    best = min(reached) if reached else None
    reuse = {}
    for index, stored_trial in candidates.items():
        if stored_trial.status is not TrialStatus.SUPERSEDED:
            reuse[index] = stored_trial
        elif not full_trials and best is not None:
            # A superseded trial stopped at the bound of its own study; it stays superseded if
            # that bound is no looser than the best reached step we already know of.
            spec = trials[0].study
            if stored_trial.steps_trained >= min(spec.max_steps, best - spec.check_interval):
                reuse[index] = stored_trial
    return reuse


def run_study(spec: StudySpec, options: ExecutionOptions, out: TextIO | None = None) -> StudyOutcome:
    out = out or sys.stdout
    started = time.perf_counter()
    # Everything that can be wrong with the input is checked before the tracking store is touched.
    spec.validate()
    workload = get_workload(spec.workload)
    space = workload.search_space(spec.optimizer.value)
    device = resolve_device(options.device)
    if options.workers is not None and options.workers < 1:
        raise EdpsError(f"workers must be a positive integer, got {options.workers}")
    if options.pack_size is not None and options.pack_size < 1:
        raise EdpsError(f"pack size must be a positive integer, got {options.pack_size}")
    data = workload.load_data(options.data_dir)
    if spec.batch_size > data.train_size:
        raise EdpsError(f"batch size {spec.batch_size} exceeds the {data.train_size} training examples of "
                        f"{workload.name}")
    trials = [TrialSpec(spec, index, point) for index, point in enumerate(space.points(spec.trials))]
    settings = EngineSettings(
        batch_size=spec.batch_size, max_steps=spec.max_steps, check_interval=spec.check_interval,
        allowed_errors=workload.allowed_errors(spec.goal_error, data.validation_size), data_seed=spec.seed,
        early_abort_evaluation=options.early_abort_evaluation,
        # PERF.md and bench/: channels-last pays from medium batches on; at tiny ones it costs.
        channels_last=spec.batch_size >= 32,
        probes=spec.probes, probe_interval=spec.probe_interval,
    )

    tracker = StudyTracker.open(spec, options.experiment, tracking_uri=options.tracking_uri,
                                parent_run_id=options.parent_run_id, attach_run_id=options.attach_run_id,
                                sweep_key=options.sweep_key)
    try:
        return _run_tracked(spec, options, workload, data, trials, settings, device, tracker, out, started)
    except KeyboardInterrupt:
        tracker.abort(interrupted=True)
        raise
    except BaseException:
        tracker.abort(interrupted=False)
        raise


def _run_tracked(spec: StudySpec, options: ExecutionOptions, workload: Workload, data: Any,
                 trials: list[TrialSpec], settings: EngineSettings, device: torch.device,
                 tracker: StudyTracker, out: TextIO, started: float) -> StudyOutcome:
    stored = finished_trials(tracker.client, tracker.experiment_id, spec)
    reused = plan_reuse(trials, stored, options.full_trials)
    neighbour = neighbour_best_point(tracker.client, tracker.experiment_id, spec)
    to_train = order_trials([t for t in trials if t.index not in reused], workload,
                            neighbour[1] if neighbour else None)
    trial_order = f"nearest to the best trial at batch size {neighbour[0]}" if neighbour else "sobol"

    pack = options.pack_size or choose_pack_size(device, spec.batch_size, max(1, len(to_train)))
    chunks = [[t.index for t in to_train[i:i + pack]] for i in range(0, len(to_train), pack)]
    cores = available_cores()
    workers = 1 if device.type != "cpu" else (options.workers or max(1, min(cores, len(chunks))))
    workers = min(workers, max(1, len(chunks)))
    threads = options.threads or max(1, cores // workers)
    run_settings = {"full_trials": options.full_trials, "device": str(device), "workers": workers,
                    "threads_per_worker": threads, "pack_size": pack,
                    "early_abort_evaluation": options.early_abort_evaluation, "trial_order": trial_order}
    tracker.log_study_start(spec, run_settings, reused=len(reused))

    print(f"study {spec.workload} {spec.optimizer.value} bs={spec.batch_size} sparsity={spec.sparsity:g} "
          f"goal={spec.goal_error:g}: {len(trials)} trials, run {tracker.study_run_id} in experiment "
          f"{tracker.experiment_id}", file=out)
    if reused:
        print(f"reusing {len(reused)} finished trials from earlier runs (same trial keys); training "
              f"{len(to_train)}", file=out)
    print(f"training {len(to_train)} trials on {device} in {len(chunks)} chunks of up to {pack}, "
          f"{workers} worker(s) x {threads} thread(s), "
          f"{'full trials' if options.full_trials else 'exact early stopping'}, trial order: {trial_order}",
          file=out, flush=True)

    reached = [s.steps_to_result for s in reused.values() if s.steps_to_result is not None]
    best_known = min(reached) if reached else None
    progress = StudyProgress(len(trials), len(to_train), stream=out, log_interval=options.log_interval)
    recorder = _Recorder(tracker, {t.index: t for t in trials}, progress)
    job = TrainingJob(spec=spec, points=tuple(t.metaparameters for t in trials), settings=settings,
                      data_dir=options.data_dir, device=str(device), threads=threads,
                      exact_early_stopping=not options.full_trials)
    if chunks:
        if workers == 1:
            bound = LocalStepBound(settings.max_steps, settings.check_interval, not options.full_trials, best_known)
            train_inline(job, chunks, data.to(device), bound, recorder)
        else:
            train_in_workers(job, chunks, workers, best_known if not options.full_trials else None, recorder)
    progress.close()

    records = dict(recorder.records)
    for index, stored_trial in reused.items():
        records[index] = TrialRecord(
            trial=trials[index], status=stored_trial.status, steps_to_result=stored_trial.steps_to_result,
            steps_trained=stored_trial.steps_trained, best_validation_error=stored_trial.best_validation_error,
            run_id=stored_trial.run_id, reused=True)
    outcome = _summarise(tracker, records, len(to_train), len(reused), time.perf_counter() - started)
    _log_outcome(tracker, spec, outcome, run_settings, settings)
    tracker.finish_study()
    _print_outcome(outcome, out)
    return outcome


def _summarise(tracker: StudyTracker, records: dict[int, TrialRecord], trained: int, reused: int,
               seconds: float) -> StudyOutcome:
    reached = [r for r in records.values() if r.status is TrialStatus.REACHED]
    steps = min((r.steps_to_result for r in reached if r.steps_to_result is not None), default=None)
    return StudyOutcome(
        study_run_id=tracker.study_run_id, experiment_id=tracker.experiment_id, steps_to_result=steps,
        records=dict(sorted(records.items())), trained=trained, reused=reused,
        trial_steps=sum(r.steps_trained for r in records.values() if not r.reused), seconds=seconds)


def best_record(outcome: StudyOutcome) -> TrialRecord | None:
    reached = [r for r in outcome.records.values() if r.status is TrialStatus.REACHED]
    return min(reached, key=lambda r: (r.steps_to_result, r.trial.index)) if reached else None


def trials_table(outcome: StudyOutcome) -> pd.DataFrame:
    rows = []
    for record in outcome.records.values():
        rows.append({
            "trial_index": record.trial.index, "trial_key": record.trial.trial_key, "status": record.status.value,
            "steps_to_result": record.steps_to_result, "steps_trained": record.steps_trained,
            "best_validation_error": record.best_validation_error,
            **{name: value for name, value in record.trial.metaparameters.items()},
            "init_seed": record.trial.init_seed, "run_id": record.run_id, "reused": record.reused,
            "seconds": round(record.seconds, 3),
        })
    return pd.DataFrame(rows).astype({"steps_to_result": "Int64"})


def _log_outcome(tracker: StudyTracker, spec: StudySpec, outcome: StudyOutcome, run_settings: dict[str, Any],
                 settings: EngineSettings) -> None:
    metrics: dict[str, float] = {f"trials/{status.value}": outcome.count(status) for status in TrialStatus}
    metrics.update({"trials/total": len(outcome.records), "trials/reused": outcome.reused,
                    "trials/trained": outcome.trained, "study/seconds": outcome.seconds,
                    "probe/seconds": sum(r.probe_seconds for r in outcome.records.values()),
                    "study/trial_steps": outcome.trial_steps})
    best = best_record(outcome)
    if outcome.steps_to_result is not None:
        metrics["steps_to_result"] = outcome.steps_to_result
    summary = {"metrics": metrics, "best_metaparameters": best.trial.metaparameters if best else {}}
    study_json = {
        "version": __version__, "study_key": spec.study_key, "spec": spec.key_fields(),
        "steps_to_result": outcome.steps_to_result,
        "best_trial": None if best is None else {"trial_index": best.trial.index, "run_id": best.run_id,
                                                  "metaparameters": best.trial.metaparameters},
        "counts": {status.value: outcome.count(status) for status in TrialStatus},
        "reused": outcome.reused, "trained": outcome.trained, "trial_steps": outcome.trial_steps,
        "seconds": outcome.seconds, "execution": run_settings, "allowed_validation_errors": settings.allowed_errors,
    }
    buffer = io.StringIO()
    trials_table(outcome).to_csv(buffer, index=False)
    tracker.log_study_result(summary, buffer.getvalue(), study_json)


def _print_outcome(outcome: StudyOutcome, out: TextIO) -> None:
    counts = ", ".join(f"{status.value} {outcome.count(status)}" for status in TrialStatus)
    best = best_record(outcome)
    if best is None:
        head = "no trial reached the goal: no steps_to_result"
    else:
        values = ", ".join(f"{k}={v:.4g}" for k, v in best.trial.metaparameters.items())
        head = f"steps_to_result = {outcome.steps_to_result} (trial {best.trial.index}: {values})"
    print(f"{head}\n{counts}; reused {outcome.reused}, trained {outcome.trained} "
          f"({outcome.trial_steps} trial-steps) in {outcome.seconds:.1f} s; study run {outcome.study_run_id}",
          file=out, flush=True)
