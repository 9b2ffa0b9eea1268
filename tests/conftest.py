"""Shared fixtures: a private tracking store per test (a copy of one migrated per session), one real
`mlflow server` per session, and the process state every test starts from and leaves as it found it."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

# Training processes run torch on one thread (resources.configure_training_process); so do the tests that
# train in this process: on a shared or 2-core machine two threads make a tiny network 5-10x slower.
TEST_THREADS = 1


def _flushes_denormals() -> bool:
    # torch has no getter for set_flush_denormal: a denormal input reads as zero when it is on.
    return torch.tensor([1e-40]).mul(1.0).item() == 0.0


def _torch_settings() -> dict[str, object]:
    return {
        "threads": torch.get_num_threads(),
        "flush_denormal": _flushes_denormals(),
        "default_dtype": torch.get_default_dtype(),
        "grad_enabled": torch.is_grad_enabled(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
    }


def _restore_torch_settings(settings: dict[str, object]) -> None:
    torch.set_num_threads(settings["threads"])
    torch.set_flush_denormal(settings["flush_denormal"])
    torch.set_default_dtype(settings["default_dtype"])
    torch.set_grad_enabled(settings["grad_enabled"])
    torch.set_float32_matmul_precision(settings["float32_matmul_precision"])
    torch.backends.cuda.matmul.allow_tf32 = settings["matmul_allow_tf32"]
    torch.backends.cudnn.allow_tf32 = settings["cudnn_allow_tf32"]
    torch.backends.cudnn.benchmark = settings["cudnn_benchmark"]
    torch.backends.cudnn.deterministic = settings["cudnn_deterministic"]
    torch.use_deterministic_algorithms(settings["deterministic_algorithms"])


def _own_environment() -> dict[str, str]:
    # PYTEST_CURRENT_TEST is pytest's own, set anew at each phase of each test.
    return {name: value for name, value in os.environ.items() if name != "PYTEST_CURRENT_TEST"}


def pytest_configure(config: pytest.Config) -> None:
    torch.set_num_threads(TEST_THREADS)


@pytest.fixture(autouse=True)
def _leaves_the_process_as_it_found_it():
    """Whatever a test changes in this process (environment variables, e.g. MLflow's request settings
    that a command in this process applies; the working directory; torch's threads, denormal flushing and
    precision flags, which training in this process sets) is put back before the next test starts, so no
    test's outcome depends on the tests that ran before it."""
    environment = _own_environment()
    cwd = os.getcwd()
    settings = _torch_settings()
    yield
    if _torch_settings() != settings:
        _restore_torch_settings(settings)  # first: torch may set variables of its own while it does
    for name in [name for name in _own_environment() if name not in environment]:
        del os.environ[name]
    for name, value in environment.items():
        if os.environ.get(name) != value:
            os.environ[name] = value
    os.chdir(cwd)


_TRACKING_VARIABLES = ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID")


def clean_environment(**extra: str) -> dict[str, str]:
    """The environment for a subprocess under test, without inherited MLflow settings."""
    environment = {k: v for k, v in os.environ.items() if k not in _TRACKING_VARIABLES}
    environment.update(extra)
    return environment


@pytest.fixture
def sqlite_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The URI of a local sqlite store that does not exist yet (tests of what creates it, or of input
    refused before any store is touched), set as the tracking URI of this process; cwd is ``tmp_path``.
    A test that only needs a store to work in takes ``sqlite_store``."""
    for name in _TRACKING_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    return uri


class _StoreTemplate:
    """An empty sqlite store with MLflow's full schema, built once per session on first use: MLflow
    migrates a new store step by step (seconds of CPU each time), which tests that only need a store
    to work in should not pay per test. ``fresh_store`` copies it."""

    factory: pytest.TempPathFactory | None = None
    path: Path | None = None

    @classmethod
    def get(cls) -> Path:
        if cls.path is None:
            from mlflow.tracking import MlflowClient

            database = cls.factory.mktemp("store-template") / "mlflow.db"
            client = MlflowClient(f"sqlite:///{database}")
            client.search_experiments(max_results=1)  # creates and migrates the schema
            store = getattr(getattr(client, "_tracking_client", None), "store", None)
            if getattr(store, "engine", None) is not None:
                store.engine.dispose()  # no connection of this process stays open on the template
            cls.path = database
        return cls.path


@pytest.fixture(scope="session", autouse=True)
def _store_template_home(tmp_path_factory: pytest.TempPathFactory) -> None:
    _StoreTemplate.factory = tmp_path_factory


def fresh_store(database: Path) -> str:
    """A new, fully migrated, empty sqlite store at ``database`` (which must not exist); its URI. For
    tests that need a store to work in, not of how a store is created (those start from no file). The
    Default experiment's artifacts go next to the copy, as MLflow would put them creating it there."""
    if database.exists():
        raise FileExistsError(database)
    database.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_StoreTemplate.get(), database)
    connection = sqlite3.connect(database)
    try:
        with connection:
            connection.execute("update experiments set artifact_location = ? where experiment_id = 0",
                               (str(database.parent / "mlruns" / "0"),))
    finally:
        connection.close()
    return f"sqlite:///{database}"


@pytest.fixture
def sqlite_store(sqlite_uri: str) -> str:
    """``sqlite_uri`` with the store already there (``fresh_store``)."""
    return fresh_store(Path(sqlite_uri.removeprefix("sqlite:///")))


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
