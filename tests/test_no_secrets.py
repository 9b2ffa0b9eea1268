"""No secret printed: a user and password in the tracking URI or the data mirror URL never reach
standard output or standard error, whatever fails."""

from __future__ import annotations

import pytest

import analysis.cli
import edps_mlflow.cli
from edps_mlflow.uris import redact_uri

from conftest import _free_port

SECRET = "s3cret"


@pytest.fixture
def closed_port_uri(tmp_path, monkeypatch):
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID"):
        monkeypatch.delenv(name, raising=False)
    uri = f"http://user:{SECRET}@127.0.0.1:{_free_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    monkeypatch.setenv("EDPS_TRAINING_ENVIRONMENT", "1")
    monkeypatch.chdir(tmp_path)
    return uri


@pytest.mark.parametrize("main,argv", [
    (edps_mlflow.cli.main, ["status", "--experiment", "x"]),
    (edps_mlflow.cli.main, ["study", "--bs", "64", "--trials", "1", "--max-steps", "20", "--check-interval", "10"]),
    (edps_mlflow.cli.main, ["sweep", "--batch-sizes", "64", "--trials", "1", "--max-steps", "20",
                            "--check-interval", "10"]),
    (analysis.cli.main, ["fit", "--experiment", "x"]),
    (analysis.cli.main, ["fit", "--csv", "tests-fixture", "--log-to-mlflow", "--bootstrap", "0"]),
])
def test_credentials_in_the_tracking_uri_are_never_printed(main, argv, closed_port_uri, capsys):
    if "tests-fixture" in argv:
        from pathlib import Path

        argv[argv.index("tests-fixture")] = str(Path(__file__).parent / "fixtures" / "synthetic_steps.csv")
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    captured = capsys.readouterr()
    assert exit_info.value.code == 2
    assert SECRET not in captured.out + captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "http://***:***@127.0.0.1" in lines[0], captured.err


def test_credentials_in_the_data_mirror_are_never_printed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EDPS_DATA_MIRROR", f"http://user:{SECRET}@127.0.0.1:{_free_port()}/mnist")
    with pytest.raises(SystemExit) as exit_info:
        edps_mlflow.cli.main(["data", "download", "mnist", "--data-dir", str(tmp_path)])
    captured = capsys.readouterr()
    assert exit_info.value.code == 2
    assert SECRET not in captured.out + captured.err
    assert "http://***:***@127.0.0.1" in captured.out and len(captured.err.strip().splitlines()) == 1


@pytest.mark.parametrize("text,expected", [
    ("http://user:pw@host:5000/x", "http://***:***@host:5000/x"),
    ("https://token@host", "https://***@host"),
    ("postgresql://u:p@ss@db/x and http://a:b@c", "postgresql://***:***@db/x and http://***:***@c"),
    ("sqlite:////tmp/a@b/mlflow.db", "sqlite:////tmp/a@b/mlflow.db"),
    ("http://host/path?x=a@b", "http://host/path?x=a@b"),
    ("API request to 'http://u:p@h/api' failed", "API request to 'http://***:***@h/api' failed"),
])
def test_redact_uri(text, expected):
    assert redact_uri(text) == expected
