"""`edps sweep --executor mlflow-project`: studies as runs of the MLproject through MLflow Projects.

Real `mlflow run` processes (local backend, `--env-manager local`), real training on digits, real
SIGKILLs. Kubernetes has no cluster here: its config, job template and the job MLflow would submit
are built and checked, and what is missing on this machine is one line.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from conftest import REPO, clean_environment, edps_here, fresh_store, run_edps, stop_groups_unlocked
from edps_mlflow.cli import cli, main

GRID = ["sweep", "--batch-sizes", "16,64", "--trials", "2", "--goal-error", "0.06", "--max-steps", "300",
        "--log-interval", "5", "--workers", "2"]
PROJECT = ["--executor", "mlflow-project"]
EXPERIMENT = "project-executor-test"


def _results(uri: str) -> dict:
    """study key -> (steps_to_result, batch size) of the FINISHED study runs; one per key, none RUNNING."""
    client = MlflowClient(uri)
    experiment_id = client.get_experiment_by_name(EXPERIMENT).experiment_id
    runs = client.search_runs([experiment_id], run_view_type=ViewType.ALL, max_results=5000)
    assert not [r for r in runs if r.info.status == "RUNNING"], "no run may be left RUNNING"
    studies = [r for r in runs if r.data.tags.get("edps.kind") == "study" and r.info.status == "FINISHED"]
    keys = [r.data.tags["edps.study_key"] for r in studies]
    assert len(keys) == len(set(keys)), "one finished study run per study key"
    trials = [r.data.tags["edps.trial_key"] for r in runs
              if r.data.tags.get("edps.kind") == "trial" and r.info.status == "FINISHED"]
    assert len(trials) == len(set(trials)), "no finished trial trained twice"
    return {r.data.tags["edps.study_key"]: (r.data.metrics.get("steps_to_result"), r.data.tags["edps.batch_size"])
            for r in studies}


@pytest.fixture(scope="module")
def local_reference(tmp_path_factory):
    """The grid with the local executor: the results the project executor must give."""
    directory = tmp_path_factory.mktemp("local-reference")
    uri = fresh_store(directory / "mlflow.db")
    result = run_edps([*GRID, "--experiment", EXPERIMENT], cwd=directory, MLFLOW_TRACKING_URI=uri)
    assert result.returncode == 0, result.stderr[-3000:]
    return _results(uri)


def _sweep(args: list[str], cwd: Path, **environment: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", "from edps_mlflow.cli import main; main()", *args],
        cwd=cwd, env=clean_environment(PYTHONPATH=str(REPO), **environment),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _adopted_studies(client: MlflowClient) -> dict[str, str]:
    """batch size -> run id of the RUNNING study runs whose entry point has started (it logged its settings)."""
    experiment = client.get_experiment_by_name(EXPERIMENT)
    if experiment is None:
        return {}
    runs = client.search_runs([experiment.experiment_id], "tags.`edps.kind` = 'study' and attributes.status = 'RUNNING'")
    return {r.data.tags["edps.batch_size"]: r.info.run_id for r in runs if "edps.run.device" in r.data.tags}


def _wait_for_adopted(client: MlflowClient, process: subprocess.Popen, batch_sizes: set[str]) -> dict[str, str]:
    """Wait until the studies of these batch sizes run in their submitted runs; batch size -> run id."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        adopted = _adopted_studies(client)
        if batch_sizes <= set(adopted):
            return adopted
        time.sleep(0.5)
    pytest.fail("the submitted studies never started")


