"""Goal ladder benchmark: what a ladder costs against its hardest goal alone and against one study per goal.
Prints figures measured in one run; not a test.

    python bench/ladder.py [--goals 0.10,0.07,0.05,0.03] [--batch-sizes 16,64,256] [--trials 32]

Digits, SGD, dense, the workload's protocol (cap, check interval) unless told otherwise. Per batch size: a
one-goal study of every rung and the ladder study, each in its own experiment of one fresh sqlite store (nothing
reused, no neighbour orders the trials), one trial worker. Printed: each rung's steps-to-result in the ladder and
alone, the trial-steps of the ladder, of its hardest goal alone and of all the one-goal studies together, their
ratios and wall-clock seconds (this machine under its load at the time). Exit 1 if any rung's steps-to-result
differs from its one-goal study's, or the ladder costs more than 1.3x its hardest goal alone (issue 39).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edps_mlflow.resources import training_environment_missing  # noqa: E402  (no torch yet)

if training_environment_missing(os.environ):  # allocator settings are read when a process starts
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **training_environment_missing(os.environ)})

from edps_mlflow.config import StudySpec  # noqa: E402
from edps_mlflow.ladder import goal_results  # noqa: E402
from edps_mlflow.study import ExecutionOptions, run_study  # noqa: E402

ALLOWED = 1.3  # the bound: a ladder's trial-steps over its hardest goal's alone


def _study(spec: StudySpec, experiment: str, device: str) -> tuple[object, float]:
    options = ExecutionOptions(device=device, workers=1, log_interval=1e9, experiment=experiment)
    started = time.perf_counter()
    with open(os.devnull, "w") as out:
        outcome = run_study(spec, options, out=out)
    return outcome, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--goals", default="0.10,0.07,0.05,0.03")
    parser.add_argument("--batch-sizes", default="16,64,256")
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--max-steps", type=int, default=None, help="default: the workload's cap")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    goals = tuple(float(g) for g in args.goals.split(","))
    failed = False
    print(f"digits, SGD, dense, {args.trials} trials, ladder {args.goals}; x hardest = ladder trial-steps / the "
          f"hardest goal's alone, x sum = ladder / all one-goal studies together")
    print(f"{'batch':>6} {'rung steps (ladder)':>22} {'rung steps (alone)':>22} {'ladder':>8} {'hardest':>8} "
          f"{'sum':>8} {'x hardest':>9} {'x sum':>6} {'ladder s':>8} {'alone s':>8}")
    with tempfile.TemporaryDirectory() as directory:
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{directory}/mlflow.db"
        for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
            spec = StudySpec.build("digits-simple-cnn", "sgd", 0.0, batch_size, trials=args.trials,
                                   max_steps=args.max_steps, goals=goals)
            alone = {goal: _study(spec.rung(goal), f"bench/{batch_size}/goal {goal!r}", args.device)
                     for goal in spec.ladder}
            ladder, ladder_seconds = _study(spec, f"bench/{batch_size}/ladder", args.device)
            rungs = [r.steps_to_result for r in goal_results(spec, ladder.records)]
            singles = [alone[goal][0].steps_to_result for goal in spec.ladder]
            hardest = alone[spec.ladder[-1]][0].trial_steps
            total = sum(outcome.trial_steps for outcome, _ in alone.values())
            ratio = ladder.trial_steps / hardest
            failed |= rungs != singles or ratio > ALLOWED
            print(f"{batch_size:>6} {'/'.join(map(str, rungs)):>22} {'/'.join(map(str, singles)):>22} "
                  f"{ladder.trial_steps:>8} {hardest:>8} {total:>8} {ratio:>9.2f} {ladder.trial_steps / total:>6.2f} "
                  f"{ladder_seconds:>8.1f} {sum(s for _, s in alone.values()):>8.1f}", flush=True)
    if failed:
        print("FAILED: a rung's steps-to-result differs from its one-goal study's, or the ladder costs more than "
              f"{ALLOWED}x its hardest goal alone")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
