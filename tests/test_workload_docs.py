"""docs/workloads.md followed literally: its wine workload's two files, as the page prints them, installed with pip,
listed by `edps workloads` under its package, and studied; its declared sizes checked against the loaded data."""

from __future__ import annotations

import importlib.util
import io
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from edps_mlflow import workloads
from edps_mlflow.config import StudySpec
from edps_mlflow.errors import EdpsError
from edps_mlflow.study import ExecutionOptions, run_study

from conftest import REPO, clean_environment

DOC = (REPO / "docs" / "workloads.md").read_text()


def doc_file(name: str) -> str:
    """The code block of docs/workloads.md whose first line is ``# <name>``."""
    found = re.search(r"```\w+\n(# " + re.escape(name) + r"\n.*?)```", DOC, re.S)
    assert found, f"docs/workloads.md shows no {name}"
    return found.group(1)


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A registry that has imported no workload of one's own yet."""
    monkeypatch.setattr(workloads, "_LOADED", {})
    monkeypatch.setattr(workloads, "_BY_REFERENCE", {})
    monkeypatch.setattr(workloads, "_SOURCES", {})
    monkeypatch.delenv(workloads.MODULES_ENV, raising=False)


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registry) -> Path:
    """The page's two files in a folder, installed by pip into a target on this process's import path."""
    source = tmp_path / "wine-workload"
    source.mkdir()
    for name in ("wine_workload.py", "pyproject.toml"):
        (source / name).write_text(doc_file(name))
    site = tmp_path / "site"
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *isolation, "--target",
                           str(site), str(source)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    monkeypatch.syspath_prepend(str(site))
    return site


def test_the_documented_workload_installs_lists_its_package_and_trains(installed, tmp_path, sqlite_store):
    listed = subprocess.run([sys.executable, "-m", "edps_mlflow.cli", "workloads"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, env=clean_environment(PYTHONPATH=f"{REPO}:{installed}"))
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0] == "built in:" and "package wine-workload (wine_workload:WORKLOAD):" in lines
    assert lines[lines.index("package wine-workload (wine_workload:WORKLOAD):") + 1].split()[0] == "wine-mlp"
    wine = workloads.get_workload("wine-mlp")
    assert workloads.workload_source(wine) == "package wine-workload (wine_workload:WORKLOAD)"
    assert workloads.workload_source(workloads.get_workload("digits-simple-cnn")) == "built in"
    data = wine.load_checked(None)  # the sizes the page declares are the data's
    assert (data.train_size, data.validation_size) == (161, 17)
    spec = StudySpec.build("wine-mlp", "adam", 0.0, 32, trials=2, max_steps=100)
    out = io.StringIO()
    outcome = run_study(spec, ExecutionOptions(workers=1, threads=1, experiment="wine"), out=out)
    assert len(outcome.records) == 2 and outcome.steps_to_result is not None, out.getvalue()


def test_a_declared_size_that_is_not_the_data_is_refused_in_one_line_before_anything(tmp_path, monkeypatch,
                                                                                     registry, sqlite_uri):
    """The page's module with a wrong train_size: the line the page quotes, when a sweep plans and from
    `edps study`, before a store is made."""
    wrong = doc_file("wine_workload.py").replace("train_size=161,", "train_size=150,")
    assert wrong != doc_file("wine_workload.py")
    (tmp_path / "wine_wrong.py").write_text(wrong)
    monkeypatch.syspath_prepend(str(tmp_path))
    quoted = re.search(r"`(workload 'wine-mlp': declares train_size=150 .*?)`", DOC.replace("\n  ", " "), re.S)
    assert quoted, "docs/workloads.md quotes the refusal"
    wrong_workload = workloads.get_workload("wine_wrong:WORKLOAD")
    # A sweep plans with the data's fingerprint (sweep.prepare), loading them checked: refused there.
    for load in (wrong_workload.load_checked, wrong_workload.data_fingerprint):
        with pytest.raises(EdpsError) as refused:
            load(None)
        assert str(refused.value) == quoted.group(1)
    done = subprocess.run([sys.executable, "-m", "edps_mlflow.cli", "study", "--bs", "32", "--optimizer", "adam",
                           "--workload", "wine_wrong:WORKLOAD"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120,
                          env=clean_environment(PYTHONPATH=f"{REPO}:{tmp_path}", MLFLOW_TRACKING_URI=sqlite_uri))
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [f"edps: error: {quoted.group(1)}"], \
        done.stderr[-2000:]
    assert not Path(sqlite_uri.removeprefix("sqlite:///")).exists()


@pytest.mark.parametrize("change,problem", [
    (lambda d: replace(d, train_labels=d.train_labels.int()), "train targets are int32; the default loss"),
    (lambda d: replace(d, validation_images=d.validation_images.double()),
     r"validation inputs are float64 of shape \[17, 13\]; FEATURES inputs are 2-D float32"),
    (lambda d: replace(d, train_labels=d.train_labels[:5]), r"train has 161 inputs but targets of shape \[5\]"),
    (lambda d: (d.train_images, d.train_labels), "load_data must return a DataSplits, got a tuple"),
])
def test_splits_that_break_the_contract_are_refused_naming_the_workload(tmp_path, monkeypatch, registry, change,
                                                                        problem):
    (tmp_path / "wine_workload.py").write_text(doc_file("wine_workload.py"))
    monkeypatch.syspath_prepend(str(tmp_path))
    wine = workloads.get_workload("wine_workload:WORKLOAD")
    broken = replace(wine, load_data=lambda data_dir: change(wine.load_data(data_dir)))
    with pytest.raises(EdpsError, match=f"^workload 'wine-mlp': {problem}"):
        broken.load_checked(None)


def test_every_name_the_contract_table_lists_is_importable_from_the_one_module():
    section = DOC[DOC.index("## The workload contract"):DOC.index("**Fields.**")]
    cells = re.findall(r"^\| (.*?) \|", section, re.MULTILINE)  # each row's first cell: the names
    listed = {name for cell in cells for name in re.findall(r"`(\w+)", cell)}
    assert {"Workload", "DataSplits", "split_indices", "DEFAULT_SPACES", "SearchSpace"} <= listed
    for name in listed:
        assert getattr(workloads, name) is not None, name
    assert listed <= set(workloads.__all__)
    # DEFAULT_SPACES serves as a workload's spaces as is, the same as none
    digits = workloads.get_workload("digits-simple-cnn")
    spaced = replace(digits, search_spaces=workloads.DEFAULT_SPACES)
    assert all(spaced.search_space(name) == digits.search_space(name) for name in workloads.DEFAULT_SPACES)