def _study_process(run_id: str) -> int:
    """The pid of the `edps study` process that trains the submitted run ``run_id``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"MLFLOW_RUN_ID={run_id}".encode() in environ and b"study" in command and b"mlflow" not in command[:3]:
            if any(b"edps_mlflow" in part for part in command):
                return int(entry.name)
    raise AssertionError(f"no study process of run {run_id}")


@pytest.mark.slow
def test_project_runs_give_the_local_results_and_a_failed_run_is_reported(local_reference, tmp_path):
    """Each study a nested run of the MLproject, one at a time (--workers 1); the first study's process
    killed: reported with its run id and log, and the sweep goes on with the second; the rerun retries
    the first; results equal the local executor's."""
    uri = fresh_store(tmp_path / "mlflow.db")  # the store exists before the sweep starts (see test_sweep.py)
    client = MlflowClient(uri)
    process = _sweep([*GRID, *PROJECT, "--workers", "1", "--experiment", EXPERIMENT], tmp_path,
                     MLFLOW_TRACKING_URI=uri)
    victim = _wait_for_adopted(client, process, {"64"})["64"]  # larger batches are submitted first
    os.kill(_study_process(victim), signal.SIGKILL)
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 2, (stdout[-3000:], stderr[-3000:])
    # At most --workers submitted at once: the second study once the first ended; the sweep went on with it.
    assert stdout.index(f"submitted run {victim} failed") < stdout.index("bs=16: submitted as run"), stdout[-3000:]
    assert "bs=16: steps_to_result" in stdout
    # The failure, as it happened: the run, how it ended and the last lines of its log.
    report = stdout[stdout.index(f"submitted run {victim} failed"):]
    print(f"the failure as the sweep reported it:\n{report[:2500]}")
    assert "the last lines of its log:" in report.splitlines()[0] and "Run (ID" in report, report[:2000]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edps: error: 1 of 2 studies failed"), stderr[-3000:]
    failed = client.get_run(victim)
    assert failed.info.status == "FAILED" and "mlflow-run.log" in [a.path for a in client.list_artifacts(victim)]

    again = run_edps([*GRID, *PROJECT, "--experiment", EXPERIMENT], cwd=tmp_path, timeout=600,
                     MLFLOW_TRACKING_URI=uri)
    assert again.returncode == 0, (again.stdout[-3000:], again.stderr[-3000:])
    assert "plan: 1 done" in again.stdout and again.stdout.count("submitted as run") == 1, again.stdout[-3000:]
    assert _results(uri) == local_reference
    experiment_id = client.get_experiment_by_name(EXPERIMENT).experiment_id
    sweeps = client.search_runs([experiment_id], "tags.`edps.kind` = 'sweep'")
    assert len(sweeps) == 1 and sweeps[0].info.status == "FINISHED"
    studies = client.search_runs([experiment_id], "tags.`edps.kind` = 'study' and attributes.status = 'FINISHED'")
    for study in studies:
        tags = study.data.tags
        # The run MLflow Projects made, nested under the sweep run, with the entry point's params.
        assert tags["mlflow.parentRunId"] == sweeps[0].info.run_id == tags["edps.submitted_by"]
        assert tags["mlflow.project.backend"] == "local" and tags["mlflow.project.entryPoint"] == "main"
        assert study.data.params["bs"] == tags["edps.batch_size"]
        assert study.data.params["sweep_run"] == tags["edps.submitted_by"]
    code, printed = edps_here(["doctor", "--experiment", EXPERIMENT], uri)
    assert code == 0, printed
    code, printed = edps_here([*GRID, *PROJECT, "--experiment", EXPERIMENT], uri)
    assert code == 0 and "already complete: 2 studies done" in printed, printed[-3000:]


