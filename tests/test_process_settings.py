"""MLflow's request settings are set once, by a command's entry point, where MLflow reads them (the
environment), never by library code: opening a store leaves the environment as it was, and a user's own
setting wins."""

from __future__ import annotations

import gc
import os

import pytest

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



_COLLECTOR_PROBE = """
import atexit, gc
before = gc.get_threshold()
atexit.register(lambda: print("collector", gc.get_threshold() if gc.get_threshold() != before else "unchanged",
                              "frozen" if gc.get_freeze_count() else "not frozen",
                              "running" if gc.isenabled() else "paused", flush=True))
from {module} import main
{call}
"""


_CHILD_COLLECTOR_PROBE = """
import gc
from analysis import forked
from edps_mlflow.process_settings import pause_collection
pause_collection()
with forked.writing_in_parallel(workers=2, preload=("json",)):
    child = forked.call("gc", "isenabled")
print("child", child.result(), "parent", gc.isenabled())
"""


def test_a_commands_process_collects_less_often_and_skips_the_collection_at_its_end(sqlite_store, tmp_path,
                                                                                   monkeypatch):
    """Both console entry points: the cycle collector runs every COLLECTION_THRESHOLDS allocations, and what is
    alive when the command ends is frozen (the shutdown does not go through it). A command run inside another
    program (main called with its arguments, as tests do) leaves that program's collector alone."""
    import subprocess
    import sys

    from conftest import REPO, clean_environment
    from edps_mlflow.process_settings import COLLECTION_THRESHOLDS

    for module, command in (("edps_mlflow.cli", "status"), ("analysis.cli", "table")):
        done = subprocess.run([sys.executable, "-c", _COLLECTOR_PROBE.format(module=module, call="main()"), command,
                               "--experiment", "none"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              env=clean_environment(PYTHONPATH=str(REPO), MLFLOW_TRACKING_URI=sqlite_store))
        lines = [text for text in done.stdout.splitlines() if text.startswith("collector")]
        # edps-analyze pauses the collector until it has read the store: here the read was refused
        state = "paused" if module == "analysis.cli" else "running"
        assert lines == [f"collector {COLLECTION_THRESHOLDS} frozen {state}"], (module, done.stdout, done.stderr)
    # a read that succeeds: what it made is frozen and the collector runs again
    done = subprocess.run([sys.executable, "-c", _COLLECTOR_PROBE.format(module="analysis.cli", call="main()"), "report",
                           "--csv", str(REPO / "tests" / "fixtures" / "synthetic_steps.csv"), "--bootstrap", "0",
                           "--output", str(tmp_path / "report.md")], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env=clean_environment(PYTHONPATH=str(REPO)))
    lines = [text for text in done.stdout.splitlines() if text.startswith("collector")]
    assert done.returncode == 0 and lines == [f"collector {COLLECTION_THRESHOLDS} frozen running"], (done.stdout,
                                                                                                   done.stderr)
    # the children that draw a report's figures, forked while it is paused, run it once they have imported
    done = subprocess.run([sys.executable, "-c", _CHILD_COLLECTOR_PROBE], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=clean_environment(PYTHONPATH=str(REPO)))
    assert done.stdout.split() == ["child", "True", "parent", "False"], (done.stdout, done.stderr)
    from analysis.cli import main as analyze
    from edps_mlflow.cli import main as edps

    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_store)
    before = gc.get_threshold(), gc.get_freeze_count()
    for main, command in ((edps, "status"), (analyze, "table")):
        with pytest.raises(SystemExit):  # the experiment does not exist: exit 2 after the command ran
            main([command, "--experiment", "none"])
    assert (gc.get_threshold(), gc.get_freeze_count()) == before
