"""One study: plan (reuse, order, layout) -> train -> record, tracked in MLflow.

    edps study --bs 256                        # digits, SGD, dense, the workload's protocol
    edps study --workload mnist-simple-cnn --bs 128 --data-dir ~/data/mnist

The study's steps-to-result is the fewest steps over its trials that reached the goal.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, TextIO

import numpy as np

from edps_mlflow import names as n
from edps_mlflow import resources
from edps_mlflow.config import Schedule, StudySpec, TrialSpec
from edps_mlflow.data.catalog import require_verified
from edps_mlflow.data.fingerprint import splits_fingerprint
from edps_mlflow.data.splits import DataSplits
from edps_mlflow.descriptions import EXPERIMENT_DESCRIPTION, pruned_by
from edps_mlflow.engine import EngineSettings, LocalStepBound
from edps_mlflow.errors import EdpsError
from edps_mlflow.ladder import goal_results, goals_sentence
from edps_mlflow.names import KIND_STUDY
from edps_mlflow.parameterization import Parameterization
from edps_mlflow.progress import StudyProgress
from edps_mlflow.pruning.cache import default_score_cache
from edps_mlflow.pruning.mask import Mask
from edps_mlflow.results import (Check, ProbedTrials, PruningRecord, StudyOutcome, TrialRecord, TrialResult,
                                 TrialStatus, best_reached_step, pruning_summary, training_limit)
from edps_mlflow.store.client import StoreClient, connect, open_store, ui_link
from edps_mlflow.store.experiment import experiment_name_for, resolve_experiment
from edps_mlflow.store.ownership.claim import ClaimRules, OnLive, claim_launched, launcher_run
from edps_mlflow.store.ownership.lease import abort_guard
from edps_mlflow.store.read.runs import ladder_answer, latest_finished_study
from edps_mlflow.store.read.trials import StoredTrial, finished_trials, neighbour_best_point
from edps_mlflow.store.trouble import store_errors
from edps_mlflow.store.write.study import StudyTracker, create_study_run
from edps_mlflow.supar import check_network
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
    # Set by a sweep: its store, and its run and key, under which the study run goes.
    tracking_uri: str | None = None
    parent_run_id: str | None = None
    sweep_key: str | None = None
    wait: bool = False  # for a live run of the same study elsewhere (a sweep always waits), else stop
    # The run `mlflow run` made for us (MLFLOW_RUN_ID) as the study run; not in a sweep's workers (they inherit it)
    adopt_launcher_run: bool = True
    threads: int | None = None  # CPU threads per training process (None: the cores split between workers)
    curve_interval: int | None = None  # steps between full validation passes (None: see curve_interval_for)
    system_metrics: bool = False  # CPU/memory/GPU of the machine on the study run (MLflow's monitor)
    schedule: Schedule = Schedule.BREADTH_FIRST
    accept_unverified_data: bool = False  # data files not the published ones: train, and say so on every run

    def __post_init__(self) -> None:
        for name, value in (("workers", self.workers), ("pack size", self.pack_size), ("threads", self.threads),
                            ("curve interval", self.curve_interval)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise EdpsError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class StudyPlan:
    """What a study will do: which trials it reuses, which it trains in which order, and where."""

    trials: list[TrialSpec]
    reused: dict[int, StoredTrial]
    to_train: list[TrialSpec]
    layout: resources.WorkerLayout
    schedule: Schedule
    run_settings: dict[str, Any] = field(repr=False)
    device_description: str  # where the training times are measured (resources.describe_device)
    warning: str | None = None
    model_size: tuple[int, int] = (0, 0)  # (parameters, bytes) of the network, for the time-to-result analysis

    @property
    def chunks(self) -> list[list[int]]:
        pack = self.layout.pack_size
        return [[t.index for t in self.to_train[i:i + pack]] for i in range(0, len(self.to_train), pack)]


def order_trials(trials: list[TrialSpec], workload: Workload, neighbour: dict[str, float] | None) -> list[TrialSpec]:
    """Promising metaparameters first: nearest (in unit-cube coordinates) to a neighbour's best."""
    if neighbour is None or not trials:
        return trials
    space = trials[0].study.search_space(workload)
    if not set(space.names) <= set(neighbour):
        return trials
    target = space.units(neighbour)
    return sorted(trials, key=lambda t: (float(np.linalg.norm(space.units(t.metaparameters) - target)), t.index))