@pytest.mark.slow
def test_a_killed_sweep_resumes_by_waiting_for_its_submitted_runs(tmp_path):
    """SIGKILL of the sweep's process group: its submitted runs (their own sessions) keep training; the
    resumed sweep finds them live and waits for them instead of submitting again."""
    uri = fresh_store(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    lease = {"MLFLOW_TRACKING_URI": uri, "EDPS_LEASE_SECONDS": "6"}
    # A goal no trial reaches, so each trial trains to the cap.
    grid = [*GRID[:GRID.index("--goal-error")], "--goal-error", "0.001", "--max-steps", "1000", "--log-interval",
            "5", "--workers", "2"]
    process = _sweep([*grid, *PROJECT, "--experiment", EXPERIMENT], tmp_path, **lease)
    adopted = _wait_for_adopted(client, process, {"16", "64"})
    os.killpg(process.pid, signal.SIGKILL)
    killed = time.monotonic()
    # The resumed sweep plans once the killed sweep's run is past its lease (6 s), and must find the studies
    # still training then, whatever the machine's speed: they are held still (SIGSTOP) while it starts, and
    # woken 4 s after the kill, so that their heartbeats are fresh when it looks (a race on a loaded machine
    # otherwise: CI saw them finish first).
    groups = {os.getpgid(_study_process(run_id)) for run_id in adopted.values()}
    assert os.getpgrp() not in groups  # the submitted runs run in sessions of their own
    stop_groups_unlocked(groups, tmp_path / "mlflow.db")  # stopped holding the lock, they would lock the test out
    try:
        process.communicate()
        assert all(client.get_run(r).info.status == "RUNNING" for r in adopted.values())
        resumed_process = _sweep([*grid, *PROJECT, "--experiment", EXPERIMENT, "--wait"], tmp_path, **lease)
        time.sleep(max(0.0, killed + 4 - time.monotonic()))
    finally:
        for group in groups:
            os.killpg(group, signal.SIGCONT)
    stdout, stderr = resumed_process.communicate(timeout=600)
    resumed = subprocess.CompletedProcess(resumed_process.args, resumed_process.returncode, stdout, stderr)
    assert resumed.returncode == 0, (resumed.stdout[-3000:], resumed.stderr[-3000:])
    assert "submitted as run" not in resumed.stdout, resumed.stdout[-3000:]
    waited = [r for r in adopted.values() if f"the live run {r} of another process is training it" in resumed.stdout]
    assert waited, resumed.stdout[-3000:]
    experiment_id = client.get_experiment_by_name(EXPERIMENT).experiment_id
    studies = client.search_runs([experiment_id], "tags.`edps.kind` = 'study'", run_view_type=ViewType.ALL)
    assert sorted(r.info.run_id for r in studies) == sorted(adopted.values()), "no study run was submitted twice"
    results = _results(uri)  # one FINISHED study per key, nothing left RUNNING
    assert len(results) == 2 and all(steps is None for steps, _ in results.values())


@pytest.mark.slow
def test_an_interrupted_sweep_cancels_the_runs_it_submitted(tmp_path):
    """SIGTERM (as Ctrl-C) of the sweep: it cancels its submitted runs, which end KILLED or FAILED."""
    uri = fresh_store(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    process = _sweep([*GRID, *PROJECT, "--experiment", EXPERIMENT], tmp_path, MLFLOW_TRACKING_URI=uri)
    adopted = _wait_for_adopted(client, process, {"16", "64"})
    os.kill(process.pid, signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130 and "edps: interrupted" in stderr, stderr[-3000:]
    experiment_id = client.get_experiment_by_name(EXPERIMENT).experiment_id
    deadline = time.monotonic() + 60
    while client.search_runs([experiment_id], "attributes.status = 'RUNNING'") and time.monotonic() < deadline:
        time.sleep(1)  # a cancelled study marks its runs as it stops
    assert not client.search_runs([experiment_id], "attributes.status = 'RUNNING'"), "nothing is left RUNNING"
    assert {client.get_run(r).info.status for r in adopted.values()} <= {"KILLED", "FAILED"}
    for run_id in adopted.values():  # the study processes are gone
        while time.monotonic() < deadline:
            try:
                _study_process(run_id)
            except AssertionError:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"the study process of run {run_id} is still there")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_an_interrupt_during_a_store_call_is_raised_when_the_call_ends(signum):
    """A cancelled study's SIGTERM, or a Ctrl-C, never lands inside a store transaction (which could keep its lock)."""
    from edps_mlflow.interrupts import raise_interrupt, store_call

    previous = signal.signal(signum, raise_interrupt)
    try:
        finished = []
        with pytest.raises(KeyboardInterrupt):
            with store_call():
                os.kill(os.getpid(), signum)
                time.sleep(0.2)  # the handler has run by now, and held the interrupt back
                finished.append(True)
        assert finished == [True]
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signum)  # outside a store call: at once
            time.sleep(5)
    finally:
        signal.signal(signum, previous)


def test_a_second_ctrl_c_during_a_hanging_store_call_stops_at_once():
    from edps_mlflow.interrupts import raise_interrupt, store_call

    previous = signal.signal(signal.SIGINT, raise_interrupt)
    try:
        interrupted_inside = []
        with pytest.raises(KeyboardInterrupt):
            with store_call():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)  # the first press: held back
                try:
                    os.kill(os.getpid(), signal.SIGINT)  # the second press: raised inside the call
                    time.sleep(5)
                except KeyboardInterrupt:
                    interrupted_inside.append(True)
                    raise
        assert interrupted_inside == [True]
    finally:
        signal.signal(signal.SIGINT, previous)


