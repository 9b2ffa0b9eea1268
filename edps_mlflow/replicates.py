"""`edps study --replicates R`: R ordinary studies of one point, seeds --seed .. --seed + R - 1, one after
another (each its own key and study run, reused when done), then one line for the point over its replicates.

A replicate that fails or is interrupted stops the command there with that study's exit status (Ctrl-C: 130);
the replicates already finished are stored, so the same command again trains only what is left.
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from typing import TextIO

from analysis.replicates import MIN_REPLICATES, point_value, spread
from edps_mlflow.config import StudySpec, replicate_seeds
from edps_mlflow.study import ExecutionOptions, run_study


def run_replicates(spec: StudySpec, replicates: int, options: ExecutionOptions,
                   out: TextIO | None = None) -> dict[int, int | None]:
    """Run the replicates of ``spec`` (its seed the first) in seed order; seed -> steps-to-result."""
    out = out or sys.stdout
    seeds = replicate_seeds(spec.seed, replicates)
    steps: dict[int, int | None] = {}
    for number, seed in enumerate(seeds):
        print(f"replicate {number + 1} of {replicates} (seed {seed})", file=out, flush=True)
        steps[seed] = run_study(replace(spec, seed=seed), options, out).steps_to_result
    print(replicates_line(steps), file=out, flush=True)
    return steps


def replicates_line(steps: dict[int, int | None]) -> str:
    """The point over its replicates: each seed's steps-to-result, and the point's value (analysis.replicates)."""
    each = ", ".join(f"seed {seed}: {'-' if s is None else s}" for seed, s in steps.items())
    reached = [s for s in steps.values() if s is not None]
    value = point_value([math.inf if s is None else s for s in steps.values()])
    if math.isnan(value):
        point = f"no value: {len(reached)} of {len(steps)} reached, not more than half"
    else:
        point = f"{value:.1f} (geometric mean of the {len(reached)} of {len(steps)} that reached, " \
                f"{spread(min(reached), max(reached))})"
    few = f"; fewer than {MIN_REPLICATES} reached: too few for an interval" if len(reached) < MIN_REPLICATES else ""
    return f"replicates: steps-to-result {each}; the point: {point}{few}"
