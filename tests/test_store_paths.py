"""Store paths as users type them (docs/tracking.md): a bare ``.db`` path is that sqlite store, another bare path is
refused with the URI to type, a store in a folder that does not exist is refused naming the nearest existing one,
on every command family (edps study, sweep, status, doctor; edps-analyze), before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

import analysis.cli
import edps_mlflow.cli
from edps_mlflow.errors import EdpsError
from edps_mlflow.store.client import resolve_tracking_uri
from edps_mlflow.uris import store_uri

TINY = ["--bs", "64", "--trials", "1", "--max-steps", "20", "--check-interval", "10"]
COMMANDS = [
    (edps_mlflow.cli.main, ["study", *TINY], "edps: error: "),
    (edps_mlflow.cli.main, ["sweep", "--batch-sizes", "64", *TINY[2:]], "edps: error: "),
    (edps_mlflow.cli.main, ["status"], "edps: error: "),
    (edps_mlflow.cli.main, ["doctor"], "edps: error: "),
    (analysis.cli.main, ["table"], "edps-analyze: error: "),
]


@pytest.fixture
def folder(sqlite_uri, monkeypatch) -> Path:
    """An empty working directory (cwd), no study re-exec."""
    monkeypatch.setenv("EDPS_TRAINING_ENVIRONMENT", "1")
    return Path.cwd()


def refused(main, argv, prefix, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1 and lines[0].startswith(prefix), lines
    return lines[0]


@pytest.mark.parametrize("main,argv,prefix", COMMANDS)
@pytest.mark.parametrize("form", ["bare folder", "bare relative", "missing folder", "bare missing folder", "file"])
def test_store_path_refused_before_any_work(form, main, argv, prefix, folder, monkeypatch, capsys):
    (folder / "stores").mkdir()
    uri, expected = {
        "bare folder": (str(folder / "stores"), f"type sqlite:///{folder}/stores/mlflow.db"),
        "bare relative": ("stores/mlruns", f"type sqlite:///{folder}/stores/mlruns.db"),
        "missing folder": (f"sqlite:///{folder}/stroes/mlflow.db",
                           f"no folder {folder}/stroes for the tracking store sqlite:///{folder}/stroes/mlflow.db: "
                           f"the nearest existing folder is {folder}"),
        "bare missing folder": ("stroes/deeper/mlflow.db", f"no folder {folder}/stroes/deeper for the tracking "
                                f"store sqlite:///{folder}/stroes/deeper/mlflow.db: the nearest existing folder is "
                                f"{folder}"),
        "file": (f"file://{folder}/stores/mlruns", f"MLflow's retired file store: use a sqlite store "
                 f"(sqlite:///{folder}/stores/mlflow.db)"),
    }[form]
    if main is analysis.cli.main:
        argv = [*argv, "--tracking-uri", uri]
    else:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert expected in refused(main, argv, prefix, capsys)
    assert sorted(p.name for p in folder.rglob("*")) == ["stores"]  # no store, no folder, no artifacts


def test_uris_that_are_no_local_path_pass_unchanged(tmp_path):
    for uri in ("http://127.0.0.1:5000", "https://u:p@host/mlflow", "databricks", "postgresql://u@h/db",
                f"sqlite:///{tmp_path}/mlflow.db"):
        assert store_uri(uri) == uri
    with pytest.raises(EdpsError, match="the nearest existing folder is /$"):
        store_uri("sqlite:////no-such-folder-here/mlflow.db")


def ran(main, argv, capsys) -> str:
    """``main(argv)``'s standard output; it succeeded."""
    try:
        main(argv)
    except SystemExit as end:
        assert end.code in (0, None), capsys.readouterr().err
    return capsys.readouterr().out


def test_a_bare_db_path_is_that_sqlite_store_for_every_command(folder, monkeypatch, capsys):
    (folder / "stores").mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "stores/mine.db")  # relative: made absolute for the workers
    assert f"created a new tracking store at {folder}/stores/mine.db" in ran(edps_mlflow.cli.main, ["study", *TINY],
                                                                              capsys)
    assert resolve_tracking_uri() == f"sqlite:///{folder}/stores/mine.db"
    assert "64" in ran(edps_mlflow.cli.main, ["status"], capsys)
    assert "every invariant holds" in ran(edps_mlflow.cli.main, ["doctor"], capsys) + capsys.readouterr().err
    assert "64" in ran(analysis.cli.main, ["table", "--tracking-uri", str(folder / "stores" / "mine.db")], capsys)
    assert sorted(p.name for p in (folder / "stores").iterdir() if p.suffix == ".db") == ["mine.db"]
