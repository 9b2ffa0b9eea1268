"""A sweep: the grid of studies batch sizes x sparsities x optimizers x pruning methods of one workload.

    edps sweep --workload digits-simple-cnn --batch-sizes 2..1024 --sparsities 0,0.5,0.9
    edps sweep ... --executor ray --ray-address auto

The tracking store is the registry: the sweep plans every study as done, partly done (its finished trials
are reused) or to do, and an executor (executors/) runs the rest, so that a killed sweep started again
finishes the grid with nothing finished trained twice (docs/sweeps.md).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Callable, TextIO, TypeVar

import numpy as np

from analysis.replicates import point_value
from edps_mlflow.config import StudySpec
from edps_mlflow.curves import CurveId
from edps_mlflow.descriptions import EXPERIMENT_DESCRIPTION, markdown_table
from edps_mlflow.errors import EdpsError
from edps_mlflow.executors import get_executor
from edps_mlflow.executors.base import Executor, SweepRun, study_label
from edps_mlflow.names import KIND_SWEEP, goals_text
from edps_mlflow.process_settings import launcher_run_id
from edps_mlflow.progress import SweepProgress, SweepStudy
from edps_mlflow.parameterization import Parameterization
from edps_mlflow.pruning import DEFAULT_METHOD
from edps_mlflow.resources import cuda_devices
from edps_mlflow.results import RunState, StudyReport
from edps_mlflow.store.client import open_store, ui_link
from edps_mlflow.store.experiment import experiment_name_for, resolve_experiment
from edps_mlflow.store.ownership.claim import ClaimRules, OnLive, claim_launched, clear_expired, launcher_run
from edps_mlflow.store.ownership.lease import abort_guard, lease_seconds
from edps_mlflow.store.read.runs import (LeasedRun, latest_finished_study, planned_trial_counts, stored_studies,
                                         study_runs, study_views, sweep_runs)
from edps_mlflow.store.trouble import store_errors
from edps_mlflow.store.write.sweep import SweepTracker, create_sweep_run
from edps_mlflow.sweep_charts import SweepCurves, goal_steps

# The grid and the options, torch-free to import (the CLI validates with them first); re-exported here.
from edps_mlflow.sweep_spec import SweepOptions, SweepSpec
from edps_mlflow.uris import redact_uri
from edps_mlflow.workloads import get_workload

_R = TypeVar("_R")  # what a complete sweep answers (open_sweep)


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
    rungs: dict[float, int | None] | None = None  # a done goal ladder's steps-to-result per rung


def plan_studies(client: Any, experiment_id: str, workload: str, studies: list[StudySpec],
                 full_trials: bool, views: list[Any] | None = None) -> list[PlannedStudy]:
    """Each of ``studies``: done (a finished study run in the same early-stopping mode, or a finished goal ladder
    with a rung that answers it), partly done (finished trials to reuse) or to do. ``views``: the experiment's
    study runs (study_views) just read."""
    stored = study_runs(client, experiment_id, workload, lease_seconds(), views)
    finished = {(s.study_key, s.full_trials): s for run in stored if run.finished for s in run.answers()}
    # Only a study with a study run has trial runs (they are made under it): count those not done (a few).
    started = {s.study_key for s in stored}
    trial_counts = planned_trial_counts(client, experiment_id, stored, [
        s.study_key for s in studies
        if s.study_key in started and (s.study_key, s.full_trials(full_trials)) not in finished])
    plan = []
    for study in studies:
        key = study.study_key
        # A study whose every trial probes trains whole runs whatever the sweep's mode (StudySpec.full_trials).
        done = finished.get((key, study.full_trials(full_trials)))
        if done is not None:
            plan.append(PlannedStudy(study, PlanState.DONE, study.trials, done.steps_to_result,
                                     {r.goal: r.steps_to_result for r in done.rungs}))
        elif trial_counts.get(key):
            plan.append(PlannedStudy(study, PlanState.PARTIAL, trial_counts[key], None))
        else:
            plan.append(PlannedStudy(study, PlanState.TODO, 0, None))
    return plan


def prepare(spec: SweepSpec, options: SweepOptions) -> SweepSpec:
    """Refuse missing data, a missing device or what the executor lacks, before any work; the grid with
    its data's fingerprint, which its keys need (cached per file set: no reload next time)."""
    workload = get_workload(spec.workload)
    workload.require_data(options.data_dir)
    if workload.needs_data_dir:
        from edps_mlflow.data.catalog import require_verified

        require_verified(workload.dataset, options.data_dir, options.accept_unverified_data)
    if options.device is not None:  # no device asked for: nothing to refuse, and torch stays unloaded
        cuda_devices(options.device, indexed=False)
    if Parameterization.SUPAR in spec.parameterizations:
        from edps_mlflow.supar import check_network  # torch, for a supar sweep only: the others stay without it

        check_network(workload.build_model())
    if spec.protocol.data_fingerprint is None:
        fingerprint = workload.data_fingerprint(options.data_dir)
        spec = replace(spec, protocol=replace(spec.protocol, data_fingerprint=fingerprint))
    get_executor(options.executor)().check(spec, options)
    return spec