def plan_reuse(trials: list[TrialSpec], stored: dict[str, StoredTrial], full_trials: bool) -> dict[int, StoredTrial]:
    """Which trials need no training: finished outcomes that running again could not change."""
    candidates = {t.index: stored[t.trial_key] for t in trials if t.trial_key in stored}
    best = best_reached_step((s.status, s.steps_to_result) for s in candidates.values())
    if full_trials or best is None:
        return {i: s for i, s in candidates.items() if s.status is not TrialStatus.SUPERSEDED}
    # A superseded trial stopped at the bound of its own study; it stays superseded if that bound is no
    # looser than the best reached step we already know of.
    limit = training_limit(trials[0].study.max_steps, trials[0].study.check_interval, best)
    return {i: s for i, s in candidates.items() if s.status is not TrialStatus.SUPERSEDED or s.steps_trained >= limit}


# A validation split this small costs little to evaluate whole: every check draws a curve point. Otherwise
# one check in ten is a full pass, a small fraction of the training time.
SMALL_VALIDATION = 1000
CURVE_EVERY_CHECKS = 10


def curve_interval_for(spec: StudySpec, validation_size: int, requested: int | None) -> int:
    """Steps between the full validation passes that give each trial its curve (a multiple of the check
    interval: only checks evaluate)."""
    if requested is not None:
        return max(1, round(requested / spec.check_interval)) * spec.check_interval
    every = 1 if validation_size <= SMALL_VALIDATION else CURVE_EVERY_CHECKS
    return every * spec.check_interval


def engine_settings(spec: StudySpec, workload: Workload, validation_size: int,
                    options: ExecutionOptions) -> EngineSettings:
    """How the engine trains the trials of ``spec`` (its probes included: pass the training spec for a
    study that probes only its best trial)."""
    return EngineSettings(
        batch_size=spec.batch_size, max_steps=spec.max_steps, check_interval=spec.check_interval,
        goal_bounds=tuple(workload.goal_bound(goal, validation_size) for goal in spec.ladder), data_seed=spec.seed,
        early_abort_evaluation=options.early_abort_evaluation,
        curve_interval=curve_interval_for(spec, validation_size, options.curve_interval),
        channels_last=resources.uses_channels_last(workload.input_layout, spec.batch_size), probes=spec.probes,
        probe_interval=spec.probe_interval)


def plan_study(spec: StudySpec, workload: Workload, tracker: StudyTracker, options: ExecutionOptions,
               device: str, train_size: int, curve_interval: int, unverified_data: str | None = None) -> StudyPlan:
    """Look the trials up in the store, order what is left, and lay it out over processes."""
    space = spec.search_space(workload)
    # A study that probes only its best trial trains (and shares) the plain study's trials.
    trained = spec.training_spec
    trials = [TrialSpec(trained, index, point) for index, point in enumerate(space.points(spec.trials))]
    reused = plan_reuse(trials, finished_trials(tracker.client, tracker.experiment_id, trained), options.full_trials)
    neighbour = neighbour_best_point(tracker.client, tracker.experiment_id, spec)
    to_train = order_trials([t for t in trials if t.index not in reused], workload,
                            neighbour[1] if neighbour else None)
    trial_order = f"nearest to the best trial at batch size {neighbour[0]}" if neighbour else "sobol"
    layout = resources.study_layout(resources.device_type(device), spec.batch_size, len(to_train), options.workers,
                                    options.threads, options.pack_size)
    schedule, held, warning = choose_schedule(spec, workload, len(to_train), options.schedule, device, train_size)
    run_settings = {"full_trials": options.full_trials, "device": device, "workers": layout.workers,
                    "threads_per_worker": layout.threads, "pack_size": layout.pack_size,
                    "early_abort_evaluation": options.early_abort_evaluation, "trial_order": trial_order,
                    "schedule": schedule.value, "held_bytes_per_trial": held, "allow_tf32": spec.allow_tf32,
                    "curve_interval": curve_interval}
    if unverified_data:  # a tag of the study run, as each setting (names.TAG_UNVERIFIED_DATA)
        run_settings["unverified_data"] = unverified_data
    return StudyPlan(trials, reused, to_train, layout, schedule, run_settings,
                     resources.describe_device(device, layout.threads), warning, model_size(workload))


