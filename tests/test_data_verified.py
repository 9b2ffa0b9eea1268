"""Data placed by hand is checked against the catalog's published checksums before any work: a substitute file or an
extracted one is refused in one line naming it and the checksums, unless accepted (then every run records it:
test_workloads.py's studies on generated files)."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

import edps_mlflow.cli
from edps_mlflow.data import catalog
from edps_mlflow.errors import EdpsError

from test_data import make_mnist

PUBLISHED = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"  # Tiny Shakespeare's input.txt


def test_a_catalog_entry_verifies_its_file_and_refuses_another(tmp_path, monkeypatch):
    text = b"First Citizen:\nBefore we proceed any further, hear me speak.\n" * 20
    (tmp_path / "input.txt").write_bytes(text)
    source = catalog.SOURCES["tiny-shakespeare"]
    entry = replace(source, files=(replace(source.files[0], sha256=hashlib.sha256(text).hexdigest()),))
    monkeypatch.setitem(catalog.SOURCES, "tiny-shakespeare", entry)
    assert catalog.require_verified("tiny-shakespeare", tmp_path, accept=False) is None
    (tmp_path / "input.txt").write_bytes(text + b"!")
    found = hashlib.sha256(text + b"!").hexdigest()
    with pytest.raises(EdpsError) as refused:
        catalog.require_verified("tiny-shakespeare", tmp_path, accept=False)
    assert str(refused.value) == (
        f"unverified data: {tmp_path}/input.txt (expected sha256 {entry.files[0].sha256}, found sha256 {found}); put "
        "the published files there (`edps data download tiny-shakespeare`), or pass --accept-unverified-data true "
        "to train on these (every run records it)")
    assert catalog.require_verified("tiny-shakespeare", tmp_path, accept=True) == \
        f"{tmp_path}/input.txt (expected sha256 {entry.files[0].sha256}, found sha256 {found})"


def test_extracted_files_have_no_published_checksum(tmp_path):
    make_mnist(tmp_path / "mnist", compress=False)
    found = catalog.unverified_files("mnist", tmp_path)
    assert len(found) == 2 and found[0].startswith(f"{tmp_path}/mnist/train-images-idx3-ubyte (extracted: no "
                                                   "published checksum; the published files: train-images-idx3-"
                                                   "ubyte.gz md5 f68b3c2dcbeaaa9fbdd348bbdeb94873")
    assert catalog.unverified_files("mnist", tmp_path / "elsewhere") == []  # not there: the loader says so
    assert catalog.unverified_files("toy", tmp_path) == []  # a user's own dataset: nothing published


@pytest.mark.parametrize("command", [
    ["study", "--workload", "shakespeare-char-transformer", "--optimizer", "adam", "--bs", "16"],
    ["sweep", "--workload", "shakespeare-char-transformer", "--optimizers", "adam", "--batch-sizes", "16"]])
def test_a_substitute_file_is_refused_before_any_work(command, sqlite_uri, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EDPS_TRAINING_ENVIRONMENT", "1")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "input.txt").write_text("To be, or not to be: that is the question.\n" * 2000)
    with pytest.raises(SystemExit) as exit_info:
        edps_mlflow.cli.main([*command, "--data-dir", str(tmp_path / "data")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"edps: error: unverified data: {tmp_path}/data/input.txt (expected sha256 "
                               f"{PUBLISHED}, found sha256 "), lines[0]
    assert not (tmp_path / "mlflow.db").exists()


def test_a_sweep_passes_the_acceptance_to_the_studies_it_submits():
    from edps_mlflow.config import StudySpec
    from edps_mlflow.mlproject import study_parameters

    spec = StudySpec.build("mnist-simple-cnn", "sgd", 0.0, 64)
    assert study_parameters(spec, "r", "k", None, False, None, None)["accept_unverified_data"] == "false"
    assert study_parameters(spec, "r", "k", None, False, None, None, True)["accept_unverified_data"] == "true"
