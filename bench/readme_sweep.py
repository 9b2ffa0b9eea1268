"""README's sweep, measured against what README says it costs. Prints figures measured in one run; not a test.

    python bench/readme_sweep.py [--readme README.md]          (nice -n 10 on a shared machine)

Reads README itself: the `edps sweep` command of its marked newcomer blocks, the grid it names ("7 batch sizes x
2 sparsities") and the cost it states ("about 29,000 trial-steps, 2.5 CPU-minutes"), so that a README edit is what
is measured. Runs that command as a user does, from an empty temporary folder (a fresh store, MLFLOW_TRACKING_URI
and MLFLOW_EXPERIMENT_NAME unset), and prints its studies, trial-steps (the study runs' own counts), wall and
CPU seconds (user + system of the command and its worker processes) and the load average around it. DRIFT
where studies differ from the grid, trial-steps by more than TRIAL_STEPS_TOLERANCE (training is deterministic:
a change of the engine, the search or the workload) or CPU-seconds by more than CPU_FACTOR either way (the
machine's pace and load move it by half within the hour); exit 1 then.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # MLflow's sqlite store plugin is this repository's
TRIAL_STEPS_TOLERANCE = 0.10  # README rounds ("about 29,000")
CPU_FACTOR = 1.5
MARKER = "<!-- newcomer"
STATED = re.compile(r"about ([\d,]+) trial-steps, ([\d.]+) CPU-minutes")
GRID = re.compile(r"(\d+) batch sizes x (\d+) sparsities with (\d+) trials")


def readme_sweep(text: str) -> list[str]:
    """The words of the first `edps sweep` line in a code block after a newcomer marker."""
    lines = text.splitlines()
    for number, line in enumerate(lines):
        if line.startswith(MARKER):
            end = next(i for i in range(number + 2, len(lines)) if lines[i].startswith("```"))
            for command in lines[number + 2:end]:
                if command.startswith("edps sweep "):
                    return shlex.split(command)
    raise SystemExit("README.md: no `edps sweep` line in a newcomer block")


def stated_figures(text: str) -> tuple[int, int, float]:
    """README's studies (batch sizes x sparsities), trial-steps and CPU-minutes of its sweep."""
    stated, grid = STATED.search(text), GRID.search(text)
    if stated is None or grid is None:
        raise SystemExit(f"README.md: no {STATED.pattern!r} or no {GRID.pattern!r}: update this benchmark")
    return int(grid[1]) * int(grid[2]), int(stated[1].replace(",", "")), float(stated[2])


def study_trial_steps(store: Path) -> list[int]:
    """Each study run's trial-steps, as the study recorded them (a metric, else a param or a tag)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{store}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, "tags.`edps.kind` = 'study'", max_results=10_000)
    key = "study/trial_steps"
    return [int(float(r.data.metrics.get(key, r.data.params.get(key, r.data.tags.get(key))))) for r in runs]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--readme", type=Path, default=REPO / "README.md")
    args = parser.parse_args()
    text = args.readme.read_text()
    words = readme_sweep(text)
    studies_stated, steps_stated, minutes_stated = stated_figures(text)
    environment = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME")}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    print(f"$ {shlex.join(words)}    (in an empty folder; load average {os.getloadavg()[0]:.1f} before)", flush=True)
    with tempfile.TemporaryDirectory(prefix="readme-sweep-") as folder:
        before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "edps_mlflow.cli", *words[1:]], cwd=folder, env=environment,
                                capture_output=True, text=True, check=False)
        wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
        if result.returncode != 0:
            print(result.stdout[-2000:], result.stderr[-2000:], sep="\n")
            raise SystemExit(f"the sweep exited with {result.returncode}")
        steps = study_trial_steps(Path(folder) / "mlflow.db")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    print(f"load average {os.getloadavg()[0]:.1f} after; wall {wall:.0f} s ({wall / 60:.1f} min), CPU {cpu:.0f} s "
          f"({cpu / 60:.1f} CPU-minutes, {cpu / wall:.2f} cores busy on average)")
    drifts = [
        ("studies", len(steps), studies_stated, len(steps) != studies_stated),
        ("trial-steps", sum(steps), steps_stated, abs(sum(steps) / steps_stated - 1) > TRIAL_STEPS_TOLERANCE),
        ("CPU-minutes", round(cpu / 60, 1), minutes_stated,
         not 1 / CPU_FACTOR <= cpu / 60 / minutes_stated <= CPU_FACTOR),
    ]
    print(f"{'':12} {'measured':>10} {'README':>10} {'ratio':>6}")
    for name, measured, stated, drift in drifts:
        print(f"{name:12} {measured:>10,} {stated:>10,} {measured / stated:>6.2f}{'  DRIFT' if drift else ''}")
    if any(drift for *_, drift in drifts):
        print(f"DRIFT: README's sweep no longer costs what README says (tolerances: studies exact, trial-steps "
              f"{TRIAL_STEPS_TOLERANCE:.0%}, CPU x{CPU_FACTOR}): measure again and update README")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
