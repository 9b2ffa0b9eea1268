"""Shared fixtures: a private tracking store per test (a copy of one migrated per session), one real
`mlflow server` per session, and the process state every test starts from and leaves as it found it."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

# Training processes run torch on one thread (resources.configure_training_process); so do the tests that
# train in this process: on a shared or 2-core machine two threads make a tiny network 5-10x slower.
TEST_THREADS = 1


def _flushes_denormals() -> bool:
    # torch has no getter for set_flush_denormal: a denormal input reads as zero when it is on (a float32
    # denormal: 1e-40 is a normal float64, whatever default dtype a test left behind).
    return torch.tensor([1e-40], dtype=torch.float32).mul(1.0).item() == 0.0


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


_TORCH_SETTERS = {
    "threads": torch.set_num_threads,
    "flush_denormal": torch.set_flush_denormal,
    "default_dtype": torch.set_default_dtype,
    "grad_enabled": torch.set_grad_enabled,
    "float32_matmul_precision": torch.set_float32_matmul_precision,
    "matmul_allow_tf32": lambda value: setattr(torch.backends.cuda.matmul, "allow_tf32", value),
    "cudnn_allow_tf32": lambda value: setattr(torch.backends.cudnn, "allow_tf32", value),
    "cudnn_benchmark": lambda value: setattr(torch.backends.cudnn, "benchmark", value),
    "cudnn_deterministic": lambda value: setattr(torch.backends.cudnn, "deterministic", value),
    "deterministic_algorithms": torch.use_deterministic_algorithms,
}


def _restore_torch_settings(settings: dict[str, object]) -> None:
    now = _torch_settings()
    for name, setter in _TORCH_SETTERS.items():
        if now[name] != settings[name]:  # only what changed: the first use_deterministic_algorithms costs ~2.5 CPU s
            setter(settings[name])


def _own_environment() -> dict[str, str]:
    # PYTEST_CURRENT_TEST is pytest's own, set anew at each phase of each test.
    return {name: value for name, value in os.environ.items() if name != "PYTEST_CURRENT_TEST"}


def _pin_xdist_worker() -> None:
    """Under xdist (``-n N``) each worker and every process its tests start run on cores of their own: with
    at least N cores, a share of them each; with more workers than cores, one core each, dealt round-robin
    (``-n 4`` on the 2-core CI machine: two workers a core). Each command under test then sizes its workers
    and threads to the cores it sees, as it would on a machine of that size, instead of two commands each
    starting a process per core of a machine they share. Measured on the 2-core machine: two sweeps at once
    cost a third less CPU and wall time pinned, and the whole suite 28 minutes pinned against 37 unpinned.
    Two workers a core keep both cores busy while a test waits (on a lease, a server, a paused process)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    index, count = int(worker.removeprefix("gw")), int(count)
    share = len(cores) // count
    os.sched_setaffinity(0, cores[index * share:(index + 1) * share] if share >= 1 else [cores[index % len(cores)]])


def pytest_configure(config: pytest.Config) -> None:
    _pin_xdist_worker()
    torch.set_num_threads(TEST_THREADS)
    if config.getoption("cpu_durations") is not None:
        config.pluginmanager.register(CpuDurations(config.getoption("cpu_durations")), "edps-cpu-durations")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow tests first: run in parallel (``-n``), the longest tests then start while the short ones fill
    the other workers, instead of one of them starting last and running alone. Tests never depend on their
    order (``_leaves_the_process_as_it_found_it``)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-durations", type=int, default=None, metavar="N",
                     help="show the N tests and fixtures that cost the most CPU seconds (0: all), with the "
                          "session's total; a test's JUnit entry gets its CPU seconds as a property")


