"""Shared fixtures: a private tracking store per test, and one real `mlflow server` per session."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

_TRACKING_VARIABLES = ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID")


def clean_environment(**extra: str) -> dict[str, str]:
    """The environment for a subprocess under test, without inherited MLflow settings."""
    environment = {k: v for k, v in os.environ.items() if k not in _TRACKING_VARIABLES}
    environment.update(extra)
    return environment


@pytest.fixture
def sqlite_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh local sqlite store for this test, set as the tracking URI of this process."""
    for name in _TRACKING_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    return uri


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_mlflow_server(root: Path, backend_uri: str | None = None, extra_args: tuple[str, ...] = (),
                        port: int | None = None, **extra_environment: str) -> tuple[subprocess.Popen, str]:
    """A real `mlflow server` over HTTP (1 worker, no job runner) with proxied artifacts, in its own
    process group (``os.killpg`` stops it with its workers); ``extra_args`` (e.g. ``--app-name basic-auth``,
    where "{port}" is replaced by its port) and environment added."""
    port = port or _free_port()
    environment = clean_environment(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", **extra_environment)
    log = open(root / "server.log", "a")
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", backend_uri or f"sqlite:///{root / 'server.db'}",
         "--artifacts-destination", str(root / "artifacts"), *(a.replace("{port}", str(port)) for a in extra_args)],
        stdout=log, stderr=subprocess.STDOUT, env=environment, cwd=root, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return process, url
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
        time.sleep(0.5)


def stop_process(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the server's own workers, if any are left
    except (ProcessLookupError, PermissionError):
        pass


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A real `mlflow server` process over HTTP, shared by the session; yields its URL."""
    process, url = start_mlflow_server(tmp_path_factory.mktemp("mlflow-server"))
    yield url
    stop_process(process)


def run_edps(args: list[str], cwd: Path, timeout: float = 300, **environment: str) -> subprocess.CompletedProcess:
    """Run the real `edps` console entry point in a subprocess."""
    return subprocess.run(
        [sys.executable, "-c", "from edps_mlflow.cli import main; main()", *args],
        cwd=cwd, env=clean_environment(PYTHONPATH=str(REPO), **environment), capture_output=True, text=True,
        timeout=timeout,
    )
