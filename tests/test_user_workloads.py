"""Workloads of one's own: a ``package.module:NAME`` reference and an installed package's entry point, found
by name in this process and in the processes it starts, keyed like the built-in ones; the example package
under examples/ installed and run end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from edps_mlflow import workloads
from edps_mlflow.config import StudySpec
from edps_mlflow.errors import EdpsError

from conftest import REPO, clean_environment

EXAMPLE = REPO / "examples" / "breast-cancer-workload"

MODULE = '''
import torch
from torch import nn
from edps_mlflow.data.splits import DataSplits
from edps_mlflow.workloads import InputLayout, Workload

def load_data(data_dir):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(220, 4, generator=generator)
    y = (x[:, 0] > 0).long()
    return DataSplits(x[:200], y[:200], x[200:], y[200:])

def build():
    return nn.Linear(4, 2)

TOY = Workload(name="toy-features", description="four features, two classes", load_data=load_data,
               build_model=build, goal_error=0.1, max_steps=200, needs_data_dir=False,
               dataset="toy", train_size=200, validation_size=20, input_layout=InputLayout.FEATURES,
               default_trials=2, check_interval=10)

def make_toy():
    return TOY

NOT_A_WORKLOAD = 3
CLASH = Workload(name="digits-simple-cnn", description="", load_data=load_data, build_model=build, goal_error=0.1,
                 max_steps=200, needs_data_dir=False, dataset="toy", train_size=200,
                 validation_size=20, input_layout=InputLayout.FEATURES)
'''


@pytest.fixture
def toy_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module ``toy_workloads`` on the import path, and a registry that has imported nothing yet."""
    folder = tmp_path / "modules"
    folder.mkdir()
    (folder / "toy_workloads.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setattr(workloads, "_LOADED", {})
    monkeypatch.setattr(workloads, "_BY_REFERENCE", {})
    monkeypatch.delenv(workloads.MODULES_ENV, raising=False)
    return folder


def test_a_module_reference_is_found_by_name_here_and_in_child_processes(toy_module):
    toy = workloads.get_workload("toy_workloads:TOY")
    assert workloads.get_workload("toy-features") is toy
    assert workloads.get_workload("toy_workloads:make_toy") is toy  # a function that returns the workload
    spec = StudySpec.build("toy_workloads:TOY", "sgd", 0.0, 16)
    # Keyed by the workload's name, as a built-in or an entry point's workload is: not by where it came from.
    assert spec.workload == "toy-features" and spec.study_key == StudySpec.build("toy-features", "sgd", 0.0, 16).study_key
    # A process this one starts (pool workers are spawned; `mlflow run` and Ray get the same variable).
    found = subprocess.run(
        [sys.executable, "-c", "from edps_mlflow.workloads import get_workload; print(get_workload('toy-features').train_size)"],
        env=clean_environment(PYTHONPATH=f"{REPO}:{toy_module}"), capture_output=True, text=True, timeout=120)
    assert found.stdout.strip() == "200", found.stderr
    assert "toy-features" in dict(workloads.workload_catalog())


@pytest.mark.parametrize("reference,message", [
    ("no_such_module:TOY", "cannot import 'no_such_module'.*PYTHONPATH"),
    ("toy_workloads:MISSING", "has no 'MISSING'"),
    ("toy_workloads:NOT_A_WORKLOAD", "is a int, not an edps_mlflow.workloads.Workload"),
    ("toy_workloads:CLASH", "the name of a built-in workload"),
    ("toy_workloads:", "package.module:NAME"),
])
def test_bad_references_are_one_line(toy_module, reference, message):
    with pytest.raises(EdpsError, match=message):
        workloads.get_workload(reference)


def test_an_unknown_name_says_how_to_add_a_workload(toy_module):
    with pytest.raises(EdpsError, match="unknown workload 'nope'.*edps_mlflow.workloads.*package.module:NAME"):
        workloads.get_workload("nope")


def test_a_workload_is_validated_when_it_is_built(toy_module):
    toy = workloads.get_workload("toy_workloads:TOY")
    from dataclasses import replace

    for changes, message in [({"name": "Bad Name"}, "name must be 1-64"), ({"max_steps": 5}, "max_steps .5. must be at least the check interval"),
                             ({"goal_error": 1.5}, r"goal_error must be in \(0, 1\)"),
                             ({"search_spaces": {"lbfgs": toy.search_space("sgd")}}, "search_spaces names unknown optimizers lbfgs"),
                             ({"input_layout": "tokens"}, "input_layout must be an InputLayout"),
                             ({"train_size": 0}, "train_size must be a positive integer"),
                             # Wrong types a user may type: told, not accepted (a truthy "no") or an AttributeError.
                             ({"search_spaces": []}, "search_spaces must map optimizer names"),
                             ({"needs_data_dir": "no"}, "needs_data_dir must be True or False, got 'no'"),
                             ({"description": 3}, "description must be a string, got 3"),
                             ({"dataset": None}, "dataset must be a string, got None")]:
        with pytest.raises(EdpsError, match=f"^workload '[^']*': {message}"):
            replace(toy, **changes)
    lossy = replace(toy, goal_metric=workloads.GoalMetric.LOSS, goal_error=1.5)  # a loss goal may exceed 1
    assert lossy.goal_bound(1.5, 20) == 30.0


def run_edps(args: list[str], cwd: Path, timeout: float = 300, **environment: str) -> subprocess.CompletedProcess:
    """The real `edps` entry point in a subprocess, with the caller's PYTHONPATH (the installed example's)."""
    return subprocess.run([sys.executable, "-c", "from edps_mlflow.cli import main; main()", *args], cwd=cwd,
                          env=clean_environment(**environment), capture_output=True, text=True, timeout=timeout)


def _install_example(target: Path) -> None:
    """pip's own install of examples/ into ``target`` (no dependencies; without build isolation, so without the
    network, where setuptools is installed here already)."""
    import importlib.util
    import shutil

    # A copy: building leaves build/ and *.egg-info beside the sources, which belong in no checkout.
    source = shutil.copytree(EXAMPLE, target.parent / "example-source",
                             ignore=shutil.ignore_patterns("build", "*.egg-info"))
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *isolation,
                           "--target", str(target), str(source)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert list(target.glob("edps_breast_cancer-*.dist-info/entry_points.txt"))


@pytest.mark.slow
def test_the_example_package_installed_runs_studies_and_sweeps_on_every_executor(sqlite_uri, tmp_path):
    """The whole path of docs/workloads.md: the example package installed (pip), listed by `edps workloads`, a
    study whose trials run in worker processes, then sweeps whose studies run in Ray tasks and `mlflow run` processes:
    each finds the workload by its entry point, and every study is keyed with the data fingerprint."""
    site = tmp_path / "site"
    _install_example(site)
    environment = {"PYTHONPATH": f"{REPO}:{site}", "MLFLOW_TRACKING_URI": sqlite_uri}
    listed = run_edps(["workloads"], tmp_path, **environment)
    assert listed.returncode == 0 and "breast-cancer-mlp" in listed.stdout, listed.stderr
    assert "package edps-breast-cancer (edps_breast_cancer:WORKLOAD):" in listed.stdout.splitlines()
    # Short studies (2 trials, an easy goal, a low cap): the test is of the path, not of the numbers.
    protocol = ["--trials", "2", "--goal-error", "0.2", "--max-steps", "300", "--check-interval", "20"]
    study = run_edps(["study", "--workload", "breast-cancer-mlp", "--bs", "32", "--optimizer", "adam", "--workers", "2",
                      *protocol], tmp_path, timeout=900, **environment)
    assert study.returncode == 0 and "steps_to_result = " in study.stdout, study.stdout[-2000:] + study.stderr[-2000:]
    # The study's trial workers are processes of the local executor's kind; Ray and `mlflow run` start theirs.
    for executor, batch_size in (("ray", "64"), ("mlflow-project", "128")):
        swept = run_edps(["sweep", "--workload", "breast-cancer-mlp", "--optimizers", "adam", "--batch-sizes", batch_size,
                          *protocol, "--executor", executor, "--workers", "1"], tmp_path, timeout=900, **environment)
        assert swept.returncode == 0, f"{executor}: {swept.stdout[-2000:]} {swept.stderr[-2000:]}"
    from mlflow.tracking import MlflowClient

    from edps_mlflow.names import KIND_STUDY, PARAM_SPEC_PREFIX, TAG_BATCH_SIZE, TAG_KIND, TAG_WORKLOAD

    client = MlflowClient(sqlite_uri)
    experiment = client.get_experiment_by_name("edps/breast-cancer-mlp")
    runs = [r for r in client.search_runs([experiment.experiment_id]) if r.data.tags.get(TAG_KIND) == KIND_STUDY]
    assert sorted(int(r.data.tags[TAG_BATCH_SIZE]) for r in runs) == [32, 64, 128]
    assert all(r.info.status == "FINISHED" and r.data.tags[TAG_WORKLOAD] == "breast-cancer-mlp" for r in runs)
    # Keyed like a built-in workload's studies: the fingerprint of the data loaded is in every key.
    fingerprints = {r.data.params.get(PARAM_SPEC_PREFIX + "data_fingerprint") for r in runs}
    assert len(fingerprints) == 1 and None not in fingerprints


def test_the_example_workload_module_reads_in_under_100_lines():
    lines = (EXAMPLE / "edps_breast_cancer" / "__init__.py").read_text().splitlines() + \
        (EXAMPLE / "pyproject.toml").read_text().splitlines()
    assert len(lines) < 100
    assert '[project.entry-points."edps_mlflow.workloads"]' in (EXAMPLE / "pyproject.toml").read_text()