def model_size(workload: Workload) -> tuple[int, int]:
    """(parameters, bytes) of the workload's network, every parameter counted (pruned ones too: data
    parallelism all-reduces dense gradients)."""
    parameters = list(workload.build_model().parameters())
    return sum(p.numel() for p in parameters), sum(p.numel() * p.element_size() for p in parameters)


def choose_schedule(spec: StudySpec, workload: Workload, trials_to_train: int, wanted: Schedule, device: str,
                    train_size: int) -> tuple[Schedule, int, str | None]:
    """The schedule, the bytes each trial holds between its turns, and a warning when breadth-first would
    not fit the memory budget (resources.breadth_first_fits) and the study falls back to depth-first."""
    parameters = sum(p.numel() for p in workload.build_model().parameters())
    held = resources.held_bytes_per_trial(parameters, spec.optimizer, spec.sparsity > 0, train_size)
    if wanted is Schedule.BREADTH_FIRST and not resources.breadth_first_fits(held * trials_to_train, device):
        return Schedule.DEPTH_FIRST, held, (
            f"warning: {trials_to_train} trials x {held} bytes held at once do not fit the memory budget on "
            f"{device}; training depth-first (same result, likely more trial-steps)")
    return wanted, held, None


def run_study(spec: StudySpec, options: ExecutionOptions, out: TextIO | None = None,
              on_trial: Callable[[str, int | None], None] | None = None,
              on_steps: Callable[[int, int], None] | None = None) -> StudyOutcome:
    """Plan, train and record one study; bad input fails before the store is touched. ``on_trial(status,
    steps_to_result)`` hears of every trial that ends, ``on_steps(trial_steps, furthest_step)`` of the steps."""
    out = out or sys.stdout
    started = time.perf_counter()
    spec, workload, device, data, unverified = _checked_inputs(spec, options)
    if unverified:
        print(f"warning: unverified data, recorded on every run: {unverified}", file=out, flush=True)
    # A trial that probes trains its whole run, as the original measures (docs/protocol.md).
    options = replace(options, full_trials=spec.full_trials(options.full_trials))
    settings = engine_settings(spec.training_spec, workload, data.validation_size, options)
    claimed = _claim(spec, options, out, started)
    if isinstance(claimed, StudyOutcome):
        return claimed
    tracker = claimed
    with abort_guard(tracker.owned, tracker.open_trial_runs, tracker.close):
        tracker.owned.start_heartbeat()
        if options.system_metrics:
            tracker.start_system_metrics()
        plan = plan_study(spec, workload, tracker, options, device, data.train_size, settings.curve_interval,
                          unverified)
        tracker.adopt(plan.reused.values())
        tracker.log_study_start(spec, plan.run_settings, reused=len(plan.reused))
        tracker.log_datasets(workload.dataset, {
            "training": (data.train_images.numpy(), data.train_labels.numpy()),
            "validation": (data.validation_images.numpy(), data.validation_labels.numpy())})
        _print_plan(spec, plan, tracker, device, options.full_trials, out)
        records, pruned = _train(spec, plan, data, settings, device, options, tracker, out, on_trial, on_steps)
        outcome = StudyOutcome.from_records(records, tracker.study_run_id, tracker.experiment_id,
                                            time.perf_counter() - started)
        probed = probed_trials(spec, outcome, workload, data, device, options, tracker, out, plan.device_description)
        scores = pruning_summary(pruned.values())
        tracker.record_outcome(spec, outcome, plan.run_settings, settings.goal_bounds, probed, plan.model_size,
                               scores)
        tracker.finish_study()
    _print_outcome(spec, outcome, scores if pruned else None, probed, tracker, out)
    return outcome


def _checked_inputs(spec: StudySpec, options: ExecutionOptions) -> tuple[StudySpec, Workload, str, DataSplits,
                                                                        str | None]:
    """The workload, the device and the data, each refused in one line when unusable; the spec fingerprinted; the
    data files that are not the published ones, when accepted (catalog.require_verified)."""
    workload = get_workload(spec.workload)
    spec.search_space(workload)
    if spec.parameterization is Parameterization.SUPAR:
        check_network(workload.build_model())
    device = str(resources.resolve_device(options.device))
    unverified = require_verified(workload.dataset, options.data_dir, options.accept_unverified_data) \
        if workload.needs_data_dir else None
    data = workload.load_checked(options.data_dir)
    fingerprint = splits_fingerprint(data)
    if spec.data_fingerprint is None:
        spec = replace(spec, data_fingerprint=fingerprint)
    elif spec.data_fingerprint != fingerprint:
        raise EdpsError(f"the {workload.name} data loaded here (fingerprint {fingerprint[:12]}) differ from the data "
                        f"this study was planned with ({spec.data_fingerprint[:12]}): use the same data directory")
    if spec.batch_size > data.train_size:
        raise EdpsError(f"batch size {spec.batch_size} exceeds the {data.train_size} training examples of "
                        f"{workload.name}")
    return spec, workload, device, data, unverified


