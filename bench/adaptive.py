"""The adaptive sweep against the full power-of-two grid, same protocol. Prints figures; not a test.

    python bench/adaptive.py [--trials 32] [--sparsities 0,0.5] [--workers 2]          live: trains both
    python bench/adaptive.py --replay --store DIR --experiment NAME [--sparsities 0,0.5,0.9] [--target ...]
    python bench/adaptive.py --replicates 2 --trials 4 --batch-sizes 8..256     both with replicates

Live: both run on the workload in one sqlite store (fresh unless ``--store`` names one), each in its own
experiment, so each trains its own studies, with the same workers; wall-clock seconds are of this
invocation on this machine under its load at the time.

Replay (``--replay``): the store already holds the full grid (``edps sweep`` of the same protocol, in
``--experiment``). The adaptive rule runs against it as an oracle: a study it asks for is read from the
grid instead of trained, so rules and targets can be compared on many grids at no training cost. Its wall
clock is simulated: each round's studies are given to ``--workers`` workers (longest first, each to the
worker free first), a study taking what its run took when the grid was measured; the grid's wall clock is
the same schedule of all its studies at once.

Printed per curve, for both: studies and trial-steps spent (every trial's steps, from the studies'
trial outcomes, counted the same way), S_min, B_crit and the regime boundaries with the grid's 95%
intervals, whether B_crit lies within x2 of the grid's estimate and whether each answer lies inside the
grid's interval; then the ratios adaptive / grid of studies, trial-steps and wall clock. With ``--replicates R``
the grid is the fully replicated one (``edps sweep --replicates R``: R studies at every point) and the adaptive
sweep ``--adaptive --replicates R`` (R only at the points that decide its question).
"""

from __future__ import annotations

import argparse
import heapq
import io
import math
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edps_mlflow.resources import training_environment_missing  # noqa: E402

if training_environment_missing(os.environ):  # allocator settings are read when a process starts
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **training_environment_missing(os.environ)})

import pandas as pd  # noqa: E402

from analysis.load import load_studies, load_trials  # noqa: E402
from analysis.regimes import fit_table  # noqa: E402
from edps_mlflow.adaptive import BOOTSTRAP_REPEATS, BOOTSTRAP_SEED, TOLERANCE, AdaptiveSettings, Budget  # noqa: E402
from edps_mlflow.adaptive_sweep import (  # noqa: E402
    AdaptiveResult,
    AdaptiveSweepSpec,
    MeasuredStudy,
    _read,
    adapt,
    run_adaptive_sweep,
)
from edps_mlflow.curves import CurveId  # noqa: E402
from edps_mlflow.store.client import open_store  # noqa: E402
from edps_mlflow.store.read.runs import study_views  # noqa: E402
from edps_mlflow.sweep import SweepOptions, SweepSpec, run_sweep  # noqa: E402
from edps_mlflow.workloads import get_workload  # noqa: E402

QUANTITIES = ("s_min", "b_crit", "perfect_scaling_end", "maximal_parallelism_start", "b_crit_threshold")
WITHIN = 2.0  # the goal: B_crit within x2 of the grid's estimate