def _cpu_seconds() -> tuple[float, float]:
    """CPU seconds of this process, and of the child processes it has waited for (their own waited-for
    children included). Wall time on a shared machine measures the others' load; this does not. A child
    still running, or never waited for (e.g. a server's worker killed with its process group), is not
    counted."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def _since(start: tuple[float, float, float]) -> tuple[float, float, float]:
    own, children = _cpu_seconds()
    return own - start[0], children - start[1], time.monotonic() - start[2]


def _now() -> tuple[float, float, float]:
    return (*_cpu_seconds(), time.monotonic())


def _wall_floor(own: float, children: float, cores: int) -> float:
    """The least wall time ``own`` + ``children`` CPU seconds can take: this process is one thread of
    training or waiting, the children share the cores."""
    return max(own, (own + children) / cores)


class CpuDurations:
    """``--cpu-durations N``: CPU seconds (this process + its children) per test, its set-up, call and
    tear-down, and per fixture set-up (a session or module fixture counts once, where it is built), beside
    wall seconds; and the floor those CPU seconds put on the wall time of a machine with 2 cores."""

    CORES = 2  # the CI machine's

    def __init__(self, shown: int) -> None:
        self.shown = shown
        self.start = _now()
        self.tests: dict[str, dict[str, tuple[float, float, float]]] = {}
        self.fixtures: dict[tuple[str, str], list[float]] = {}

    def _measured(self, item: pytest.Item, phase: str):
        start = _now()
        yield
        phases = self.tests.setdefault(item.nodeid, {})
        phases[phase] = _since(start)
        if phase == "teardown":
            item.user_properties.append(("cpu_seconds", f"{sum(o + c for o, c, _ in phases.values()):.2f}"))
            # Under xdist the summary is written by the controller, which sees only the reports: the phases ride
            # along (own, children, wall per phase).
            item.user_properties.append(("cpu_phases", {name: list(value) for name, value in phases.items()}))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "teardown" or not hasattr(report, "node"):  # only a controller's reports carry node
            return
        for name, value in report.user_properties:
            if name == "cpu_phases":
                self.tests[report.nodeid] = {phase: tuple(numbers) for phase, numbers in value.items()}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item):
        yield from self._measured(item, "setup")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):
        yield from self._measured(item, "call")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item):
        yield from self._measured(item, "teardown")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef):
        start = _now()  # the fixtures it requests are set up before this hook runs
        yield
        own, children, _ = _since(start)
        entry = self.fixtures.setdefault((fixturedef.argname, fixturedef.scope), [0, 0.0])
        entry[0] += 1
        entry[1] += own + children

    def pytest_terminal_summary(self, terminalreporter) -> None:
        write = terminalreporter.write_line
        own, children, wall = _since(self.start)
        rows = []
        for node, phases in self.tests.items():
            test_own, test_children = (sum(p[i] for p in phases.values()) for i in (0, 1))
            rows.append((test_own + test_children, test_own, test_children, sum(p[2] for p in phases.values()),
                         node, phases))
        rows.sort(reverse=True)
        floor = sum(_wall_floor(row[1], row[2], self.CORES) for row in rows)
        terminalreporter.write_sep("=", "cpu durations")
        write(f"{len(rows)} tests: {own + children:.0f} CPU s ({own:.0f} in this process, {children:.0f} in child "
              f"processes) in {wall:.0f} s wall; on {self.CORES} cores the tests take at least {floor:.0f} s")
        write("   cpu s   (own  children)   wall s  cpu s setup/call/teardown  test")
        for cpu, test_own, test_children, test_wall, node, phases in rows[:self.shown or None]:
            split = "/".join(f"{sum(phases.get(p, (0.0, 0.0))[:2]):.1f}" for p in ("setup", "call", "teardown"))
            write(f"{cpu:8.1f} ({test_own:6.1f} {test_children:7.1f}) {test_wall:8.1f}  {split:>23}  {node}")
        write("   cpu s   built  fixture (scope)")
        fixtures = sorted(((cpu, count, name, scope) for (name, scope), (count, cpu) in self.fixtures.items()),
                          reverse=True)
        for cpu, count, name, scope in fixtures[:self.shown or None]:
            write(f"{cpu:8.1f} {count:7d}  {name} ({scope})")


@contextlib.contextmanager
def process_state_kept() -> Iterator[None]:
    """Whatever changes in this process inside the block (environment variables, e.g. MLflow's request
    settings that a command in this process applies; the working directory; torch's threads, denormal
    flushing and precision flags, which training in this process sets) is put back when it ends."""
    environment = _own_environment()
    cwd = os.getcwd()
    settings = _torch_settings()
    try:
        yield
    finally:
        if _torch_settings() != settings:
            _restore_torch_settings(settings)  # first: torch may set variables of its own while it does
        for name in [name for name in _own_environment() if name not in environment]:
            del os.environ[name]
        for name, value in environment.items():
            if os.environ.get(name) != value:
                os.environ[name] = value
        os.chdir(cwd)


@pytest.fixture(autouse=True)
def _leaves_the_process_as_it_found_it() -> Iterator[None]:
    """What a test changes in this process is put back before the next test starts, so no test's outcome
    depends on the tests that ran before it (tests/test_fixtures.py checks the promise)."""
    with process_state_kept():
        yield


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


@pytest.fixture(scope="session", autouse=True)
def _private_caches(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The user's caches (data fingerprints, pruning scores, downloaded data under ``~/.cache``) are not the
    suite's: a session gets its own, so no test reads what an earlier session, or a parallel worker, left
    there, and the suite writes nothing into the home folder. Set before the first test, so the per-test
    environment check takes it as the environment."""
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))
    for name in ("EDPS_SCORE_CACHE", "EDPS_DATA_DIR"):
        os.environ.pop(name, None)


