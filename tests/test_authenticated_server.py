"""The set-up docs/executors.md describes for several machines: MLflow's basic-auth app, clients with
MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD. A sweep with credentials works; a client without
them (or with a wrong password) is refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import edps_here, run_edps, start_mlflow_server, stop_process

ADMIN, PASSWORD = "admin", "adm1n-Pa55word"
TINY_SWEEP = ["sweep", "--batch-sizes", "64", "--trials", "2", "--max-steps", "40", "--check-interval", "20"]


def _auth_config(directory: Path) -> Path:
    """MLflow's own basic_auth.ini with a private user database, a known admin and no anonymous access."""
    import mlflow.server.auth

    template = (Path(mlflow.server.auth.__file__).parent / "basic_auth.ini").read_text()
    lines = []
    for line in template.splitlines():
        key = line.split("=", 1)[0].strip().lstrip("# ")
        if key == "database_uri":
            line = f"database_uri = sqlite:///{directory / 'users.db'}"
        elif key == "admin_password":
            line = f"admin_password = {PASSWORD}"
        elif key == "default_permission":
            line = "default_permission = NO_PERMISSIONS"
        lines.append(line)
    path = directory / "basic_auth.ini"
    path.write_text("\n".join(lines) + "\n")
    assert f"admin_username = {ADMIN}" in path.read_text()
    return path


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):
    pytest.importorskip("flask_wtf", reason="MLflow's basic-auth app needs Flask-WTF (mlflow[auth])")
    root = tmp_path_factory.mktemp("auth-server")
    process, url = start_mlflow_server(
        root, extra_args=("--app-name", "basic-auth", "--allowed-hosts", "127.0.0.1:{port},localhost:{port}"),
        MLFLOW_AUTH_CONFIG_PATH=str(_auth_config(root)), MLFLOW_FLASK_SERVER_SECRET_KEY="test-only-key")
    yield url
    stop_process(process)


def _one_clean_line(code: int, printed: str, prefix: str = "edps: error: ") -> str:
    assert code == 2, printed[-3000:]
    assert "Traceback" not in printed
    lines = printed.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), printed
    return lines[0]


@pytest.mark.slow
def test_sweep_with_credentials_and_refusal_without(auth_server, tmp_path, monkeypatch):
    credentials = {"MLFLOW_TRACKING_USERNAME": ADMIN, "MLFLOW_TRACKING_PASSWORD": PASSWORD}
    result = run_edps(TINY_SWEEP, cwd=tmp_path, MLFLOW_TRACKING_URI=auth_server, **credentials)
    assert result.returncode == 0, result.stderr[-3000:]
    assert PASSWORD not in result.stdout + result.stderr

    for name, value in credentials.items():
        monkeypatch.setenv(name, value)
    client = MlflowClient(auth_server)
    experiment = client.get_experiment_by_name("edps/digits-simple-cnn")
    runs = client.search_runs([experiment.experiment_id])
    kinds = sorted(r.data.tags.get("edps.kind") for r in runs)
    assert kinds == ["study", "study_index", "sweep", "trial", "trial"]  # the experiment's study index run too
    assert all(r.info.status == "FINISHED" for r in runs)

    # The rest in this process (the command line's behaviour; the sweep above was a real process).
    # The credentials in the URI work as well, and are never printed (MLflow's run links would show them).
    inline = auth_server.replace("http://", f"http://{ADMIN}:{PASSWORD}@")
    for name in credentials:
        monkeypatch.delenv(name)  # the commands below must not inherit them
    code, printed = edps_here(["status", "--experiment", "edps/digits-simple-cnn"], inline)
    assert code == 0 and PASSWORD not in printed, printed

    for name, value in credentials.items():
        monkeypatch.setenv(name, value)
    runs_before = len(client.search_runs([experiment.experiment_id]))
    for name in credentials:
        monkeypatch.delenv(name)
    for environment in ({}, {"MLFLOW_TRACKING_USERNAME": ADMIN, "MLFLOW_TRACKING_PASSWORD": "wrong"}):
        line = _one_clean_line(*edps_here(["status", "--experiment", "edps/digits-simple-cnn"], auth_server,
                                          **environment))
        assert "401" in line and "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD" in line
        line = _one_clean_line(*edps_here(TINY_SWEEP, auth_server, **environment))
        assert "401" in line
    for name, value in credentials.items():
        monkeypatch.setenv(name, value)
    assert len(client.search_runs([experiment.experiment_id])) == runs_before  # the refused sweeps wrote nothing