def _fmt(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or pd.isna(value):
        return "-"
    return f"{float(value):.3g}"


def makespan(durations: list[float], workers: int) -> float:
    """Seconds for ``workers`` workers to run these studies, longest first, each to the worker free first."""
    free = [0.0] * workers
    for duration in sorted(durations, reverse=True):
        heapq.heappush(free, heapq.heappop(free) + duration)
    return max(free) if durations else 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="digits-simple-cnn")
    parser.add_argument("--sparsities", default="0,0.5")
    parser.add_argument("--batch-sizes", default=None, help="low..high (powers of two); default the workload's range")
    parser.add_argument("--trials", type=int, default=None, help="default: the workload's")
    parser.add_argument("--goal-error", type=float, default=None)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--check-interval", type=int, default=None)
    parser.add_argument("--target", default="b_crit:2", help="b_crit[:F], threshold or boundaries")
    parser.add_argument("--max-studies", type=int, default=None)
    parser.add_argument("--budget", default=None)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--replicates", type=int, default=1, help="studies per point (seeds --seed ..)")
    parser.add_argument("--store", default=None, help="directory of the sqlite store (default: a temporary one)")
    parser.add_argument("--experiment", default="bench-grid", help="the grid's experiment")
    parser.add_argument("--replay", action="store_true", help="read the grid from --store instead of training")
    parser.add_argument("--log", default=None, help="file for the sweeps' progress lines (default: discarded)")
    args = parser.parse_args()

    if args.replay and not args.store:
        raise SystemExit("--replay needs --store: the directory whose mlflow.db holds the measured grid")
    store = Path(args.store or tempfile.mkdtemp(prefix="edps-bench-adaptive-"))
    store.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{store.resolve() / 'mlflow.db'}"
    os.environ["MLFLOW_TRACKING_URI"] = uri
    os.chdir(store)
    sparsities = tuple(float(s) for s in args.sparsities.split(","))
    workload = get_workload(args.workload)
    batch_sizes = workload.batch_size_range()
    if args.batch_sizes:
        low, high = (int(v) for v in args.batch_sizes.split(".."))
        batch_sizes = tuple(b for b in batch_sizes if low <= b <= high)
    grid = SweepSpec.build(args.workload, ("sgd",), batch_sizes, sparsities, args.trials, args.goal_error,
                           args.max_steps, args.check_interval, replicates=args.replicates)
    # The study keys carry the data's fingerprint (run_sweep would compute it; the bench needs the keys).
    grid = replace(grid, protocol=replace(grid.protocol, data_fingerprint=workload.data_fingerprint(None)))
    goal, factor = AdaptiveSettings.parse_target(args.target)
    settings = AdaptiveSettings(factor, args.max_studies, Budget.parse(args.budget) if args.budget else None, goal,
                                args.workers)
    spec = AdaptiveSweepSpec(grid, settings)
    p = grid.protocol
    print(f"{args.workload}, sgd, sparsities {args.sparsities}, batch sizes {min(batch_sizes)}..{max(batch_sizes)}; "
          f"{p.trials} trials per study, goal {p.goal_error:g}, cap {p.max_steps}, check every {p.check_interval}; "
          f"target {settings.target_text()}; {args.replicates} replicate(s); {args.workers} workers; store {uri}"
          + (" (replayed)" if args.replay else ""))
    if args.replay:
        adaptive, adaptive_seconds, grid_seconds = replay(spec, uri, args.experiment, args.workers)
        grid_experiment = args.experiment
    else:
        log = open(args.log, "a") if args.log else io.StringIO()
        started = time.monotonic()
        adaptive = run_adaptive_sweep(spec, SweepOptions(experiment="bench-adaptive", workers=args.workers,
                                                         log_interval=60), log)
        adaptive_seconds = time.monotonic() - started
        started = time.monotonic()
        grid_experiment = args.experiment
        run_sweep(grid, SweepOptions(experiment=grid_experiment, workers=args.workers, log_interval=60), log)
        grid_seconds = time.monotonic() - started
    compare(spec, adaptive, adaptive_seconds, grid_seconds, uri, grid_experiment, args.replay)


