"""A new user's first hour, as README.md gives it: the commands of its marked code blocks, read from the
README itself (so the two cannot drift apart), run in order in a fresh copy of the repository against a
store that does not exist yet, each checked for exit 0 and for what the README says it prints.

What differs from a user's run, and why:
- `pip install torch==2.13.0 -e .` is not run: it needs the network and minutes. The test runs in the
  environment that command makes (CI installs it so), and checks that the README's command names it.
- `mlflow run` gets `--env-manager local`: building MLflow's own virtualenv takes minutes and the network
  (tests/test_mlflow_run.py and the launcher's tests cover the entry points in a bare interpreter).
- Smaller parameters, for CI time (see OVERRIDES and ADDED): 8 trials in the first study instead of 32, and
  a sweep of three dense batch sizes with 8 trials instead of the README's 7 x 2 grid with 16. Three points
  are what a fit with intervals needs. Fewer trials would cost more: the first 4 Sobol points hold no good
  learning rate, so at 64..256 they need 900 to 1,140 steps (about 4,000 trial-steps a study), where the
  first 8 need about a hundred (500 trial-steps at 256). The first study trains in one process instead of
  one per core: it trains little, and a worker process costs its imports.
- Rerunning a sweep after a kill (the README's "trains only what is missing") is tested in test_sweep.py.
"""

from __future__ import annotations

import re
import resource
import shlex
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import REPO, clean_environment

README = REPO / "README.md"
MARKER = "<!-- newcomer"

# Option -> the value the test uses instead of the README's, for CI time (the option must be in the README).
OVERRIDES = {
    "edps sweep": {"--batch-sizes": "64..256", "--sparsities": "0", "--trials": "8"},
}
# Options the test adds, for CI time.
ADDED = {
    "mlflow run": ["-P", "trials=8", "-P", "workers=1", "--env-manager", "local"],
}
UI_LINK = r"http://127\.0\.0\.1:5000/#/experiments/\d+/runs/[0-9a-f]{32}\?workflowType=machine_learning"
CHARTS_LINK = UI_LINK.replace(r"\?", r"/model-metrics\?")  # a sweep's and an analysis' run: where its curves are


def newcomer_commands(text: str) -> list[str]:
    """The commands of the README's marked blocks, in order: each line of the fenced block that follows a
    ``<!-- newcomer ... -->`` line, split at ``&&``."""
    lines = text.splitlines()
    commands: list[str] = []
    for number, line in enumerate(lines):
        if not line.startswith(MARKER):
            continue
        assert lines[number + 1].startswith("```"), f"README.md line {number + 1}: a marker not before a code block"
        end = next(i for i in range(number + 2, len(lines)) if lines[i].startswith("```"))
        for command in lines[number + 2:end]:
            commands += [part.strip() for part in command.split("&&") if part.strip()]
    return commands


def _override(words: list[str]) -> list[str]:
    program = " ".join(words[:2])
    words = list(words)
    for option, value in OVERRIDES.get(program, {}).items():
        assert option in words, f"the README's {program!r} has no {option}: update OVERRIDES"
        words[words.index(option) + 1] = value
    return words + ADDED.get(program, [])


def _copy_of_the_repository(target: Path) -> Path:
    """The project's files (what git tracks, plus new files it does not ignore) in a new git repository."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True)
    if listed.returncode == 0:
        for name in filter(None, listed.stdout.split("\0")):
            source = REPO / name
            if source.is_file():
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target / name)
    else:  # not a git checkout: everything but caches and outputs
        shutil.copytree(REPO, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns(
            ".git", "__pycache__", "*.egg-info", "mlflow.db*", "mlruns", "*-artifacts", ".pytest_cache"))
    git = ["git", "-c", "user.name=newcomer", "-c", "user.email=newcomer@example.org"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "clone"]):
        subprocess.run(git + command, cwd=target, check=True, capture_output=True)
    return target


def _argv(words: list[str]) -> list[str]:
    """The README's programs as this environment runs them."""
    if words[0] == "mlflow":
        return [sys.executable, "-m", "mlflow", *words[1:]]
    if words[0] == "edps" or words[0] == "edps-analyze":
        installed = shutil.which(words[0])
        module = "edps_mlflow.cli" if words[0] == "edps" else "analysis.cli"
        return [installed, *words[1:]] if installed else [sys.executable, "-c", f"from {module} import main; main()",
                                                            *words[1:]]
    raise AssertionError(f"README.md: the test does not know how to run {words[0]!r}")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed: the clone is checked with git status")