# ---- bad input: one line, before any work ------------------------------------------------------
JOB_TEMPLATE = """\
apiVersion: batch/v1
kind: Job
metadata:
  name: "{replaced-with-mlflow-project-name}"
  namespace: edps
spec:
  ttlSecondsAfterFinished: 3600
  backoffLimit: 0
  template:
    spec:
      containers:
        - name: "{replaced-with-mlflow-project-name}"
          image: "{replaced-with-image-uri}"
          command: ["{replaced-with-entry-point-command}"]
          env:
            - {name: EDPS_DATA_DIR, value: /data}
          resources:
            limits: {cpu: "4", memory: 8Gi}
      restartPolicy: Never
"""


def _kubernetes_files(directory: Path, template: str = JOB_TEMPLATE, **config: str) -> Path:
    (directory / "job.yaml").write_text(template)
    values = {"kube-job-template-path": str(directory / "job.yaml"), "repository-uri": "registry.example.org/edps",
              "base-image": "registry.example.org/torch-mlflow:2.13", **config}
    path = directory / "kubernetes.json"
    path.write_text(json.dumps({k: v for k, v in values.items() if v != "-"}))
    return path


def _refused(arguments: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", "--batch-sizes", "16", *arguments])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edps: error: "), lines
    return lines[0]


KUBERNETES = ["--executor", "mlflow-project", "--backend", "kubernetes", "--backend-config"]
BAD = [
    (["--executor", "mlflow-project", "--backend", "slurm"], "'slurm' is not one of 'local', 'kubernetes'"),
    (["--executor", "mlflow-project", "--env-manager", "pip"], "'pip' is not one of 'local', 'virtualenv'"),
    (["--executor", "mlflow-project", "--backend", "kubernetes"], "--backend kubernetes needs --backend-config FILE"),
    (["--executor", "mlflow-project", "--backend-config", "x.json"], "--backend-config is for --backend kubernetes"),
    (["--executor", "mlflow-project", "--env-manager", "conda"], "--env-manager conda cannot run this project"),
    (["--env-manager", "virtualenv"], "options of --executor mlflow-project"),
    ([*KUBERNETES, "{dir}/none.json"],
     "none.json does not exist"),
    ([*KUBERNETES, "{dir}/garbage.json"],
     "garbage.json is not JSON"),
    ([*KUBERNETES, "{config:repository-uri=-}"],
     "needs 'repository-uri' (a non-empty string)"),
    ([*KUBERNETES, "{config:repository-uri=r/e:1}"],
     "must be an image repository without a tag"),
    ([*KUBERNETES, "{config:kube-job-template-path=/no/job.yaml}"],
     "Kubernetes job template /no/job.yaml does not exist"),
    ([*KUBERNETES, "{template:kind: Job=>kind: Pod}"],
     "must be a Kubernetes Job (apiVersion: batch/v1, kind: Job)"),
    ([*KUBERNETES, "{template:  namespace: edps\n=>}"],
     "needs metadata.namespace"),
    ([*KUBERNETES, "{template:restartPolicy: Never=>restartPolicy: Always}"],
     "restartPolicy Never or OnFailure"),
    ([*KUBERNETES, "{config}"],
     "the jobs cannot reach the tracking store sqlite:///"),
]


