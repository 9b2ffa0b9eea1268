"""The digits workload's sparse curves with its default protocol: steps-to-result at batch sizes 16, 64 and 256 must
fall from 16 to 64 and then level off (not rise by more than 25 % from 64 to 256). Prints the steps and the verdict
per sparsity, exit 1 when a curve fails; not a test.

    python bench/digits_shape.py [--sparsities 0.5,0.9] [--tracking-uri sqlite:///shape.db]

Run it when the digits protocol (goal, cap, check interval, trials) or the engine's results change: the curve is a
function of those, which the suite pins (tests/test_protocol_defaults.py, tests/test_results_version.py). At
sparsity 0.9 with 8 trials the curve once rose with batch size (docs/digits-workload.md says why); each sparsity
costs minutes of CPU, which is why the suite does not run it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edps_mlflow.resources import training_environment_missing  # noqa: E402

if training_environment_missing(os.environ):  # allocator settings are read when a process starts
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **training_environment_missing(os.environ)})

from edps_mlflow.config import StudySpec  # noqa: E402
from edps_mlflow.study import ExecutionOptions, run_study  # noqa: E402

BATCH_SIZES = (16, 64, 256)
# How much a plateau point may sit above the one before it: the validation split has 179 images, so a
# study's steps move by a check or two between neighbouring batch sizes once the curve is flat.
PLATEAU_SLACK = 1.25


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sparsities", default="0.5,0.9")
    parser.add_argument("--tracking-uri", default=None, help="default: a new sqlite store in a temporary folder")
    args = parser.parse_args()
    uri = args.tracking_uri or f"sqlite:///{Path(tempfile.mkdtemp(prefix='edps-shape-')) / 'mlflow.db'}"
    failed = False
    for sparsity in (float(s) for s in args.sparsities.split(",")):
        steps = {}
        started = time.perf_counter()
        for batch_size in BATCH_SIZES:  # the workload's trials, goal, cap and check interval
            spec = StudySpec.build("digits-simple-cnn", "sgd", sparsity, batch_size)
            outcome = run_study(spec, ExecutionOptions(experiment="shape", log_interval=600.0, tracking_uri=uri),
                                out=open(os.devnull, "w"))
            steps[batch_size] = outcome.steps_to_result
        small, middle, large = (steps[b] for b in BATCH_SIZES)
        reached = None not in (small, middle, large)
        falls = reached and middle < small
        levels_off = reached and large <= PLATEAU_SLACK * middle
        verdict = "falls to a plateau" if falls and levels_off else \
            ("a batch size never reached the goal" if not reached else ("does not fall" if not falls else "rises"))
        failed |= not (falls and levels_off)
        print(f"sparsity {sparsity:g}: steps-to-result {steps} ({time.perf_counter() - started:.0f} s): {verdict}")
    print(f"studies in {uri}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