def built_once(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], Any]) -> Any:
    """What ``build(folder)`` returns (JSON-serialisable), built once per session: under xdist by the first worker
    that asks, in a folder every worker of the session shares, while the others wait for it and read it. A module
    fixture alone is built once per worker that runs one of the module's tests (each of them a whole sweep)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return build(factory.mktemp(name))
    from filelock import FileLock

    answer = factory.getbasetemp().parent / f"built-once-{name}.json"  # in the session's folder, above the workers'
    with FileLock(f"{answer}.lock"):
        if not answer.exists():  # a worker whose build failed left none: the next one builds anew, and says why
            # In the building worker's own new folder, which the others can read: a failed build's leftovers are
            # never in the way of the next try.
            answer.write_text(json.dumps(build(factory.mktemp(name))))
    return json.loads(answer.read_text())


def sqlite_locked(database: Path) -> bool:
    """Whether a process holds a lock on the sqlite file (no other process can write until it lets go)."""
    connection = sqlite3.connect(database, timeout=0.5)
    try:
        connection.execute("BEGIN EXCLUSIVE")
        connection.rollback()
        return False
    except sqlite3.OperationalError:
        return True
    finally:
        connection.close()


def stop_groups_unlocked(groups: Iterable[int], database: Path | None) -> None:
    """SIGSTOP these process groups at a moment when none holds a lock on the sqlite ``database`` (None: any
    moment): a process stopped inside a transaction keeps its lock, and every other process on the store,
    the test's own client included, waits for it until "database is locked"."""
    groups = list(groups)
    for _ in range(50):
        for group in groups:
            os.killpg(group, signal.SIGSTOP)
        if database is None or not sqlite_locked(database):
            return
        for group in groups:
            os.killpg(group, signal.SIGCONT)
        time.sleep(0.1)
    pytest.fail("the processes held the database lock at every try")


def fresh_store(database: Path, default_artifacts: str | None = None) -> str:
    """A new, fully migrated, empty sqlite store at ``database`` (which must not exist); its URI. For
    tests that need a store to work in, not of how a store is created (those start from no file). The
    Default experiment's artifacts go next to the copy, as MLflow would put them creating it there, or to
    ``default_artifacts`` (a server's)."""
    if database.exists():
        raise FileExistsError(database)
    database.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_StoreTemplate.get(), database)
    connection = sqlite3.connect(database)
    try:
        with connection:
            connection.execute("update experiments set artifact_location = ? where experiment_id = 0",
                               (default_artifacts or str(database.parent / "mlruns" / "0"),))
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
    if backend_uri is None:
        # The store copied from the session's template (a migration costs the server 3-4 CPU-seconds; tests of
        # a server building its store pass their own URI), with the Default experiment's artifacts where the
        # server would put them: proxied.
        database = root / "server.db"
        if not database.exists():
            fresh_store(database, default_artifacts="mlflow-artifacts:/0")
        backend_uri = f"sqlite:///{database}"
    environment = clean_environment(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", **extra_environment)
    log = open(root / "server.log", "a")
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", backend_uri,
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


def edps_here(args: list[str], tracking_uri: str, **environment: str) -> tuple[int, str]:
    """`edps <args>` in this process against ``tracking_uri``, with ``environment`` added: (exit code, what it
    printed). For commands whose outcome is the command line's, not a process boundary's (doctor, status, a
    refusal), where a process of their own would add only its start-up (about 4 CPU-seconds of imports); a
    test of a command's process behaviour runs it with ``run_edps``. The signal handlers the command installs
    and the environment are put back (the autouse fixture puts back what the command itself sets)."""
    import contextlib
    import io

    from edps_mlflow.cli import main

    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    added = {"MLFLOW_TRACKING_URI": tracking_uri, "EDPS_TRAINING_ENVIRONMENT": "1", **environment}
    saved = {name: os.environ.get(name) for name in added}
    os.environ.update(added)
    printed = io.StringIO()
    code = 0
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            main(list(args))
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return code, printed.getvalue()


def run_edps(args: list[str], cwd: Path, timeout: float = 300, **environment: str) -> subprocess.CompletedProcess:
    """Run the real `edps` console entry point in a subprocess."""
    return subprocess.run(
        [sys.executable, "-c", "from edps_mlflow.cli import main; main()", *args],
        cwd=cwd, env=clean_environment(PYTHONPATH=str(REPO), **environment), capture_output=True, text=True,
        timeout=timeout,
    )