def _claim(spec: StudySpec, options: ExecutionOptions, out: TextIO, started: float) -> StudyTracker | StudyOutcome:
    """Our study run, live, or the outcome of its finished run when the study is done. Never a second live run of
    one key (claim): a live run elsewhere stops us in one line, or is waited for (``options.wait``)."""
    # A sweep's study uses the store its sweep opened and checked: blips are retried, not refused at once.
    client: StoreClient = (connect(options.tracking_uri) if options.parent_run_id else
                           open_store(options.tracking_uri, writes=True))
    with store_errors(client):
        launcher = launcher_run(client, spec.study_key) if options.adopt_launcher_run else None
        # Under `mlflow run` the study goes to the experiment of the run it made for us.
        experiment_id = resolve_experiment(client, launcher.experiment_name if launcher else
                                           experiment_name_for(spec.workload, options.experiment),
                                           EXPERIMENT_DESCRIPTION)
        label = f"study {spec.study_key[:12]} ({spec.workload} {spec.optimizer} bs={spec.batch_size} " \
                f"sparsity={spec.sparsity:g}{pruned_by(spec)})"
        rules = ClaimRules(
            kind=KIND_STUDY, key=spec.study_key, label=label, on_live=OnLive.WAIT if options.wait else OnLive.REFUSE,
            finished=lambda: latest_finished_study(client, experiment_id, spec.study_key, options.full_trials)
            or (None if spec.goals else ladder_answer(client, experiment_id, spec.study_key, spec.goal_error,
                                                       options.full_trials)),
            clear_expired=True, own_run_id=launcher.run_id if launcher is not None and launcher.submitted else None,
            indexed=True)
        claimed = claim_launched(client, experiment_id, rules, lambda token, epoch, launched: create_study_run(
            client, experiment_id, spec, options.parent_run_id, options.sweep_key, launched, epoch=epoch),
                                 out, launcher)
    if claimed.done is not None:
        done = claimed.done
        where = "finished study run" if done.key == spec.study_key else \
            f"goal ladder {done.key[:12]}, whose rung {spec.goal_error:g} is this study: its finished run"
        result = "no trial reached the goal" if done.steps_to_result is None else \
            f"steps_to_result = {done.steps_to_result}"
        print(f"study already done: {result} in the {where} {done.run_id}; nothing to train", file=out, flush=True)
        return StudyOutcome(done.run_id, experiment_id, done.steps_to_result, {}, 0, 0, 0,
                            time.perf_counter() - started)
    assert claimed.owned is not None  # a study never watches (OnLive.WATCH)
    return StudyTracker(client, experiment_id, claimed.owned, options.sweep_key, spec.study_key)


