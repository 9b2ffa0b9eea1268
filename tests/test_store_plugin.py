"""MLflow opens sqlite stores through edps-mlflow's plugin (pyproject.toml's ``mlflow.tracking_store`` entry
point), so that `mlflow run` launches and `mlflow server` starting at once on a store that does not exist yet
build it once, safely, instead of racing MLflow's in-place migration (which left half-migrated stores).

The processes under test find the entry point in the installed edps-mlflow's metadata; where that install
predates the entry point (an editable install made before it), a distribution that declares it as
pyproject.toml does is put on their path, so the test checks what pyproject.toml declares either way.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import REPO, clean_environment, fresh_store, start_mlflow_server, stop_process

CREATED = "edps-mlflow: created a new tracking store at"


def _declared_entry_points() -> dict[str, str]:
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return project["entry-points"]["mlflow.tracking_store"]


def _plugin_environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a process that must see the plugin (see the module's docstring)."""
    declared = _declared_entry_points()
    installed = {point.name: point.value for point in entry_points(group="mlflow.tracking_store")}
    paths = [str(REPO)]
    if any(installed.get(name) != value for name, value in declared.items()):
        info = tmp_path / "plugin-metadata" / "edps_mlflow_store_plugin-0.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: edps-mlflow-store-plugin\nVersion: 0\n")
        (info / "entry_points.txt").write_text(
            "[mlflow.tracking_store]\n" + "".join(f"{name} = {value}\n" for name, value in declared.items()))
        paths.append(str(info.parent))
    return clean_environment(PYTHONPATH=os.pathsep.join(paths), **extra)


