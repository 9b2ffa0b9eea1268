"""MLflow's request settings are set once, by a command's entry point, where MLflow reads them (the
environment), never by library code: opening a store leaves the environment as it was, and a user's own
setting wins."""

from __future__ import annotations

import os

from edps_mlflow.process_settings import CLIENT_DEFAULTS, configure_process, launcher_run_id, request_settings


def test_library_code_sets_no_request_settings(sqlite_store, monkeypatch):
    from edps_mlflow.store.client import connect, open_store

    for name in CLIENT_DEFAULTS:
        monkeypatch.delenv(name, raising=False)
    before = dict(os.environ)
    open_store(sqlite_store).search_experiments(max_results=1)
    connect(sqlite_store).search_experiments(max_results=1)
    assert dict(os.environ) == before


def test_the_entry_point_sets_them_and_a_users_own_wins(monkeypatch):
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "42")
    environment = dict(os.environ)
    configure_process(environment)
    assert environment["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == CLIENT_DEFAULTS["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]
    assert environment["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "42"
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ  # only the mapping it was given


def test_cli_main_configures_its_process(monkeypatch, capsys):
    from edps_mlflow.cli import main

    for name in CLIENT_DEFAULTS:
        monkeypatch.delenv(name, raising=False)
    main(["workloads"])
    assert request_settings() == CLIENT_DEFAULTS  # the autouse fixture restores the environment afterwards


def test_the_launcher_run_is_read_in_one_place(monkeypatch):
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    assert launcher_run_id() is None
    monkeypatch.setenv("MLFLOW_RUN_ID", "")
    assert launcher_run_id() is None
    monkeypatch.setenv("MLFLOW_RUN_ID", "abc")
    assert launcher_run_id() == "abc"



def test_an_outage_setting_that_is_not_a_positive_number_is_one_line_before_any_work(sqlite_uri):
    from conftest import edps_here

    for bad in ("0", "-5", "abc", "nan", "inf"):
        code, printed = edps_here(["status"], sqlite_uri, EDPS_OUTAGE_SECONDS=bad)
        assert code == 2 and printed.strip().count("\n") == 0, printed
        assert f"EDPS_OUTAGE_SECONDS must be a number of seconds above 0, got {bad!r}" in printed, printed
    assert not os.path.exists(sqlite_uri.removeprefix("sqlite:///"))  # refused before the store was touched
    code, printed = edps_here(["workloads"], sqlite_uri, EDPS_OUTAGE_SECONDS="0.5")
    assert code == 0, printed