def run_sweep(spec: SweepSpec, options: SweepOptions, out: TextIO | None = None) -> dict[str, int | None]:
    """Plan against the registry, run what is missing, return study_key -> steps_to_result."""
    out = out or sys.stdout
    spec = prepare(spec, options)
    sweep = open_sweep(spec, options, out, complete=lambda done: _complete(spec, options, done, out))
    if not isinstance(sweep, SweepRun):
        return sweep
    with abort_guard(sweep.tracker.owned):
        plan = _plan(spec, options, sweep, out)
        curves = SweepCurves(spec.studies())
        chart_plan(sweep, curves, plan)
        pending = [p.spec for p in plan if p.state is not PlanState.DONE]
        progress = sweep_progress(plan, out, options.log_interval,
                                  lambda report: chart_study(sweep, curves, options.full_trials, report))
        if pending:
            dispatch(pending, options, sweep, progress, out)
        return _finish(spec, options, sweep, progress, out, curves)


@dataclass(frozen=True)
class FinishedSweep:
    """The finished run(s) of a sweep key, and the store and experiment they are in."""

    client: Any
    experiment_id: str
    runs: list[LeasedRun]
    studies: list[Any]  # the experiment's study runs (study_views), read to find the sweep runs


def finished_sweep(workload: str, experiment: str | None, sweep_key: str) -> FinishedSweep | None:
    """The sweep runs of ``sweep_key`` when all (and some) have finished; None otherwise, or under `mlflow run`."""
    if launcher_run_id():
        return None
    client = open_store(writes=True)
    with store_errors(client):
        found = client.get_experiment_by_name(experiment_name_for(workload, experiment))
        if found is None:
            return None
        studies = study_views(client, found.experiment_id)
        runs = sweep_runs(client, found.experiment_id, sweep_key, studies)
    if not runs or not all(r.state is RunState.FINISHED for r in runs):
        return None
    return FinishedSweep(client, found.experiment_id, runs, studies)


def _complete(spec: SweepSpec, options: SweepOptions, done: FinishedSweep,
              out: TextIO) -> dict[str, int | None] | None:
    """The results of a sweep whose runs finished (``done``) and whose every study is done, said on ``out``; None
    when anything is to do."""
    client, runs = done.client, done.runs
    with store_errors(client):
        plan = plan_studies(client, done.experiment_id, spec.workload, spec.studies(), options.full_trials,
                            done.studies)
    if any(p.state is not PlanState.DONE for p in plan):
        return None
    print(f"sweep {spec.sweep_key[:12]} ({spec.workload}) already complete: {len(plan)} studies done in sweep run "
          f"{runs[-1].run_id}; nothing to train", file=out)
    print(ui_link(str(client.tracking_uri), done.experiment_id, runs[-1].run_id, charts=True), file=out, flush=True)
    return {p.spec.study_key: p.steps_to_result for p in plan}


def open_sweep(spec: SweepSpec, options: SweepOptions, out: TextIO, complete: Callable[[FinishedSweep], _R | None],
               key: str | None = None, name: str | None = None) -> SweepRun | _R:
    """The sweep's run, live and ours (claim): its earlier run when that owner is gone, else a new one; or
    ``complete(finished)``, the result of the sweep when its runs have finished and it is complete: then nothing
    is written (a sweep woken after another finished it never takes that run over). ``key`` and ``name``: another
    sweep key and run name than the grid's (an adaptive sweep's)."""
    client = open_store(writes=True)
    key = key or spec.sweep_key
    results: list[_R] = []

    def finished() -> LeasedRun | None:
        done = finished_sweep(spec.workload, options.experiment, key)
        result = complete(done) if done is not None else None
        if result is None:
            return None
        results.append(result)
        return done.runs[-1]

    name = name or f"sweep {spec.workload} {len(spec.studies())} studies"
    with store_errors(client):
        launched = launcher_run(client)
        # Under `mlflow run` the sweep goes to the experiment of the run it made for us.
        experiment_name = launched.experiment_name if launched else experiment_name_for(spec.workload,
                                                                                           options.experiment)
        experiment_id = resolve_experiment(client, experiment_name, EXPERIMENT_DESCRIPTION)
        rules = ClaimRules(kind=KIND_SWEEP, key=key, label=f"sweep {key[:12]} ({spec.workload})",
                           on_live=OnLive.WAIT if options.wait else OnLive.REFUSE, finished=finished, resume=True,
                           tokens=True)
        claimed = claim_launched(client, experiment_id, rules, lambda token, epoch, launcher_run_id: create_sweep_run(
            client, experiment_id, name, key, spec.workload, token, launcher_run_id), out, launched)
    if claimed.done is not None:
        return results[-1]
    assert claimed.owned is not None  # a sweep never watches
    claimed.owned.start_heartbeat()
    return SweepRun(client, client.tracking_uri, experiment_name, experiment_id,
                    SweepTracker(client, experiment_id, claimed.owned), key)