@pytest.mark.parametrize("arguments,message", BAD)
def test_bad_project_executor_input_is_one_line_before_any_work(arguments, message, sqlite_uri, tmp_path,
                                                                  monkeypatch, capsys):
    monkeypatch.setenv("EDPS_TRAINING_ENVIRONMENT", "1")  # no re-exec: we run in this process
    (tmp_path / "garbage.json").write_text("{not json")
    resolved = []
    for argument in arguments:
        if argument.startswith("{config"):
            config = dict(part.split("=", 1) for part in argument[1:-1].split(":", 1)[1:] if part)
            argument = str(_kubernetes_files(tmp_path, **config))
        elif argument.startswith("{template:"):
            old, new = argument[len("{template:"):-1].split("=>")
            assert old in JOB_TEMPLATE
            argument = str(_kubernetes_files(tmp_path, JOB_TEMPLATE.replace(old, new, 1)))
        resolved.append(argument.replace("{dir}", str(tmp_path)))
    assert message in _refused(resolved, capsys)
    assert not Path(sqlite_uri.removeprefix("sqlite:///")).exists(), "no store is touched"


def test_kubernetes_tools_missing_here_are_one_line(sqlite_uri, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EDPS_TRAINING_ENVIRONMENT", "1")
    monkeypatch.setenv("KUBE_MLFLOW_TRACKING_URI", "http://mlflow.edps.svc:5000")
    import importlib.util

    missing = [name for name in ("kubernetes", "docker") if importlib.util.find_spec(name) is None]
    if not missing and shutil.which("docker"):
        pytest.skip("the Kubernetes backend's tools are all installed here")
    line = _refused(["--executor", "mlflow-project", "--backend", "kubernetes", "--backend-config",
                     str(_kubernetes_files(tmp_path))], capsys)
    assert "--backend kubernetes needs" in line
    assert not Path(sqlite_uri.removeprefix("sqlite:///")).exists()


def test_env_manager_uv_without_uv_is_one_line(sqlite_uri, monkeypatch, capsys):
    if shutil.which("uv"):
        pytest.skip("uv is installed here")
    monkeypatch.setenv("EDPS_TRAINING_ENVIRONMENT", "1")
    assert "needs the uv executable on PATH" in _refused(["--executor", "mlflow-project", "--env-manager", "uv"], capsys)


# ---- the Kubernetes job, built and checked without a cluster --------------------------------------
def test_the_kubernetes_job_is_the_template_filled_in_as_mlflow_does(tmp_path, monkeypatch, request):
    from mlflow.projects.utils import load_project

    from edps_mlflow.mlproject import ProjectLaunch, preview_kubernetes_job, stage_docker_project, study_parameters
    from edps_mlflow.sweep import SweepSpec

    monkeypatch.setenv("KUBE_MLFLOW_TRACKING_URI", "http://mlflow.edps.svc:5000")
    launch = ProjectLaunch("kubernetes", "local", str(_kubernetes_files(tmp_path, **{"kube-context": "lab"})))
    assert launch.kubernetes.mlflow_config() == {
        "kube-job-template-path": str(tmp_path / "job.yaml"), "repository-uri": "registry.example.org/edps",
        "kube-context": "lab"}
    staged = stage_docker_project(REPO, launch.kubernetes.base_image)
    request.addfinalizer(lambda: shutil.rmtree(staged, ignore_errors=True))
    project = load_project(str(staged))
    assert project.docker_env == {"image": "registry.example.org/torch-mlflow:2.13"}
    assert (staged / "edps_mlflow" / "cli.py").read_text() == (REPO / "edps_mlflow" / "cli.py").read_text()
    study = SweepSpec.build("digits-simple-cnn", ("sgd",), (16,), trials=2).studies()[0]
    job = preview_kubernetes_job(launch, staged, study_parameters(study, "sweeprun", "sweepkey", None, False,
                                                                  None, None), "sqlite:///ignored.db")
    assert job["metadata"]["namespace"] == "edps" and job["metadata"]["name"].startswith("edps-mlflow-")
    assert job["spec"]["ttlSecondsAfterFinished"] == 3600  # the rest of the template is kept
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["name"] == "edps-mlflow" and container["image"].startswith("registry.example.org/edps:")
    assert container["command"][:5] == ["python", "-m", "edps_mlflow.cli", "study", "--bs"]
    assert container["command"][container["command"].index("--sweep-run") + 1] == "sweeprun"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["EDPS_DATA_DIR"] == "/data" and env["MLFLOW_TRACKING_URI"] == "http://mlflow.edps.svc:5000"
    assert {"MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID"} <= set(env)
    assert container["resources"] == {"limits": {"cpu": "4", "memory": "8Gi"}}
    try:
        from mlflow.projects.kubernetes import _get_kubernetes_job_definition
    except ImportError:
        return  # MLflow's own builder needs the kubernetes and docker packages
    import yaml

    theirs = _get_kubernetes_job_definition("edps-mlflow", "registry.example.org/edps:<tag>", "sha256:<digest>",
                                            container["command"], {k: v for k, v in env.items() if k != "EDPS_DATA_DIR"},
                                            yaml.safe_load(JOB_TEMPLATE))
    theirs["metadata"]["name"] = job["metadata"]["name"]
    assert theirs == job


def test_the_documented_kubernetes_example_is_valid(monkeypatch):
    from edps_mlflow.mlproject import ProjectLaunch

    monkeypatch.chdir(REPO)
    launch = ProjectLaunch("kubernetes", "local", "docs/kubernetes.json")
    assert launch.kubernetes.job_template["metadata"]["namespace"] == "edps"
    assert launch.kubernetes.job_template_path == REPO / "docs" / "kubernetes-job.yaml"


# ---- the entry points pass everything through ---------------------------------------------------
def test_study_parameters_make_the_same_study_key_in_the_entry_point():
    from mlflow.projects.utils import load_project

    from edps_mlflow.config import StudySpec
    from edps_mlflow.fields import SPEC_ARGUMENTS
    from edps_mlflow.mlproject import study_parameters
    from edps_mlflow.sweep import SweepSpec

    project = load_project(str(REPO))
    sweep = SweepSpec.build("digits-simple-cnn", ("sgd", "nesterov"), (16, 1024), (0.0, 0.7), trials=3,
                            goal_error=0.1 + 0.2, max_steps=321, check_interval=7, seed=5, probes=("lipschitz",),
                            probe_interval=50)
    every = SweepSpec.build("digits-simple-cnn", ("sgd",), (16,), (0.9,), probes=("lipschitz",),
                            probe_trials="all")
    ladder = SweepSpec.build("digits-simple-cnn", ("sgd",), (16,), (0.5,), goals=(0.2, 0.1 + 0.2 / 3))
    for study in sweep.studies() + every.studies() + ladder.studies():
        parameters = study_parameters(study, "run1", sweep.sweep_key, "/data", True, "cpu", 1)
        command = project.get_entry_point("main").compute_command(parameters, None)
        arguments = shlex.split(command)[3:]
        context = cli.commands["study"].make_context("study", arguments[1:])
        p = context.params
        rebuilt = StudySpec.build(**{name: value for name, value in p.items() if name in SPEC_ARGUMENTS})
        assert rebuilt.study_key == study.study_key
        assert (p["sweep_run"], p["sweep_key"], p["workers"], p["device"], p["full_trials"]) == (
            "run1", sweep.sweep_key, 1, "cpu", True)


def test_the_sweep_entry_point_passes_the_executor_options_through():
    from mlflow.projects.utils import load_project

    command = load_project(str(REPO)).get_entry_point("sweep").compute_command(
        {"executor": "mlflow-project", "workers": "3", "backend": "kubernetes", "backend_config": "/k/cfg.json",
         "env_manager": "local"}, None)
    p = cli.commands["sweep"].make_context("sweep", shlex.split(command)[4:]).params
    assert (p["executor"], p["workers"], p["backend"], p["backend_config"], p["env_manager"]) == (
        "mlflow-project", 3, "kubernetes", "/k/cfg.json", "local")
    defaults = load_project(str(REPO)).get_entry_point("sweep").compute_command({}, None)
    p = cli.commands["sweep"].make_context("sweep", shlex.split(defaults)[4:]).params
    assert (p["executor"], p["workers"], p["backend"], p["backend_config"], p["env_manager"]) == (
        "local", None, "local", "", "local")


def test_a_study_adopts_only_the_run_submitted_for_its_own_key(sqlite_store, monkeypatch):
    from edps_mlflow.errors import EdpsError
    from edps_mlflow.sweep import SweepSpec
    from edps_mlflow.store.client import open_store
    from edps_mlflow.store.ownership.claim import launcher_run
    from edps_mlflow.store.write.study import claim_submitted_run

    client = open_store(sqlite_store)
    experiment_id = client.create_experiment("adopt")
    first, second = SweepSpec.build("digits-simple-cnn", ("sgd",), (16, 64), trials=2).studies()
    run_id = client.create_run(experiment_id).info.run_id
    monkeypatch.setenv("MLFLOW_RUN_ID", run_id)
    assert launcher_run(client, first.study_key).submitted is False  # the empty run `mlflow run` makes
    claim_submitted_run(client, run_id, first, "sweeprun", "sweepkey")
    adopted = launcher_run(client, first.study_key)
    assert adopted.run_id == run_id and adopted.experiment_name == "adopt" and adopted.submitted
    with pytest.raises(EdpsError, match="was submitted for study"):
        launcher_run(client, second.study_key)
    with pytest.raises(EdpsError, match="only the empty RUNNING run"):
        launcher_run(client)  # not a study: a sweep never adopts a study's run
    client.set_terminated(run_id, "FAILED")
    with pytest.raises(EdpsError, match="is FAILED"):
        launcher_run(client, first.study_key)


def test_paths_given_relative_to_the_sweep_stay_the_sweeps_in_the_project_directory(tmp_path, monkeypatch):
    from edps_mlflow.mlproject import absolute_store_uri, study_parameters
    from edps_mlflow.sweep import SweepSpec

    monkeypatch.chdir(tmp_path)
    assert absolute_store_uri("sqlite:///runs/mlflow.db") == f"sqlite:///{tmp_path}/runs/mlflow.db"
    for uri in (f"sqlite:///{tmp_path}/a.db", "http://127.0.0.1:5000", "sqlite:///:memory:"):
        assert absolute_store_uri(uri) == uri
    study = SweepSpec.build("digits-simple-cnn", ("sgd",), (16,), trials=2).studies()[0]
    assert study_parameters(study, "r", "k", "data", False, None, None)["data_dir"] == str(tmp_path / "data")
    assert study_parameters(study, "r", "k", None, False, None, None)["data_dir"] == ""


def test_a_submitted_run_tells_its_state_exit_code_and_the_end_of_its_log(tmp_path):
    from mlflow.projects.submitted_run import LocalSubmittedRun

    from edps_mlflow.mlproject import SubmittedStudy
    from edps_mlflow.results import RunState

    log = tmp_path / "run.log"
    log.write_text("".join(f"line {i}\n" for i in range(20_000)) + "[ 1.0s] trials 0/2\r[ 2.0s] trials 1/2\r\nboom\n")
    failing = SubmittedStudy(LocalSubmittedRun("run-a", subprocess.Popen(["false"])), log)
    failing._submitted.command_proc.wait()
    assert failing.state() is RunState.FAILED and failing.describe_end() == "exit code 1"
    # A progress line rewritten in place keeps its last state.
    assert failing.log_tail(3) == ["line 19999", "[ 2.0s] trials 1/2", "boom"]
    running = SubmittedStudy(LocalSubmittedRun("run-b", subprocess.Popen(["sleep", "30"], start_new_session=True)), None)
    assert running.state() is RunState.RUNNING
    running.cancel()
    assert running.state() is RunState.FAILED and running.log_tail() == []
