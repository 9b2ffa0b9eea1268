"""No secret printed: a user and password in the tracking URI or the data mirror URL never reach
standard output or standard error, whatever fails."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import analysis.cli
import edps_mlflow.cli
from edps_mlflow.uris import redact_uri, userinfo

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


# Passwords a regex over free text cannot delimit: a quote, '#', '/', '?', a space, '@', '%'.
AWKWARD = ("it's", "p#w", "a/b", "q?x", "with space", "p@ss", "50%off", 'say "hi"', "a<b>c")


@pytest.mark.parametrize("password", AWKWARD)
@pytest.mark.parametrize("main,argv", [
    (edps_mlflow.cli.main, ["status", "--experiment", "x"]),
    (analysis.cli.main, ["fit", "--experiment", "x"]),
])
def test_any_password_in_the_tracking_uri_is_never_printed(password, main, argv, closed_port_uri, monkeypatch, capsys):
    uri = closed_port_uri.replace(SECRET, password)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    captured = capsys.readouterr()
    assert exit_info.value.code == 2
    assert f"user:{password}@" not in captured.out + captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "http://***:***@127.0.0.1" in lines[0], captured.err


# Printable characters, with the URI delimiters often.
_PASSWORD = st.text(st.one_of(st.sampled_from("@:/?#'\" %&=+;,[]"),
                              st.characters(min_codepoint=32, max_codepoint=0x2FF, exclude_characters="\x7f")),
                    min_size=1, max_size=24)


@given(password=_PASSWORD, scheme=st.sampled_from(["http", "https", "postgresql", "postgresql+psycopg2"]))
@settings(max_examples=300, deadline=None, derandomize=True)  # the same examples in every run
def test_the_user_information_of_a_uri_is_parsed_whatever_its_characters(password, scheme):
    uri = f"{scheme}://alice:{password}@db.example:5432/mlflow"
    assert userinfo(uri) == f"alice:{password}"
    redacted = f"{scheme}://***:***@db.example:5432/mlflow"
    # As printed by itself, inside an error line that quotes it, and as the configured store.
    assert redact_uri(uri) == redacted
    assert redact_uri(f"API request to {uri}/api/2.0/x failed", uri) == f"API request to {redacted}/api/2.0/x failed"
    with_environment = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        assert f"alice:{password}@" not in redact_uri(f"Invalid url: {uri}/api")
        from edps_mlflow.store.client import ui_link
        from edps_mlflow.store.trouble import describe_store_error

        line = describe_store_error(uri, RuntimeError(f"API request to {uri}/api/2.0/mlflow/runs failed " + "x" * 400))
        assert f"alice:{password}@" not in line and line.startswith(f"tracking store {redacted}: ")
        assert f"alice:{password}@" not in ui_link(uri, "1", "abc")
    finally:
        if with_environment is None:
            del os.environ["MLFLOW_TRACKING_URI"]
        else:
            os.environ["MLFLOW_TRACKING_URI"] = with_environment


@pytest.mark.parametrize("uri", ["sqlite:////tmp/a@b/mlflow.db", "http://host/path?x=a@b", "file:///tmp/x",
                                 "http://host:5000", "not a uri"])
def test_uris_without_user_information(uri):
    assert userinfo(uri) is None and redact_uri(uri) == uri
