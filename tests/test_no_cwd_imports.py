"""Nothing from the working directory runs: modules there that shadow our dependencies (or the
standard library) are never imported, by the command, its re-executed self or its worker processes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from edps_mlflow.cli import _LAUNCHER

from conftest import REPO, clean_environment, fresh_store

SHADOWED = ("click", "torch", "numpy", "mlflow", "socket", "pickle")


def _console_script() -> str:
    """The installed `edps` script (it does not put the working directory on sys.path, unlike -c)."""
    beside = Path(sys.executable).parent / "edps"
    found = str(beside) if beside.is_file() else shutil.which("edps")
    if not found:
        pytest.skip("the edps console script is not installed")
    return found


@pytest.mark.parametrize("arguments", [
    ["study", "--bs", "64", "--trials", "1", "--max-steps", "20", "--check-interval", "10"],
    # the local executor runs each study in a spawned worker process
    pytest.param(["sweep", "--batch-sizes", "64", "--trials", "1", "--max-steps", "20", "--check-interval", "10"],
                 marks=pytest.mark.slow),
])
def test_modules_in_the_working_directory_are_not_imported(arguments, tmp_path):
    for name in SHADOWED:
        (tmp_path / f"{name}.py").write_text(f'raise SystemExit("shadowed! {name}.py from the working directory")\n')
    # A built store: what is tested is which modules the command imports, not how it builds a store.
    uri = fresh_store(tmp_path / "mlflow.db")
    result = subprocess.run([_console_script(), *arguments], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300, env=clean_environment(PYTHONPATH=str(REPO), MLFLOW_TRACKING_URI=uri))
    assert "shadowed!" not in result.stdout + result.stderr
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert any(r.data.tags.get("edps.kind") == "study" and r.info.status == "FINISHED" for r in runs)


def test_the_re_executed_command_runs_this_code(tmp_path):
    """The re-exec keeps PYTHONPATH first (it removes only the working directory entry)."""
    result = subprocess.run(
        [_console_script(), "study", "--bs", "0"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env=clean_environment(PYTHONPATH=str(REPO),
                              MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}"))
    assert result.returncode == 2 and "batch size must be a positive integer" in result.stderr
    probe = subprocess.run(
        [sys.executable, "-c", _LAUNCHER.replace("from edps_mlflow.cli import main; main()",
                                                 "import edps_mlflow; print(edps_mlflow.__file__)")],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env=clean_environment(PYTHONPATH=str(REPO), PYTHONSAFEPATH="1"))
    assert probe.stdout.strip() == str(REPO / "edps_mlflow" / "__init__.py"), probe