class _Recorder:
    """Receives engine events in this process and forwards them to MLflow and the progress line."""

    def __init__(self, tracker: StudyTracker, trials: dict[int, TrialSpec], progress: StudyProgress,
                 device: str, unverified_data: str | None = None) -> None:
        self.tracker, self.trials, self.progress, self.device = tracker, trials, progress, device
        self.unverified_data = unverified_data
        self.records: dict[int, TrialRecord] = {}
        self.pruning: dict[int, PruningRecord] = {}  # how each trial trained here was pruned

    def trial_started(self, trial_index: int, mask: Mask | None, pruning: PruningRecord | None = None) -> None:
        self.tracker.start_trial(self.trials[trial_index], mask, pruning)
        if self.unverified_data:
            self.tracker.client.set_tag(self.tracker.trial_runs[trial_index], n.TAG_UNVERIFIED_DATA,
                                        self.unverified_data)
        if pruning is not None:
            self.pruning[trial_index] = pruning
        self.progress.trial_started(trial_index)

    def on_check(self, trial_index: int, check: Check) -> None:
        self.tracker.log_check(trial_index, check)
        self.progress.check(trial_index, check.step, check.validation_error)

    def on_probe(self, trial_index: int, step: int, values: dict[str, float]) -> None:
        self.tracker.log_probe(trial_index, step, values)

    def on_finish(self, result: TrialResult) -> None:
        run_id = self.tracker.finish_trial(result, self.device)
        timed = result.seconds_per_step is not None
        self.records[result.index] = TrialRecord(
            trial=self.trials[result.index], status=result.status, steps_to_result=result.steps_to_result,
            steps_trained=result.steps_trained, best_validation_error=result.best_validation_error,
            run_id=run_id, reused=False, seconds=result.seconds, probe_seconds=result.probe_seconds,
            seconds_per_step=result.seconds_per_step, pack_size=result.pack_size if timed else None,
            device=self.device if timed else None, goal_steps=result.goal_steps)
        self.progress.trial_finished(result.index, result.status.value, result.steps_to_result,
                                     result.steps_trained)


def _train(spec: StudySpec, plan: StudyPlan, data: DataSplits, settings: EngineSettings, device: str,
           options: ExecutionOptions, tracker: StudyTracker, out: TextIO,
           on_trial: Callable[[str, int | None], None] | None = None,
           on_steps: Callable[[int, int], None] | None = None
           ) -> tuple[dict[int, TrialRecord], dict[int, PruningRecord]]:
    """Train the plan's chunks here or in worker processes; every trial's record (reused ones too), and how each
    trial trained here was pruned."""
    progress = StudyProgress(len(plan.to_train), stream=out, log_interval=options.log_interval, on_trial=on_trial,
                             on_steps=on_steps)
    recorder = _Recorder(tracker, {t.index: t for t in plan.trials}, progress, plan.device_description,
                         plan.run_settings.get("unverified_data"))
    job = TrainingJob(spec=spec.training_spec, points=tuple(t.metaparameters for t in plan.trials), settings=settings,
                      data_dir=options.data_dir, device=device, threads=plan.layout.threads,
                      exact_early_stopping=not options.full_trials, schedule=plan.schedule,
                      score_cache=default_score_cache())
    best_known = None if options.full_trials else best_reached_step((s.status, s.steps_to_result)
                                                                    for s in plan.reused.values())
    if plan.chunks and plan.layout.workers == 1:
        bound = LocalStepBound(settings.max_steps, settings.check_interval, not options.full_trials, best_known)
        train_inline(job, plan.chunks, data.to(device), bound, recorder)
    elif plan.chunks:
        train_in_workers(job, plan.chunks, plan.layout.workers, best_known, recorder)
    progress.close()
    reused = {index: TrialRecord(
        trial=plan.trials[index], status=stored.status, steps_to_result=stored.steps_to_result,
        steps_trained=stored.steps_trained, best_validation_error=stored.best_validation_error, run_id=stored.run_id,
        reused=True, seconds_per_step=stored.seconds_per_step, pack_size=stored.pack_size, device=stored.device,
        goal_steps=stored.goal_steps)
        for index, stored in plan.reused.items()}
    return {**recorder.records, **reused}, dict(recorder.pruning)