def _plan(spec: SweepSpec, options: SweepOptions, sweep: SweepRun, out: TextIO) -> list[PlannedStudy]:
    """Clean up after killed processes, plan against the store, and say so."""
    # Only runs of dead processes: a live study of another sweep or a lone study keeps running.
    stale = clear_expired(sweep.client, sweep.experiment_id, lease_seconds())
    plan = plan_studies(sweep.client, sweep.experiment_id, spec.workload, spec.studies(), options.full_trials)
    counts = {state: sum(1 for p in plan if p.state is state) for state in PlanState}
    sweep.tracker.log_start({**spec.params(), "full_trials": options.full_trials}, {
        "studies": len(plan), "done": counts[PlanState.DONE], "partial": counts[PlanState.PARTIAL],
        "todo": counts[PlanState.TODO]})
    print(f"sweep {spec.sweep_key[:12]} ({spec.workload}): {len(plan)} studies{replicates_words(spec)}, run "
          f"{sweep.tracker.run_id} in "
          f"experiment {sweep.experiment_name!r} at {redact_uri(sweep.tracking_uri)}; artifacts under "
          f"{redact_uri(sweep.client.get_experiment(sweep.experiment_id).artifact_location)}", file=out)
    if stale:
        print(f"marked {stale} runs left RUNNING by a dead process (lease expired) as FAILED", file=out)
    print(f"plan: {counts[PlanState.DONE]} done, {counts[PlanState.PARTIAL]} partly done "
          f"(finished trials are reused), {counts[PlanState.TODO]} to do", file=out, flush=True)
    for item in plan:
        if item.state is PlanState.PARTIAL:
            print(f"  partly done: {study_label(item.spec)} ({item.finished_trials}/{item.spec.trials} trials)",
                  file=out)
    return plan


def sweep_description(spec: SweepSpec, plan: list[PlannedStudy]) -> str:
    """The sweep run's description: its steps-to-result, a Markdown table per optimizer, pruning method and
    parameterisation."""
    p = spec.protocol
    goal = f"goals {goals_text(p.goals)} (the table: the hardest)" if p.goals else \
        f"goal {p.goal_error:g}"
    each = "" if spec.replicates == 1 else (
        " A point's value is the geometric mean of its replicates that reached, where more than half reached "
        "(reached/replicates beside it).")
    parts = [f"Sweep of {spec.workload}: {len(plan)} studies{replicates_words(spec)}, {p.trials} trials each, "
             f"{goal}, a check every {p.check_interval} steps, cap {p.max_steps}. Steps-to-result ('-': no trial "
             f"reached the goal); each study is a child run.{each}"]
    steps: dict[tuple, list[int | None]] = {}
    for s in plan:
        steps.setdefault((s.spec.optimizer, s.spec.sparsity, s.spec.pruning, s.spec.parameterization,
                          s.spec.batch_size), []).append(s.steps_to_result)
    header = ["batch size", *(f"sparsity {s:g}" for s in spec.sparsities)]
    dense = (DEFAULT_METHOD, Parameterization.SP)  # the dense study's spelling (StudySpec): every table's sparsity 0
    for optimizer, pruning, form in ((o, m, f) for o in spec.optimizers for m in spec.prunings
                                     for f in spec.parameterizations):
        rows = [[b, *(_point_cell(steps.get((optimizer, s, *((pruning, form) if s > 0 else dense), b), []))
                      for s in spec.sparsities)] for b in spec.batch_sizes]
        title = optimizer + (f", pruned by {pruning}" if spec.prunings != (DEFAULT_METHOD,) else "") + \
            (f", {form.value}" if spec.parameterizations != (Parameterization.SP,) else "")
        parts.append(f"**{title}**\n\n{markdown_table(header, rows)}")
    return "\n\n".join(parts)


def replicates_words(spec: SweepSpec) -> str:
    """`` (3 points x 2 replicates, seeds 0..1)``; nothing for one replicate."""
    if spec.replicates == 1:
        return ""
    points = len(spec.studies()) // spec.replicates
    return (f" ({points} point{'s' if points > 1 else ''} x {spec.replicates} replicates, seeds "
            f"{spec.seeds[0]}..{spec.seeds[-1]})")