def test_mlflow_builds_sqlite_stores_with_the_plugin(tmp_path):
    """The builder MLflow registers for sqlite is ours; it makes a missing store once and leaves an
    existing one to MLflow."""
    assert _declared_entry_points() == {"sqlite": "edps_mlflow.store.plugin:sqlite_store"}
    script = ("import sys; from mlflow.tracking._tracking_service.utils import _tracking_store_registry as r\n"
              "from mlflow.tracking import MlflowClient\n"
              "builder = r._registry['sqlite']; print(builder.__module__, builder.__name__)\n"
              "for uri in sys.argv[1:]: print(len(MlflowClient(uri).search_experiments()))\n")
    existing = fresh_store(tmp_path / "existing" / "mlflow.db")
    result = subprocess.run([sys.executable, "-c", script, existing], cwd=tmp_path, capture_output=True, text=True,
                            env=_plugin_environment(tmp_path), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split("\n")[:2] == ["edps_mlflow.store.plugin sqlite_store", "1"]
    assert CREATED not in result.stderr


@pytest.mark.slow
def test_four_mlflow_clients_released_at_once_on_a_new_store_build_it_once(tmp_path):
    """Four processes, MLflow imported, released together to open one new store (plain MLflow: all four fail
    inside its migration and leave the file half-migrated): all open it, and it is built once, complete."""
    database = tmp_path / "new" / "mlflow.db"
    database.parent.mkdir()  # a store is built only in a folder that exists
    uri = f"sqlite:///{database}"
    go = tmp_path / "go"
    script = ("import sys, time; from pathlib import Path; from mlflow.tracking import MlflowClient\n"
              "print('ready', flush=True)\n"
              "while not Path(sys.argv[2]).exists(): time.sleep(0.01)\n"
              "print(len(MlflowClient(sys.argv[1]).search_experiments()))\n")
    clients = [subprocess.Popen([sys.executable, "-c", script, uri, str(go)], cwd=tmp_path, text=True,
                                env=_plugin_environment(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for _ in range(4)]
    assert [client.stdout.readline().strip() for client in clients] == ["ready"] * 4
    go.touch()
    outputs = [client.communicate(timeout=600) for client in clients]
    assert [client.returncode for client in clients] == [0, 0, 0, 0], [err[-2000:] for _, err in outputs]
    assert [out.strip() for out, _ in outputs] == ["1"] * 4
    assert sum(err.count(CREATED) for _, err in outputs) == 1
    _assert_complete(database)


def _assert_complete(database: Path) -> None:
    """The store at ``database`` has MLflow's newest schema, no copy a stopped migration leaves, and no
    temporary store is left beside it."""
    from mlflow.store.db.utils import _get_latest_schema_revision

    connection = sqlite3.connect(database)
    try:
        revision = connection.execute("select version_num from alembic_version").fetchone()[0]
        copies = [row[0] for row in connection.execute("select name from sqlite_master where type = 'table'")
                  if row[0].startswith("_alembic_tmp_")]
    finally:
        connection.close()
    assert revision == _get_latest_schema_revision() and copies == []
    assert not list(database.parent.glob(f".{database.name}.*")), "no temporary store is left"


@pytest.mark.slow
def test_an_mlflow_run_two_studies_and_a_server_at_once_on_a_new_store_all_succeed(tmp_path):
    """The issue's case: first uses of a store that does not exist, at once (the issue saw 4 of 4 `mlflow run`s
    fail inside MLflow's migration; how many do depends on how close together they reach it): an `mlflow run .
    -P bs=...` and the MLflow UI's server (MLflow processes: the plugin builds the store) beside two `edps study`
    commands (edps's own initialisation): all succeed, and the store is built once, complete. Four MLflow
    clients at once through the plugin alone: the test above."""
    database = tmp_path / "new" / "mlflow.db"
    database.parent.mkdir()  # a store is built only in a folder that exists
    uri = f"sqlite:///{database}"
    environment = _plugin_environment(tmp_path, MLFLOW_TRACKING_URI=uri)
    protocol = ["trials=1", "goal_error=0.06", "max_steps=60", "check_interval=20", "workers=1"]
    launches = []
    for batch_size in (16,):
        command = [sys.executable, "-m", "mlflow", "run", str(REPO), "--env-manager", "local", "-P", f"bs={batch_size}"]
        for parameter in protocol:
            command += ["-P", parameter]
        launches.append(subprocess.Popen(command, cwd=tmp_path, env=environment, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True))
    for batch_size in (32, 64):
        command = [sys.executable, "-c", "from edps_mlflow.cli import main; main()", "study", "--bs", str(batch_size),
                   "--experiment", "Default", "--trials", "1", "--goal-error", "0.06", "--max-steps", "60",
                   "--check-interval", "20", "--workers", "1"]
        launches.append(subprocess.Popen(command, cwd=tmp_path, env=environment, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True))
    started = time.monotonic()
    # Whoever builds the store sets its Default experiment's artifact root: a server that proxies artifacts
    # would make it mlflow-artifacts:/, which clients of the database itself cannot write to (MLflow's rule,
    # plugin or not). So this server keeps artifacts in a folder, as the launches would.
    server, url = start_mlflow_server(tmp_path, backend_uri=uri, PYTHONPATH=environment["PYTHONPATH"],
                                      extra_args=("--default-artifact-root", str(tmp_path / "mlruns"),
                                                  "--no-serve-artifacts"))
    try:
        outputs = [launch.communicate(timeout=900) for launch in launches]
        with urllib_request(f"{url}/ajax-api/2.0/mlflow/experiments/search?max_results=10") as response:
            assert response.status == 200
    finally:
        stop_process(server)
    seconds = time.monotonic() - started
    assert [launch.returncode for launch in launches] == [0, 0, 0], [err[-2000:] for _, err in outputs]
    logs = [out + err for out, err in outputs] + [(tmp_path / "server.log").read_text()]
    # One creation, by whichever came first: the plugin in an MLflow process says it on stderr, edps on stdout.
    assert sum(log.count("created a new tracking store at") for log in logs) == 1, [log[-1500:] for log in logs]
    _assert_complete(database)
    studies = MlflowClient(uri).search_runs(["0"], "tags.`edps.kind` = 'study'")
    assert sorted(int(run.data.tags["edps.batch_size"]) for run in studies) == [16, 32, 64]
    assert {run.info.status for run in studies} == {"FINISHED"}
    print(f"an mlflow run, 2 studies and a server at once on a new store: all succeeded in {seconds:.0f} s, "
          "one creation")


def urllib_request(url: str):
    import urllib.request

    return urllib.request.urlopen(url, timeout=30)