def replay(spec: AdaptiveSweepSpec, uri: str, experiment: str, workers: int) -> tuple[AdaptiveResult, float, float]:
    """The adaptive rule with the grid as its oracle, and the simulated wall clock of both."""
    client = open_store(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise SystemExit(f"no experiment {experiment!r} in {uri}: measure the grid there first (edps sweep)")
    views = study_views(client, found.experiment_id)
    durations: dict[str, float] = {}
    for view in sorted(views, key=lambda v: v.info.start_time or 0):
        if view.info.status == "FINISHED" and view.info.end_time:
            durations[view.data.tags.get("edps.study_key", "")] = (view.info.end_time - view.info.start_time) / 1000
    cache: dict[str, MeasuredStudy] = {}
    clock = [0.0]

    def measure(studies: list) -> dict[str, MeasuredStudy]:
        read = _read(client, found.experiment_id, studies, False, cache, views)
        if read is None:
            missing = [s.batch_size for s in studies if s.study_key not in durations]
            raise SystemExit(f"the grid in {experiment!r} lacks a study the rule asked for (batch sizes {missing}): "
                             f"measure it with the same protocol first")
        clock[0] += makespan([durations[s.study_key] for s in studies], workers)
        return read

    result = adapt(spec, measure, lambda: clock[0])
    assert result is not None
    grid_keys = [s.study_key for s in spec.grid.studies()]
    missing = [key for key in grid_keys if key not in durations]
    if missing:
        raise SystemExit(f"the grid in {experiment!r} lacks {len(missing)} of its {len(grid_keys)} studies")
    return result, clock[0], makespan([durations[key] for key in grid_keys], workers)


def compare(spec: AdaptiveSweepSpec, adaptive: AdaptiveResult, adaptive_seconds: float, grid_seconds: float,
            uri: str, grid_experiment: str, replayed: bool) -> None:
    grid = spec.grid
    studies = load_studies((grid_experiment,), uri)
    grid_keys = {s.study_key for s in grid.studies()}
    studies = studies[studies["study_key"].isin(grid_keys)].reset_index(drop=True)
    trials = load_trials(studies, uri)
    grid_fits = fit_table(studies, trials, tolerance=TOLERANCE, repeats=BOOTSTRAP_REPEATS, seed=BOOTSTRAP_SEED)
    grid_steps = int(trials["steps_trained"].sum())
    clock = "simulated " if replayed else ""
    print(f"adaptive: stopped '{adaptive.stop.value}' after {adaptive.rounds} rounds: {len(adaptive.measured)} studies, "
          f"{adaptive.trial_steps} trial-steps, {clock}{adaptive_seconds:.0f} s")
    print(f"grid:     {len(studies)} studies, {grid_steps} trial-steps, {clock}{grid_seconds:.0f} s")
    print(f"ratio adaptive/grid: studies {len(adaptive.measured) / len(studies):.2f}, trial-steps "
          f"{adaptive.trial_steps / grid_steps:.2f}, {clock}wall clock {adaptive_seconds / grid_seconds:.2f}")
    goal_met = True
    for state in adaptive.states:
        curve = state.curve
        row = grid_fits[(grid_fits["optimizer"] == curve.optimizer) & (grid_fits["sparsity"] == curve.sparsity)]
        row = row.iloc[0].to_dict()
        mine = [m for m in adaptive.measured if CurveId.of(m.spec) == curve]
        grid_curve = studies[studies["sparsity"] == curve.sparsity]
        curve_steps = int(trials[trials["study_key"].isin(grid_curve["study_key"])]["steps_trained"].sum())
        spent = sum(m.trial_steps for m in mine)
        print(f"\n{curve.label()}: adaptive {len(mine)} studies ({', '.join(f'{b}x{k}' for b, k in state.counts)}), "
              f"{spent} trial-steps; grid {len(grid_curve)} studies, {curve_steps} trial-steps "
              f"(ratio {spent / curve_steps:.2f})")
        print(f"  {'quantity':<27} {'adaptive (95%)':<26} {'grid (95%)':<26} adaptive inside grid's interval")
        for name in QUANTITIES:
            value, low, high = row.get(name), row.get(f"{name}_low"), row.get(f"{name}_high")
            ours = state.fit.get(name)
            ours_text = _fmt(ours) + (f" ({_fmt(state.fit.get(f'{name}_low'))}..{_fmt(state.fit.get(f'{name}_high'))})"
                                      if f"{name}_low" in state.fit else "")
            grid_text = _fmt(value) + (f" ({_fmt(low)}..{_fmt(high)})" if low is not None else "")
            if ours is None or pd.isna(ours) or low is None or pd.isna(low) or pd.isna(high):
                verdict = "no interval to check" if not (ours is None or pd.isna(ours)) else "no value"
            else:
                verdict = "yes" if float(low) <= float(ours) <= float(high) else "NO"
            print(f"  {name:<27} {ours_text:<26} {grid_text:<26} {verdict}")
        ours, theirs = state.fit.get("b_crit"), row.get("b_crit")
        low, high = row.get("b_crit_low"), row.get("b_crit_high")
        if ours is None or pd.isna(ours) or theirs is None or pd.isna(theirs):
            print("  B_crit: no value to compare")
            goal_met = False
        else:
            ratio = max(ours / theirs, theirs / ours)
            inside = low is not None and pd.notna(low) and float(low) <= ours <= float(high)
            print(f"  B_crit {ours:.3g} vs the grid's {theirs:.3g}: x{ratio:.2f} ({'within' if ratio <= WITHIN else 'NOT within'} "
                  f"x{WITHIN:g}), {'inside' if inside else 'NOT inside'} the grid's 95% interval")
            goal_met &= ratio <= WITHIN and inside
        if state.open:
            print(f"  still open (adaptive): {state.summary()}")
    ratio = adaptive.trial_steps / grid_steps
    wall = adaptive_seconds / grid_seconds
    print(f"\ngoal (B_crit within x{WITHIN:g} and inside the grid's interval on every curve, <= 0.5 of the grid's "
          f"trial-steps, <= its {clock}wall clock): "
          f"{'MET' if goal_met and ratio <= 0.5 and wall <= 1.0 else 'NOT MET'} (B_crit {'ok' if goal_met else 'off'}, "
          f"trial-steps {ratio:.2f}, wall clock {wall:.2f})")


if __name__ == "__main__":
    main()