def _point_cell(steps: list[int | None]) -> str | int:
    """A point's steps-to-result: its study's, or over its replicates their value (analysis.replicates)."""
    if len(steps) <= 1:
        return (steps[0] if steps else None) or "-"
    value = point_value(np.array([np.inf if s is None else s for s in steps], dtype=float))
    reached = sum(s is not None for s in steps)
    return f"{'-' if np.isnan(value) else f'{value:.0f}'} ({reached}/{len(steps)})"


def sweep_progress(plan: list[PlannedStudy], out: TextIO, interval: float,
                   on_study: Callable[[StudyReport], None] | None = None) -> SweepProgress:
    """The progress line of the plan's studies still to train, with the results of those already done;
    ``on_study``: told of each study that finishes."""
    pending = [p for p in plan if p.state is not PlanState.DONE]
    studies = [SweepStudy(study_label(p.spec), f"{p.spec.workload} {CurveId.of(p.spec).label()}",
                          p.spec.batch_size, 0 if p.state is PlanState.DONE else p.spec.trials - p.finished_trials,
                          p.spec.max_steps, p.steps_to_result) for p in plan]
    # Finished trials of partly done studies are reused, not trained.
    trials = sum(max(0, p.spec.trials - p.finished_trials) for p in pending)
    return SweepProgress(len(plan), len(plan) - len(pending), trials, out, interval, studies, on_study)


def chart_plan(sweep: SweepRun, curves: SweepCurves, plan: list[PlannedStudy]) -> None:
    """Chart on the sweep run the points that the plan's done studies complete (sweep_charts)."""
    sweep.tracker.log_curve_points([value for p in plan if p.state is PlanState.DONE for value in curves.finished(
        p.spec.study_key, goal_steps(p.spec, p.steps_to_result, p.rungs))])


def chart_study(sweep: SweepRun, curves: SweepCurves, full_trials: bool, report: StudyReport) -> None:
    """Chart the point that a study just finished completes; a ladder's rungs are read from its study run."""
    spec = curves.specs.get(report.study_key)
    if spec is None:
        return
    rungs = None
    if spec.goals:
        with store_errors(sweep.client):
            done = latest_finished_study(sweep.client, sweep.experiment_id, spec.study_key,
                                         spec.full_trials(full_trials))
            if done is None:  # answered by another run: the final plan charts it
                return
            stored = stored_studies([sweep.client.get_run(done.run_id)], lease_seconds())
        rungs = {r.goal: r.steps_to_result for study in stored for r in study.rungs}
    sweep.tracker.log_curve_points(curves.finished(spec.study_key, goal_steps(spec, report.steps_to_result, rungs)))


def dispatch(pending: list[StudySpec], options: SweepOptions, sweep: SweepRun, progress: SweepProgress,
             out: TextIO, executor: Executor | None = None) -> None:
    """Run the pending studies on the chosen executor (``executor``: an instance the caller holds a session
    of); one line naming the studies that failed once the others are done."""
    # The first replicate of every point first (a sweep stopped early has whole curves); within one, large batches
    # first: they dominate the cost, so starting them early shortens the tail.
    pending = sorted(pending, key=lambda s: (s.seed, -s.batch_size))
    executor = executor if executor is not None else get_executor(options.executor)()
    failures = executor.run(pending, sweep, options, progress, out)
    if failures:
        raise EdpsError(f"{len(failures)} of {len(pending)} studies failed (reported above; first: {failures[0]}); "
                        f"run the same command again to retry them: finished trials and studies are reused")


def _finish(spec: SweepSpec, options: SweepOptions, sweep: SweepRun, progress: SweepProgress,
            out: TextIO, curves: SweepCurves) -> dict[str, int | None]:
    """Check the grid in the store, close the sweep run and return its results."""
    progress.close()
    final = plan_studies(sweep.client, sweep.experiment_id, spec.workload, spec.studies(), options.full_trials)
    missing = [p for p in final if p.state is not PlanState.DONE]
    if missing:
        raise RuntimeError(f"{len(missing)} studies did not finish")
    results = {p.spec.study_key: p.steps_to_result for p in final}
    chart_plan(sweep, curves, final)  # studies that another process finished meanwhile
    sweep.tracker.finish(len(final), sum(1 for v in results.values() if v is not None),
                         time.monotonic() - progress.started, sweep_description(spec, final), curves.fit_metrics())
    print(f"sweep {spec.sweep_key[:12]} complete: {len(final)} studies; `edps status --experiment "
          f"{sweep.experiment_name}` shows the grid", file=out)
    print(ui_link(sweep.tracking_uri, sweep.experiment_id, sweep.run_id, charts=True), file=out, flush=True)
    return results
