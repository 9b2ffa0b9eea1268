"""An adaptive sweep: measure the largest batch sizes of the range, then round by round walk each curve
down as far as its question needs (adaptive.py has the rule; docs/adaptive.md the whole story).

    edps sweep --adaptive --workload digits-simple-cnn --sparsities 0,0.5 --target threshold --budget 30m

Every point is an ordinary study run by the sweep's executor, a round as wide as its workers. It keeps no state
of its own: the rule is deterministic, so a rerun replays the decisions from the studies in the store and trains
only what is missing. The decisions go into the sweep run's ``adaptive_decisions.csv`` and description.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, TextIO

import pandas as pd

from analysis.intervals import BASIS_SOME, some_points_words
from analysis.replicates import MIN_REPLICATES
from edps_mlflow import adaptive
from edps_mlflow import names as n
from edps_mlflow.config import StudySpec, content_key
from edps_mlflow.curves import CurveId
from edps_mlflow.descriptions import markdown_table
from edps_mlflow.errors import EdpsError
from edps_mlflow.executors import get_executor
from edps_mlflow.executors.base import executor_session
from edps_mlflow.results import TrialOutcome
from edps_mlflow.store.client import ui_link
from edps_mlflow.store.ownership.claim import clear_expired
from edps_mlflow.store.ownership.lease import abort_guard, lease_seconds
from edps_mlflow.store.read.runs import StoredStudy, study_runs, study_views
from edps_mlflow.store.read.trials import study_trial_outcomes
from edps_mlflow.store.trouble import store_errors
from edps_mlflow.sweep import (FinishedSweep, PlanState, SweepOptions, SweepRun, SweepSpec, dispatch, open_sweep,
                               plan_studies, prepare, sweep_progress)
from edps_mlflow.uris import redact_uri
from edps_mlflow.workloads import get_workload


@dataclass(frozen=True)
class AdaptiveSweepSpec:
    """An adaptive sweep: ``grid`` gives the protocol, curves and batch-size range (powers of two, extended up to
    the training split's size), ``settings`` what it pins and when it stops."""

    grid: SweepSpec
    settings: adaptive.AdaptiveSettings

    def __post_init__(self) -> None:
        odd = [b for b in self.grid.batch_sizes if b not in self.range]  # every power of two between the ends
        if odd:
            raise EdpsError(f"an adaptive sweep measures powers of two: batch size {odd[0]} is not one "
                            f"(give the range, e.g. --batch-sizes 2..1024)")
        first = len(self.start) * len(self.curves)
        if self.settings.max_studies is not None and self.settings.max_studies < first:
            raise EdpsError(f"--max-studies {self.settings.max_studies} is smaller than the start "
                            f"({len(self.start)} batch sizes x {len(self.curves)} curves = {first} studies)")

    @property
    def workload(self) -> str:
        return self.grid.workload

    @property
    def range(self) -> tuple[int, ...]:
        """Every power of two between the smallest and the largest batch size given."""
        return adaptive.powers_of_two(min(self.grid.batch_sizes), max(self.grid.batch_sizes))

    @property
    def start(self) -> tuple[int, ...]:
        return adaptive.start_grid(self.range)

    @property
    def candidates(self) -> tuple[int, ...]:
        """The batch sizes a round may choose: the range, extended up to the training split."""
        largest = max(get_workload(self.workload).largest_batch_size(), max(self.grid.batch_sizes))
        return adaptive.powers_of_two(min(self.grid.batch_sizes), largest)

    @property
    def curves(self) -> list[CurveId]:
        return list(dict.fromkeys(CurveId.of(study) for study in self.grid.studies()))  # once, whatever the seeds

    @property
    def rungs(self) -> list[tuple[int | None, float | None]]:
        """The curves' rungs (index, goal): each a curve of its own; one, (None, None), without a ladder."""
        return list(enumerate(self.grid.protocol.goals)) or [(None, None)]

    def study(self, curve: CurveId, batch_size: int, seed: int | None = None) -> StudySpec:
        """A point's study: replicate 0 (the protocol's seed) unless ``seed`` says another."""
        return replace(self.grid.protocol, **curve.as_dict(), batch_size=batch_size,
                       seed=self.grid.protocol.seed if seed is None else seed)

    @property
    def sweep_key(self) -> str:
        range_spec = replace(self.grid, batch_sizes=self.range)
        return content_key({"kind": "adaptive-sweep", "grid": range_spec.sweep_key, **self.settings.key_fields()})

    def params(self) -> dict[str, Any]:
        return {**replace(self.grid, batch_sizes=self.range).params(), "adaptive": True,
                "target": self.settings.target_text(), "width": self.settings.width,
                "max_studies": self.settings.max_studies or "",
                "budget": self.settings.budget.text() if self.settings.budget else ""}


@dataclass(frozen=True)
class MeasuredStudy:
    spec: StudySpec
    run_id: str
    steps_to_result: int | None
    trials: tuple[TrialOutcome, ...]
    # A ladder's: each rung's steps-to-result and trials as a one-goal study of it has them, easiest first.
    rungs: tuple[tuple[int | None, tuple[TrialOutcome, ...]], ...] = ()

    def rung(self, index: int | None) -> tuple[int | None, tuple[TrialOutcome, ...]]:
        return (self.steps_to_result, self.trials) if index is None else self.rungs[index]

    @property
    def trial_steps(self) -> int:
        return sum(t.steps_trained for t in self.trials)


@dataclass(frozen=True)
class AdaptiveResult:
    stop: adaptive.StopReason
    states: tuple[adaptive.CurveState, ...]
    measured: tuple[MeasuredStudy, ...]
    decisions: pd.DataFrame
    rounds: int

    @property
    def trial_steps(self) -> int:
        return sum(m.trial_steps for m in self.measured)

    def uncertain(self) -> list[str]:
        return adaptive.uncertain(self.states)


# measure(studies) -> the measured studies by key, or None when one of them is not done (a replay).
Measure = Callable[[list[StudySpec]], "dict[str, MeasuredStudy] | None"]


def curve_tables(curve: CurveId, measured: dict[str, MeasuredStudy],
                 rung: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The analysis' study table and trial table of one curve's measured studies (at one rung of a ladder)."""
    mine = [m for m in measured.values() if CurveId.of(m.spec) == curve]
    points = pd.DataFrame([{**curve.as_dict(), "batch_size": m.spec.batch_size, "seed": m.spec.seed,
                            "steps_to_result": m.rung(rung)[0], "study_key": m.spec.study_key} for m in mine])
    points["steps_to_result"] = pd.to_numeric(points["steps_to_result"], errors="coerce")
    trials = pd.DataFrame([{"study_key": m.spec.study_key, "trial_index": t.trial_index, "status": t.status.value,
                            "steps_to_result": t.steps_to_result, "steps_trained": t.steps_trained}
                           for m in mine for t in m.rung(rung)[1]],
                          columns=["study_key", "trial_index", "status", "steps_to_result", "steps_trained"])
    return points, trials


def adapt(spec: AdaptiveSweepSpec, measure: Measure, clock: Callable[[], float],
          announce: Callable[[int, list[str]], None] = lambda round_index, lines: None) -> AdaptiveResult | None:
    """The rounds: the start, then the decisions of adaptive.decide until it stops. None when ``measure``
    found a study not done (a read-only replay)."""
    seeds, replicated = tuple(spec.grid.seeds), spec.grid.replicates > 1
    rows = adaptive.start_rows(spec.curves, spec.start, seeds[0])
    chosen = [spec.study(curve, b) for curve in spec.curves for b in spec.start]
    announce(0, [f"start at batch sizes {', '.join(map(str, spec.start))} for {len(spec.curves)} curve(s)"])
    measured: dict[str, MeasuredStudy] = {}
    round_index = 0
    while True:
        found = measure([s for s in chosen if s.study_key not in measured])
        if found is None:
            return None
        measured.update(found)
        states = [adaptive.assess_curve(curve, *curve_tables(curve, measured, rung), spec.candidates, spec.settings,
                                        goal, seeds) for curve in spec.curves for rung, goal in spec.rungs]
        studies, steps = len(measured), sum(m.trial_steps for m in measured.values())
        round_index += 1
        decision = adaptive.decide(states, studies, steps, clock(), spec.settings, spec.candidates)
        rows.extend(adaptive.decision_rows(round_index, decision, studies, steps))
        if decision.stop is not None:
            # Integer columns stay integers in the CSV although stop rows have no batch size.
            table = pd.DataFrame(rows, columns=adaptive.decision_columns(bool(spec.grid.protocol.goals), replicated))
            table = table.astype({"batch_size": "Int64", **({"seed": "Int64"} if replicated else {})})
            return AdaptiveResult(decision.stop, tuple(states), tuple(measured.values()), table, round_index)
        announce(round_index, [f"{p.curve.label()} measures bs {p.batch_size}"
                               + (f" seed {p.seed}" if replicated else "") + f": {p.reason.value} ({p.uncertainty})"
                               for p in decision.picks])
        chosen = [spec.study(p.curve, p.batch_size, p.seed) for p in decision.picks]


def _read(client: Any, experiment_id: str, studies: list[StudySpec], full_trials: bool,
          cache: dict[str, MeasuredStudy], views: list[Any] | None = None) -> dict[str, MeasuredStudy] | None:
    """The finished runs of ``studies`` with their trials (None when one is not done), from one read of the
    workload's study runs (or ``views``, as study_views read them since the last change)."""
    missing = [study for study in studies if study.study_key not in cache]
    stored = study_runs(client, experiment_id, missing[0].workload, lease_seconds(), views) if missing else []
    # A one-goal study is also answered by a rung of a finished ladder (StoredStudy.answers).
    latest = {(a.study_key, a.full_trials): a for run in sorted(stored, key=lambda r: r.order) if run.finished
              for a in run.answers()}
    found = {}
    for study in studies:
        key = study.study_key
        if key not in cache:
            # A study whose every trial probes trains whole runs whatever the sweep's mode.
            run = latest.get((key, study.full_trials(full_trials)))
            if run is None:
                return None
            trials = _trials(client, run)
            # Each rung as the one-goal study it answers; the hardest rung's trials are the study's own.
            rungs = tuple((a.steps_to_result, trials if a.rung is None else _trials(client, a))
                          for a in run.answers()[1:])
            cache[key] = MeasuredStudy(study, run.run_id, run.steps_to_result, trials, rungs)
        found[key] = cache[key]
    return found


def _trials(client: Any, study: StoredStudy) -> tuple[TrialOutcome, ...]:
    """A finished study's (or a ladder rung's) trials: from its tag as read, else (written before the tag, too many
    for one, or left out of a long index entry) from its run."""
    found = study.trial_outcomes
    return found if found is not None else tuple(study_trial_outcomes(client, study.run_id, study.rung))


def run_adaptive_sweep(spec: AdaptiveSweepSpec, options: SweepOptions, out: TextIO | None = None) -> AdaptiveResult:
    """Run (or resume, or replay) an adaptive sweep; print and record why it stopped."""
    out = out or sys.stdout
    started = time.monotonic()
    spec = replace(spec, grid=prepare(spec.grid, options))
    sweep = open_sweep(spec.grid, options, out, lambda done: _replayed(spec, options, done, out), key=spec.sweep_key,
                       name=f"adaptive sweep {spec.workload} {len(spec.curves)} curves")
    if not isinstance(sweep, SweepRun):
        return sweep
    with abort_guard(sweep.tracker.owned):
        return _run(spec, options, sweep, started, out)


def _replayed(spec: AdaptiveSweepSpec, options: SweepOptions, done: FinishedSweep,
              out: TextIO) -> AdaptiveResult | None:
    """The answer of an adaptive sweep whose runs finished (``done``), replayed from the store and said on ``out``;
    None when anything is to do."""
    client, runs = done.client, done.runs
    with store_errors(client):
        cache: dict[str, MeasuredStudy] = {}
        # Nothing is trained while replaying: every round reads the study runs that finished_sweep read.
        result = adapt(spec, lambda studies: _read(client, done.experiment_id, studies, options.full_trials,
                                                   cache, done.studies), lambda: 0.0)
    if result is None:
        return None
    print(f"adaptive sweep {spec.sweep_key[:12]} ({spec.workload}) already complete: {len(result.measured)} studies "
          f"in sweep run {runs[-1].run_id}; nothing to train", file=out)
    _report(result, out)
    print(ui_link(str(client.tracking_uri), done.experiment_id, runs[-1].run_id), file=out, flush=True)
    return result


def _run(spec: AdaptiveSweepSpec, options: SweepOptions, sweep: SweepRun, started: float,
         out: TextIO) -> AdaptiveResult:
    stale = clear_expired(sweep.client, sweep.experiment_id, lease_seconds())
    sweep.tracker.log_start({**spec.params(), "full_trials": options.full_trials}, {})
    print(f"adaptive sweep {spec.sweep_key[:12]} ({spec.workload}): {len(spec.curves)} curve(s), target "
          f"{goal_text(spec.settings)}{_replicated(spec)}, {spec.settings.width} studies a round, run {sweep.tracker.run_id} in "
          f"experiment {sweep.experiment_name!r} at {redact_uri(sweep.tracking_uri)}", file=out)
    if stale:
        print(f"marked {stale} runs left RUNNING by a dead process (lease expired) as FAILED", file=out)
    cache: dict[str, MeasuredStudy] = {}
    # One executor for every round, and its session held across them (a local Ray instance starts once).
    executor = get_executor(options.executor)()

    def measure(studies: list[StudySpec]) -> dict[str, MeasuredStudy]:
        views = study_views(sweep.client, sweep.experiment_id)
        plan = plan_studies(sweep.client, sweep.experiment_id, spec.workload, studies, options.full_trials, views)
        pending = [p.spec for p in plan if p.state is not PlanState.DONE]
        if pending:
            progress = sweep_progress(plan, out, options.log_interval)
            dispatch(pending, options, sweep, progress, out, executor)
            progress.close()
            views = None  # the studies just run changed the store: read it again
        found = _read(sweep.client, sweep.experiment_id, studies, options.full_trials, cache, views)
        if found is None:
            raise RuntimeError("a study of the adaptive sweep did not finish")
        return found

    def announce(round_index: int, lines: list[str]) -> None:
        print(f"round {round_index}: " + "; ".join(lines), file=out, flush=True)

    with executor_session(executor, options, out):
        result = adapt(spec, measure, lambda: time.monotonic() - started, announce)
    assert result is not None  # measure never gives up
    metrics = {n.METRIC_ADAPTIVE_ROUNDS: result.rounds, n.METRIC_ADAPTIVE_STUDIES: len(result.measured),
               n.METRIC_ADAPTIVE_TRIAL_STEPS: result.trial_steps}
    sweep.tracker.log_table(n.ARTIFACT_ADAPTIVE_DECISIONS, result.decisions.to_csv(index=False),
                            tags={n.TAG_ADAPTIVE_STOP: result.stop.value}, metrics=metrics)
    with_result = sum(1 for m in result.measured if m.steps_to_result is not None)
    sweep.tracker.finish(len(result.measured), with_result, time.monotonic() - started,
                         adaptive_description(spec, result))
    _report(result, out)
    print(ui_link(sweep.tracking_uri, sweep.experiment_id, sweep.tracker.run_id), file=out, flush=True)
    return result


def _interval(fit: dict, name: str) -> str:
    low, high = fit.get(f"{name}_low"), fit.get(f"{name}_high")
    if low is None or high is None or pd.isna(low) or pd.isna(high):
        return adaptive.number(fit.get(name))
    return f"{adaptive.number(fit.get(name))} ({adaptive.number(low)}..{adaptive.number(high)})"


def _threshold(fit: dict) -> str:
    """Zhang et al.'s critical batch size on the measured points, with Merrill et al.'s bracket (analysis.regimes)."""
    value, failing = fit.get("b_crit_threshold"), fit.get("perfect_scaling_end")
    if value is None or pd.isna(value):
        return "-"
    number = adaptive.number
    bracket = f"{number(value, 6)}..{number(failing, 6)}" if failing is not None and pd.notna(failing) \
        else f">{number(value, 6)}"
    return f"{number(value, 6)} ({bracket})"


def result_rows(result: AdaptiveResult) -> list[dict[str, str]]:
    """One row per curve: what was measured and the answer."""
    rows = []
    for state in result.states:
        fit = state.fit
        rows.append({"curve": state.label(), "batch sizes": ",".join(map(str, state.measured)),
                     "S_min (95%)": _interval(fit, "s_min"), "B_crit (95%)": _interval(fit, "b_crit"),
                     "perfect_scaling_end": adaptive.number(fit.get("perfect_scaling_end"), 6),
                     "maximal parallelism from": adaptive.number(fit.get("maximal_parallelism_start"), 6),
                     "B_crit threshold (passes..fails)": _threshold(fit),
                     "B_crit threshold, fit (95%)": _interval(fit, "b_crit_threshold_fit"),
                     **({"replicates": _replicates(state)} if len(state.seeds) > 1 else {}),
                     "still uncertain": state.summary()})
    return rows


def _replicates(state: adaptive.CurveState) -> str:
    """Replicates per batch size, and what the fit table's intervals rest on (where it says: interval_basis)."""
    counts = ", ".join(f"{b}:{k}" for b, k in state.counts)
    basis = state.fit.get("interval_basis")
    if basis is None or pd.isna(basis):
        return counts
    fewest = state.fit.get("interval_replicates")
    if basis == BASIS_SOME:  # which points, and that the others' seed noise is not in the intervals
        return f"{counts}; intervals rest on {basis}: {some_points_words(state.fit.get('note'))}"
    return counts + (f"; intervals rest on {basis} (the fewest replicates at a point: {fewest})" if basis else
                     f"; no intervals (they need {MIN_REPLICATES} replicates at a point, or complete trials)")


def goal_text(settings: adaptive.AdaptiveSettings) -> str:
    """The question of an adaptive sweep, in words."""
    if settings.goal is adaptive.Goal.B_CRIT:
        return (f"B_crit at least x{settings.target:g} inside the measured batch sizes at both ends, the hyperbola "
                f"describing the curve")
    if settings.goal is adaptive.Goal.THRESHOLD:
        return (f"the threshold critical batch size, bracketed by adjacent powers of two, from a smallest batch size "
                f"in perfect scaling ({adaptive.PERFECT_DOUBLINGS} doublings)")
    return "both regime boundaries between adjacent measured powers of two"


def _replicated(spec: AdaptiveSweepSpec) -> str:
    replicates = spec.grid.replicates
    return f"; then {replicates} replicates at each point that decides it" if replicates > 1 else ""


def adaptive_description(spec: AdaptiveSweepSpec, result: AdaptiveResult) -> str:
    """The adaptive sweep run's description: why it stopped, the answer per curve, every decision."""
    p = spec.grid.protocol
    budget = spec.settings.budget
    rows = result_rows(result)
    shown = [c for c in result.decisions.columns if c not in ("excess_doublings", "studies_before",
                                                               "trial_steps_before")]
    decisions = result.decisions[shown].astype(object).fillna("")
    limits = ", ".join(part for part in (
        f"at most {spec.settings.max_studies} studies" if spec.settings.max_studies else "",
        (f"a budget of {budget.amount:g} trial-steps" if budget.kind is adaptive.BudgetKind.TRIAL_STEPS
         else f"a budget of {budget.amount:g} s of wall clock") if budget else "") if part)
    goal = f"goals {n.goals_text(p.goals)}, each a curve" if p.goals else f"goal {p.goal_error:g}"
    parts = [f"Adaptive sweep of {spec.workload}: {len(result.measured)} studies ({p.trials} trials each, {goal}"
             f", a check every {p.check_interval} steps, cap {p.max_steps}) chosen in {result.rounds} "
             f"round(s) from batch sizes {min(spec.candidates)}..{max(spec.candidates)}; {result.trial_steps} "
             f"trial-steps. Target: {goal_text(spec.settings)}{_replicated(spec)}" + (f"; limits: {limits}" if limits else "")
             + ".",
             f"**Stopped: {result.stop.value}.** Still uncertain: {'; '.join(result.uncertain()) or 'nothing'}.",
             markdown_table(list(rows[0]), [list(row.values()) for row in rows]) if rows else "",
             f"Decisions (also `{n.ARTIFACT_ADAPTIVE_DECISIONS}`):",
             markdown_table(decisions.columns, decisions.itertuples(index=False))]
    return "\n\n".join(parts)


def _report(result: AdaptiveResult, out: TextIO) -> None:
    print(f"stopped: {result.stop.value} after {result.rounds} round(s), {len(result.measured)} studies, "
          f"{result.trial_steps} trial-steps", file=out)
    for row in result_rows(result):
        print(f"  {row['curve']}: batch sizes {row['batch sizes']}; S_min {row['S_min (95%)']}; B_crit "
              f"{row['B_crit (95%)']}; perfect_scaling_end {row['perfect_scaling_end']}; maximal data parallelism "
              f"from {row['maximal parallelism from']}; B_crit threshold {row['B_crit threshold (passes..fails)']}, "
              f"fit {row['B_crit threshold, fit (95%)']}"
              + (f"; replicates per batch size {row['replicates']}" if "replicates" in row else ""), file=out)
    for line in result.uncertain():
        print(f"  still uncertain: {line}", file=out)
    out.flush()
