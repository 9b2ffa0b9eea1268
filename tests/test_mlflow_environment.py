"""The MLproject's entry points as `mlflow run` runs them in its own environment, where the project is
not installed (issue: the re-executed launcher lost the project directory and every bare `mlflow run .`
failed, while the tests ran `--env-manager local` in an environment that has the package).

Why this environment is equivalent to the one MLflow builds. MLflow's virtualenv manager names the
environment by a hash of python_env.yaml (``_get_virtualenv_name``), creates it under
``MLFLOW_ENV_ROOT`` with ``python -m venv`` from the interpreter python_env.yaml names, pip-installs
the dependencies, and reuses an environment of that name that already exists. Here the session creates
that environment itself, once, under that name in a private ``MLFLOW_ENV_ROOT``: a venv of this
interpreter without system site packages, in which one plain ``.pth`` file lists this interpreter's
site-packages. A directory added that way is an import path entry like any other, so the dependencies
(torch, mlflow, click, numpy, ...) import from it, but its own ``.pth`` files are not processed: the
editable install of edps_mlflow (a ``.pth`` finder there) is absent, and ``edps_mlflow`` imports only
from the working directory, as in MLflow's environment, where it was never installed (the test checks
this). What differs is only where the dependencies' files lie. Then the real ``mlflow run`` with its
default environment manager does the rest with its own code: reads the MLproject, substitutes the
parameters into the entry point's command, creates the run, activates the environment (``source
.../bin/activate &&``) and runs the command with the project directory as the working directory. A real
build takes minutes and needs downloads, so it stays out of CI.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.projects._project_spec import load_project
from mlflow.tracking import MlflowClient
from mlflow.utils.environment import _PythonEnv
from mlflow.utils.virtualenv import _get_virtualenv_name

from conftest import REPO, clean_environment

pytestmark = pytest.mark.slow
EXPERIMENT = "edps/mlflow-environment"


def _dependency_directories() -> list[str]:
    directories = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        directories.append(site.getusersitepackages())
    return [d for d in directories if os.path.isdir(d)]


@pytest.fixture(scope="session")
def mlflow_environment(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLFLOW_ENV_ROOT holding, under the name MLflow gives this project's environment, an environment
    that has the dependencies and not the project (see the module's docstring)."""
    root = tmp_path_factory.mktemp("mlflow-envs")
    project = load_project(str(REPO))
    name = _get_virtualenv_name(_PythonEnv.from_yaml(project.env_config_path), REPO)
    environment = root / name
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(environment)], check=True, timeout=120)
    (site_packages,) = environment.glob("lib/python*/site-packages")
    (site_packages / "edps_dependencies.pth").write_text("".join(f"{d}\n" for d in _dependency_directories()))
    python = environment / "bin" / "python"
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    probe = subprocess.run(
        [str(python), "-c", "import importlib.util as u, sys; "
                            "print([m for m in ('torch', 'mlflow', 'click', 'sklearn') if u.find_spec(m) is None]); "
                            "import edps_mlflow"],
        cwd=elsewhere, env=clean_environment(PYTHONPATH=""), capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == "[]", probe  # the dependencies are there ...
    if "No module named 'edps_mlflow'" not in probe.stderr:
        # e.g. a non-editable install: the package lies in site-packages itself, and the path entry finds it
        pytest.skip(f"edps_mlflow is importable beside its dependencies here: {probe.stderr[-300:]!r}")
    return root


def _mlflow_run(env_root: Path, store: Path, entry_point: str, *parameters: str) -> subprocess.CompletedProcess:
    """`mlflow run <project> -e <entry point>`, its default environment manager (virtualenv)."""
    command = [sys.executable, "-m", "mlflow", "run", str(REPO), "-e", entry_point, "--experiment-name", EXPERIMENT]
    for parameter in parameters:
        command += ["-P", parameter]
    return subprocess.run(command, cwd=store, capture_output=True, text=True, timeout=300,
                          env=clean_environment(PYTHONPATH="", MLFLOW_ENV_ROOT=str(env_root),
                                                MLFLOW_TRACKING_URI=f"sqlite:///{store / 'mlflow.db'}"))


def test_the_entry_points_run_in_mlflows_environment(mlflow_environment, tmp_path):
    # A tiny protocol whose goal the first check reaches: the report needs steps-to-result to fit.
    protocol = ("trials=2", "goal_error=0.5", "max_steps=40", "check_interval=20")
    study = _mlflow_run(mlflow_environment, tmp_path, "main", "bs=64", *protocol)
    assert study.returncode == 0, study.stderr[-3000:]
    # MLflow used the environment the session made (it built none of its own) and activated it.
    (environment,) = mlflow_environment.iterdir()
    assert f"source {environment / 'bin' / 'activate'} && python -m edps_mlflow.cli study" in study.stderr
    # ... on the command MLflow computes from the MLproject
    expected = load_project(str(REPO)).get_entry_point("main").compute_command(
        dict(parameter.split("=") for parameter in ("bs=64", *protocol)), None)
    assert expected in study.stderr

    # the local executor trains the study in a spawned worker process
    sweep = _mlflow_run(mlflow_environment, tmp_path, "sweep", "batch_sizes=32", *protocol)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    report = _mlflow_run(mlflow_environment, tmp_path, "analyze", f"experiment={EXPERIMENT}",
                         f"output={tmp_path / 'report.md'}", "bootstrap=20")
    assert report.returncode == 0, report.stderr[-3000:]
    assert (tmp_path / "report.md").is_file()

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    studies = {r.data.params.get("spec.batch_size"): r for r in runs if r.data.tags.get("edps.kind") == "study"}
    assert set(studies) == {"64", "32"} and all(r.info.status == "FINISHED" for r in studies.values())
    assert all(r.data.metrics["steps_to_result"] in (20, 40) for r in studies.values())
    sweeps = [r for r in runs if r.data.tags.get("edps.kind") == "sweep"]
    assert len(sweeps) == 1 and sweeps[0].info.status == "FINISHED"