def probed_trials(spec: StudySpec, outcome: StudyOutcome, workload: Workload, data: DataSplits, device: str,
                  options: ExecutionOptions, tracker: StudyTracker, out: TextIO,
                  device_description: str) -> ProbedTrials | None:
    """Which trials carried the probes. A study that probes its best trial only trains it again with the probes, to
    its goal, as a nested trial run: the trial of the all-trials study of the same key (``spec.probe_spec``), so
    either study reuses the other's. Probes never touch the training state: a different step is reported."""
    best = outcome.best_record()
    if not spec.probes:
        return None
    if not spec.probes_best_only:
        return ProbedTrials("all", best.trial.index if best else None, best.run_id if best else None)
    if best is None:
        print("probes: no trial reached the goal, so there is no best trial to probe", file=out, flush=True)
        return ProbedTrials("best", None, None)
    probe_spec = spec.probe_spec
    points = spec.search_space(workload).points(spec.trials)
    trials = [TrialSpec(probe_spec, index, point) for index, point in enumerate(points)]
    trial = trials[best.trial.index]
    stored = finished_trials(tracker.client, tracker.experiment_id, probe_spec).get(trial.trial_key)
    if stored is not None and stored.status is best.status:
        print(f"probes: the best trial (trial {trial.index}) was already probed along its run: run "
              f"{stored.run_id}", file=out, flush=True)
        return ProbedTrials("best", trial.index, stored.run_id, reused=True)
    print(f"probes: training the best trial (trial {trial.index}) again with {', '.join(probe_spec.probes)} "
          f"every {probe_spec.probe_interval} steps, to its goal", file=out, flush=True)
    # Alone, in this process, to its own end.
    plan = StudyPlan(trials, {}, [trial], resources.WorkerLayout(1, options.threads or resources.available_cores(), 1),
                     Schedule.DEPTH_FIRST, {}, device_description)
    records, _ = _train(probe_spec, plan, data, engine_settings(probe_spec, workload, data.validation_size, options),
                        device, replace(options, full_trials=True), tracker, out)
    record = records[trial.index]
    if (record.status, record.steps_to_result) != (best.status, best.steps_to_result):
        print(f"warning: the probed run of trial {trial.index} ended {record.status.value} at "
              f"{record.steps_to_result} steps, the unprobed run {best.status.value} at {best.steps_to_result} "
              f"(the device is not deterministic?)", file=out, flush=True)
    return ProbedTrials("best", trial.index, record.run_id, probe_seconds=record.probe_seconds)


def _print_plan(spec: StudySpec, plan: StudyPlan, tracker: StudyTracker, device: str, full_trials: bool,
                out: TextIO) -> None:
    layout = plan.layout
    print(f"study {spec.workload} {spec.optimizer} bs={spec.batch_size} sparsity={spec.sparsity:g}"
          f"{pruned_by(spec)} goal{'s' if spec.goals else ''}={n.goals_text(spec.ladder)}: {len(plan.trials)} trials, run {tracker.study_run_id} in "
          f"experiment {tracker.experiment_id}; artifacts under {tracker.artifact_location()}", file=out)
    if plan.reused:
        print(f"reusing {len(plan.reused)} finished trials from earlier runs (same trial keys); training "
              f"{len(plan.to_train)}", file=out)
    if plan.warning:
        print(plan.warning, file=out)
    print(f"training {len(plan.to_train)} trials on {device} in {len(plan.chunks)} chunks of up to "
          f"{layout.pack_size}, {layout.workers} worker(s) x {layout.threads} thread(s), "
          f"{'full trials' if full_trials else 'exact early stopping'}, {plan.schedule.value.replace('_', '-')} "
          f"({plan.run_settings['held_bytes_per_trial']} bytes held per trial), trial order: "
          f"{plan.run_settings['trial_order']}", file=out, flush=True)


def _print_outcome(spec: StudySpec, outcome: StudyOutcome, scores: dict[str, Any] | None,
                   probed: ProbedTrials | None, tracker: StudyTracker, out: TextIO) -> None:
    """The result, what the pruning scores cost (``scores``: when any trial was pruned here), the probes, the page."""
    counts = ", ".join(f"{status.value} {outcome.count(status)}" for status in TrialStatus)
    best = outcome.best_record()
    if best is None:
        head = "no trial reached the goal: no steps_to_result"
    else:
        values = ", ".join(f"{k}={v:.4g}" for k, v in best.trial.metaparameters.items())
        head = f"steps_to_result = {outcome.steps_to_result} (trial {best.trial.index}: {values})"
    ladder = goals_sentence(spec, goal_results(spec, outcome.records), get_workload(spec.workload).goal_words)
    print(f"{head}\n{ladder + chr(10) if ladder else ''}{counts}; reused {outcome.reused}, trained {outcome.trained} "
          f"({outcome.trial_steps} trial-steps) in {outcome.seconds:.1f} s; study run {outcome.study_run_id}",
          file=out, flush=True)
    if scores is not None and spec.sparsity > 0:
        print(f"pruning scores ({spec.pruning}): {scores['computed']} computed, {scores['cached']} from the score "
              f"cache, {scores['seconds']:.1f} s spent, {scores['seconds_saved']:.1f} s saved", file=out, flush=True)
    if probed is not None:
        print(probed.sentence(), file=out, flush=True)
    print(ui_link(str(tracker.client.tracking_uri), tracker.experiment_id, tracker.study_run_id), file=out, flush=True)
