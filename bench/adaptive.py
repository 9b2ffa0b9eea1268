"""The adaptive sweep against the full power-of-two grid, same protocol. Prints figures; not a test.

    python bench/adaptive.py [--trials 8] [--goal-error 0.05] [--max-steps 3000] [--sparsities 0,0.9]

Both run on digits-simple-cnn in one sqlite store (fresh unless ``--store`` names one), each in its
own experiment, so each trains its own studies; with ``--grid-experiment shared`` the grid runs in the
adaptive sweep's experiment instead and trains only the batch sizes the adaptive sweep left out (its
cost is still counted over all its studies). Printed per curve: studies and trial-steps spent (every
trial's steps, from the studies' trials.csv, counted the same way for both), S_min, B_crit and the
regime boundaries from both with the grid's 95% intervals, and whether the adaptive answer lies inside
the grid's intervals. Wall-clock seconds are of this invocation on this machine under its load at the
time (a part found complete in the store is replayed in seconds).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
import io
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edps_mlflow.resources import training_environment_missing  # noqa: E402

if training_environment_missing(os.environ):  # allocator settings are read when a process starts
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **training_environment_missing(os.environ)})

import pandas as pd  # noqa: E402

from analysis.load import load_studies, load_trials  # noqa: E402
from analysis.regimes import fit_table  # noqa: E402
from edps_mlflow.adaptive import BOOTSTRAP_REPEATS, BOOTSTRAP_SEED, TOLERANCE, AdaptiveSettings, Budget  # noqa: E402
from edps_mlflow.adaptive_sweep import AdaptiveSweepSpec, run_adaptive_sweep  # noqa: E402
from edps_mlflow.sweep import SweepOptions, SweepSpec, run_sweep  # noqa: E402
from edps_mlflow.workloads import get_workload  # noqa: E402

QUANTITIES = ("s_min", "b_crit", "perfect_scaling_end", "maximal_parallelism_start")


def _fmt(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or pd.isna(value):
        return "-"
    return f"{float(value):.3g}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="digits-simple-cnn")
    parser.add_argument("--sparsities", default="0,0.9")
    parser.add_argument("--batch-sizes", default=None, help="low..high (powers of two); default the workload's range")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--goal-error", type=float, default=0.05)
    parser.add_argument("--max-steps", type=int, default=3000)
    parser.add_argument("--check-interval", type=int, default=None)
    parser.add_argument("--target", type=float, default=2.0)
    parser.add_argument("--max-studies", type=int, default=None)
    parser.add_argument("--budget", default=None)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--store", default=None, help="directory of the sqlite store (default: a temporary one)")
    parser.add_argument("--log", default=None, help="file for the sweeps' progress lines (default: discarded)")
    parser.add_argument("--grid-experiment", choices=("separate", "shared"), default="separate",
                        help="shared: the grid reuses the adaptive sweep's studies (trains only the rest)")
    args = parser.parse_args()

    store = Path(args.store or tempfile.mkdtemp(prefix="edps-bench-adaptive-"))
    store.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{store / 'mlflow.db'}"
    os.environ["MLFLOW_TRACKING_URI"] = uri
    os.chdir(store)
    sparsities = tuple(float(s) for s in args.sparsities.split(","))
    batch_sizes = None
    if args.batch_sizes:
        low, high = (int(v) for v in args.batch_sizes.split(".."))
        batch_sizes = tuple(1 << e for e in range(low.bit_length() - 1, high.bit_length()) if low <= 1 << e <= high)
    grid = SweepSpec.build(args.workload, ("sgd",), batch_sizes, sparsities, args.trials, args.goal_error,
                           args.max_steps, args.check_interval)
    # The study keys carry the data's fingerprint (run_sweep would compute it; the bench needs the keys).
    fingerprint = get_workload(args.workload).data_fingerprint(None)
    grid = replace(grid, protocol=replace(grid.protocol, data_fingerprint=fingerprint))
    settings = AdaptiveSettings(args.target, args.max_studies, Budget.parse(args.budget) if args.budget else None)
    log = open(args.log, "a") if args.log else io.StringIO()

    started = time.monotonic()
    adaptive = run_adaptive_sweep(AdaptiveSweepSpec(grid, settings),
                                  SweepOptions(experiment="bench-adaptive", workers=args.workers, log_interval=60), log)
    adaptive_seconds = time.monotonic() - started
    started = time.monotonic()
    grid_experiment = "bench-adaptive" if args.grid_experiment == "shared" else "bench-grid"
    run_sweep(grid, SweepOptions(experiment=grid_experiment, workers=args.workers, log_interval=60), log)
    grid_seconds = time.monotonic() - started

    studies = load_studies((grid_experiment,), uri)
    grid_keys = {s.study_key for s in grid.studies()}  # the shared experiment may hold other studies
    studies = studies[studies["study_key"].isin(grid_keys)].reset_index(drop=True)
    trials = load_trials(studies, uri)
    grid_fits = fit_table(studies, trials, tolerance=TOLERANCE, repeats=BOOTSTRAP_REPEATS, seed=BOOTSTRAP_SEED)
    grid_steps = int(trials["steps_trained"].sum())
    p = grid.protocol
    print(f"{args.workload}, sgd, sparsities {args.sparsities}, batch sizes {min(grid.batch_sizes)}..{max(grid.batch_sizes)}; "
          f"{p.trials} trials per study, goal {p.goal_error:g}, cap {p.max_steps}, check every {p.check_interval}; "
          f"target x{settings.target:g}; store {uri}")
    print(f"adaptive: stopped '{adaptive.stop.value}' after {adaptive.rounds} rounds: {len(adaptive.measured)} studies, "
          f"{adaptive.trial_steps} trial-steps, {adaptive_seconds:.0f} s")
    print(f"grid:     {len(studies)} studies, {grid_steps} trial-steps, {grid_seconds:.0f} s"
          + (" (in the adaptive sweep's experiment: its studies reused)" if args.grid_experiment == "shared" else ""))
    print(f"ratio adaptive/grid: studies {len(adaptive.measured) / len(studies):.2f}, trial-steps "
          f"{adaptive.trial_steps / grid_steps:.2f}"
          + (f", wall clock {adaptive_seconds / grid_seconds:.2f}" if args.grid_experiment == "separate" else ""))
    failures = 0
    for state in adaptive.states:
        optimizer, sparsity = state.curve
        row = grid_fits[(grid_fits["optimizer"] == optimizer) & (grid_fits["sparsity"] == sparsity)].iloc[0].to_dict()
        mine = [m for m in adaptive.measured if (m.spec.optimizer.value, m.spec.sparsity) == state.curve]
        grid_curve = studies[studies["sparsity"] == sparsity]
        curve_steps = int(trials[trials["study_key"].isin(grid_curve["study_key"])]["steps_trained"].sum())
        print(f"\nsgd sparsity {sparsity:g}: adaptive {len(mine)} studies ({','.join(map(str, state.measured))}), "
              f"{sum(m.trial_steps for m in mine)} trial-steps; grid {len(grid_curve)} studies, {curve_steps} trial-steps")
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
                inside = float(low) <= float(ours) <= float(high)
                verdict = "yes" if inside else "NO"
                failures += not inside
            print(f"  {name:<27} {ours_text:<26} {grid_text:<26} {verdict}")
        if state.open:
            print(f"  still uncertain (adaptive): {state.summary()}")
        if row.get("note"):
            print(f"  grid fit note: {row['note']}")
    print(f"\n{'every adaptive value with an interval to check lies inside the grid' if not failures else f'{failures} value(s) outside the grid intervals'}")


if __name__ == "__main__":
    main()