def test_the_readme_first_hour_in_a_fresh_clone(tmp_path: Path) -> None:
    readme = README.read_text()
    commands = newcomer_commands(readme)
    assert [c.split()[0] for c in commands] == ["pip", "mlflow", "edps", "edps", "edps-analyze", "edps-analyze"]
    assert [" ".join(c.split()[:2]) for c in commands][2:] == ["edps status", "edps sweep", "edps-analyze fit",
                                                               "edps-analyze report"]

    # The set-up: the install the suite runs in, then the first study.
    assert commands[0] == "pip install torch==2.13.0 -e ." and version("torch").split("+")[0] == "2.13.0"
    assert commands[1] == "mlflow run . -P bs=256"
    from edps_mlflow.workloads import get_workload

    digits = get_workload("digits-simple-cnn")
    assert "32 quasi-random learning rates for SGD at batch size 256" in readme and digits.default_trials == 32
    assert f"validation error reaches {digits.goal_error:g}" in readme

    clone = _copy_of_the_repository(tmp_path / "edps-mlflow")
    environment = clean_environment(PYTHONPATH=str(clone))
    outputs: dict[str, str] = {}

    def run(command: str) -> str:
        words = _override(shlex.split(command))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        result = subprocess.run(_argv(words), cwd=clone, env=environment, capture_output=True, text=True,
                                timeout=600)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        # What each command costs, for whoever sizes this test (shown with -s or on a failure).
        print(f"{' '.join(words[:2])}: {after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime:.1f} "
              f"CPU-seconds")
        assert result.returncode == 0, (" ".join(words), result.stdout[-3000:], result.stderr[-3000:])
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
        return result.stdout + result.stderr

    assert not (clone / "mlflow.db").exists()
    outputs["study"] = run(commands[1])
    steps = int(re.search(r"^steps_to_result = (\d+) \(trial \d+: learning_rate=", outputs["study"], re.M).group(1))
    assert re.search(r"^reached \d+, not_reached \d+, diverged \d+, superseded \d+; .*study run [0-9a-f]{32}$",
                     outputs["study"], re.M)
    assert re.search(r"MLflow UI \(start it with `mlflow ui --backend-store-uri sqlite:///\S+mlflow\.db`\): "
                     + UI_LINK, outputs["study"])
    # The results are in mlflow.db in this directory; the study run in `Default`, its trials below it.
    assert (clone / "mlflow.db").is_file()
    client = MlflowClient(f"sqlite:///{clone / 'mlflow.db'}")
    default = client.get_experiment_by_name("Default")
    runs = client.search_runs([default.experiment_id])
    study = next(r for r in runs if r.data.tags.get("edps.kind") == "study")
    assert study.data.metrics["steps_to_result"] == steps
    names = [r.data.tags["mlflow.runName"] for r in runs if r.data.tags.get("edps.kind") == "trial"]
    assert len(names) == 8 and all(re.match(r"t\d{3} ", name) for name in names)
    assert any(re.match(rf"t\d{{3}} reached@{steps} lr=", name) for name in names)

    # edps status: the grid, with the study's result at batch size 256.
    outputs["status"] = run(commands[2])
    assert "batch size" in outputs["status"] and re.search(rf"^256\s+{steps}\s*$", outputs["status"], re.M)

    # The sweep: what the README says it is (7 batch sizes x 2 sparsities with 16 trials), then, smaller,
    # every study's result.
    sweep = shlex.split(commands[3])
    low, high = (int(v) for v in sweep[sweep.index("--batch-sizes") + 1].split(".."))
    grid = (f"{high.bit_length() - low.bit_length() + 1} batch sizes x "
            f"{len(sweep[sweep.index('--sparsities') + 1].split(','))} sparsities with "
            f"{sweep[sweep.index('--trials') + 1]} trials")
    assert grid in readme and "into the\n  experiment `edps/digits-simple-cnn`" in readme
    outputs["sweep"] = run(commands[3])
    for batch_size in (64, 128, 256):
        assert re.search(rf"sgd sparsity=0 bs={batch_size}: steps_to_result \d+$", outputs["sweep"], re.M), \
            outputs["sweep"][-3000:]
    assert re.search(CHARTS_LINK, outputs["sweep"])  # the sweep run's charts: its curves

    # The fit: S_min and B_crit, led by how sure they are; as README says, one seed with exact early stopping
    # gets no interval and the reason.
    outputs["fit"] = run(commands[4])
    assert "S_min" in outputs["fit"] and "B_crit" in outputs["fit"]
    assert outputs["fit"].startswith("How sure each answer is:\n- digits-simple-cnn sgd sparsity 0: no intervals: ")
    # (the text is wrapped to 100 columns: the remedy may run over a line's end)
    assert "--replicates 3 or more" in " ".join(outputs["fit"].split()) and "gets no interval and the reason" in readme
    assert not re.search(r"\d \[[-0-9.e+]+, [-0-9.e+]+\]", outputs["fit"]), outputs["fit"]

    # The report: its path, the file, and the analysis run's UI link.
    outputs["report"] = run(commands[5])
    assert "report.html" in outputs["report"] and (clone / "report.html").is_file()
    link = re.search(CHARTS_LINK, outputs["report"]).group(0)
    run_id = link.split("/runs/")[1].split("/")[0]
    assert client.get_run(run_id).data.tags["edps.kind"] == "analysis"

    # Nothing the README's commands wrote shows up as a change to the clone (.gitignore covers it all).
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=clone,
                            capture_output=True, text=True, check=True).stdout
    assert status == "", status
