"""Studies as runs of this project's MLproject, submitted through MLflow Projects (docs/executors.md).

    edps sweep --executor mlflow-project --workers 2 --env-manager virtualenv
    edps sweep --executor mlflow-project --backend kubernetes --backend-config kubernetes.json

``ProjectLaunch`` is where the runs go, checked in one line per mistake before the sweep touches the store;
``submit`` makes one study a run of the ``main`` entry point, and ``SubmittedStudy`` is the handle the queued
executor (executors/queued.py) waits on. The Kubernetes Job that MLflow will create is built and checked here.
MLflow is imported only inside the functions that use it: the command line imports this module at start-up.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import sys
import tempfile
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any, Iterator

import yaml

from edps_mlflow.config import StudySpec
from edps_mlflow.errors import EdpsError
from edps_mlflow.fields import KEY_FIELDS, STUDY_FIELDS
from edps_mlflow.results import RunState
from edps_mlflow.uris import redact_uri

ENTRY_POINT = "main"
MLPROJECT = "MLproject"
# MLflow's keys of a Kubernetes backend config, and ours (base-image: what the project's image is built FROM).
_KUBE_KEYS = ("kube-job-template-path", "repository-uri", "kube-context", "base-image")
_REQUIRED = "'kube-job-template-path', 'repository-uri' and 'base-image'"
LOG_TAIL_LINES = 15
_TAIL_BYTES = 64 * 1024  # the end of a log is all a report needs (a long study's log has many progress lines)


class Backend(str, Enum):
    LOCAL = "local"
    KUBERNETES = "kubernetes"


class EnvManager(str, Enum):  # MLflow's environment managers of a run on the local backend
    LOCAL = "local"
    VIRTUALENV = "virtualenv"
    UV = "uv"
    CONDA = "conda"


def project_directory() -> Path:
    """This project: the directory with the MLproject next to the package (a source checkout)."""
    directory = Path(__file__).resolve().parents[1]
    if not (directory / MLPROJECT).is_file():
        raise EdpsError(f"--executor mlflow-project runs this project's MLproject, but there is none next to the "
                        f"installed package ({directory}): install edps-mlflow from a source checkout "
                        f"(pip install -e .)")
    return directory


@dataclass(frozen=True)
class KubernetesConfig:
    """MLflow's Kubernetes backend config (a JSON file) and the job template it names, checked."""

    job_template_path: Path
    repository_uri: str
    base_image: str
    kube_context: str | None
    job_template: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def load(cls, path: str | Path) -> "KubernetesConfig":
        path = Path(path).expanduser()
        where = f"backend config {path}"
        config = _read(path, where, json.loads, "JSON")
        if not isinstance(config, dict):
            raise EdpsError(f"{where} must be a JSON object with {_REQUIRED}")
        unknown = sorted(set(config) - set(_KUBE_KEYS))
        if unknown:
            raise EdpsError(f"{where} has unknown keys {', '.join(map(repr, unknown))}; known: "
                            f"{', '.join(map(repr, _KUBE_KEYS))}")
        for key in ("kube-job-template-path", "repository-uri", "base-image"):
            if not isinstance(config.get(key), str) or not config[key].strip():
                raise EdpsError(f"{where} needs {key!r} (a non-empty string)")
        context, repository = config.get("kube-context"), config["repository-uri"]
        if context is not None and (not isinstance(context, str) or not context.strip()):
            raise EdpsError(f"{where}: 'kube-context' must be a non-empty string when given")
        if any(c.isspace() for c in repository) or ":" in repository.rsplit("/", 1)[-1]:
            raise EdpsError(f"{where}: 'repository-uri' must be an image repository without a tag (MLflow tags "
                            f"each image itself), got {repository!r}")
        # MLflow opens the path as given, from the working directory: made absolute once for both.
        template_path = Path(config["kube-job-template-path"]).expanduser().absolute()
        return cls(template_path, repository.strip(), config["base-image"].strip(), context,
                   load_job_template(template_path))

    def mlflow_config(self) -> dict[str, str]:
        """What ``mlflow.projects.run(backend_config=...)`` gets."""
        config = {"kube-job-template-path": str(self.job_template_path), "repository-uri": self.repository_uri}
        return {**config, "kube-context": self.kube_context} if self.kube_context else config


def _read(path: Path, where: str, parse: Any, language: str) -> Any:
    try:
        return parse(path.read_text())
    except FileNotFoundError:
        raise EdpsError(f"{where} does not exist") from None
    except (OSError, UnicodeDecodeError) as error:
        raise EdpsError(f"{where} cannot be read: {error}") from None
    except (ValueError, yaml.YAMLError) as error:  # json.JSONDecodeError is a ValueError
        raise EdpsError(f"{where} is not {language}: {' '.join(str(error).split())}") from None


def load_job_template(path: Path) -> dict[str, Any]:
    """A Kubernetes Job template as MLflow fills it in: a batch/v1 Job with a namespace and a first
    container (MLflow sets its name, image, command and appends the run's environment)."""
    where = f"Kubernetes job template {path}"
    template = _read(path, where, yaml.safe_load, "YAML")
    if not isinstance(template, dict) or template.get("kind") != "Job" or template.get("apiVersion") != "batch/v1":
        raise EdpsError(f"{where} must be a Kubernetes Job (apiVersion: batch/v1, kind: Job)")
    metadata = template.get("metadata")
    if not isinstance(metadata, dict) or not isinstance(metadata.get("namespace"), str) or not metadata["namespace"]:
        raise EdpsError(f"{where} needs metadata.namespace (MLflow submits the job there)")
    pod = (template.get("spec") or {}).get("template", {}) if isinstance(template.get("spec"), dict) else {}
    pod_spec = pod.get("spec") if isinstance(pod, dict) else None
    containers = pod_spec.get("containers") if isinstance(pod_spec, dict) else None
    if not isinstance(containers, list) or not containers or not isinstance(containers[0], dict):
        raise EdpsError(f"{where} needs spec.template.spec.containers with at least one container (MLflow runs the "
                        f"project in the first)")
    if pod_spec.get("restartPolicy") not in ("Never", "OnFailure"):
        raise EdpsError(f"{where} needs spec.template.spec.restartPolicy Never or OnFailure (a Job's pods may not "
                        f"restart Always)")
    env = containers[0].get("env", [])
    if not isinstance(env, list) or not all(isinstance(e, dict) and "name" in e for e in env):
        raise EdpsError(f"{where}: the first container's env must be a list of {{name, value}} entries")
    return template


@dataclass(frozen=True)
class ProjectLaunch:
    """Where ``--executor mlflow-project`` submits its runs. Validated on construction: bad input is
    one line before any work."""

    backend: Backend = Backend.LOCAL
    env_manager: EnvManager = EnvManager.LOCAL
    backend_config: str | None = None
    kubernetes: KubernetesConfig | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "backend", Backend(self.backend))  # the command line offers only their values
        object.__setattr__(self, "env_manager", EnvManager(self.env_manager))
        config = self.backend_config.strip() if self.backend_config else None
        object.__setattr__(self, "backend_config", config or None)
        if self.backend is Backend.LOCAL and self.backend_config:
            raise EdpsError("--backend-config is for --backend kubernetes (the local backend takes none)")
        if self.backend is Backend.KUBERNETES:
            if not self.backend_config:
                raise EdpsError(f"--backend kubernetes needs --backend-config FILE: a JSON file with {_REQUIRED} "
                                "(docs/executors.md has an example)")
            if self.env_manager is not EnvManager.LOCAL:
                raise EdpsError("--env-manager is for the local backend: on Kubernetes the run's environment is "
                                "the project's Docker image")
            object.__setattr__(self, "kubernetes", KubernetesConfig.load(self.backend_config))
        elif self.env_manager is EnvManager.CONDA:
            # MLflow refuses it for a project with python_env.yaml, as ours is.
            raise EdpsError("--env-manager conda cannot run this project: its MLproject declares python_env.yaml, "
                            "which MLflow runs with local, virtualenv or uv")

    def check_environment(self, tracking_uri: str) -> None:
        """What must exist on this machine before the first submission (one line when it does not)."""
        if self.backend is Backend.KUBERNETES:
            target = os.environ.get("KUBE_MLFLOW_TRACKING_URI") or tracking_uri
            if not target.startswith(("http://", "https://")):
                raise EdpsError(f"--backend kubernetes: the jobs cannot reach the tracking store "
                                f"{redact_uri(target)} (not a server); use a tracking server "
                                f"(MLFLOW_TRACKING_URI=https://...) or set KUBE_MLFLOW_TRACKING_URI to its address "
                                f"as the cluster sees it")
            missing = [name for name in ("kubernetes", "docker") if importlib.util.find_spec(name) is None]
            if missing:
                raise EdpsError(f"--backend kubernetes needs the Python packages {' and '.join(missing)} "
                                f"(MLflow's Kubernetes backend uses them): pip install {' '.join(missing)}")
            if shutil.which("docker") is None:
                raise EdpsError("--backend kubernetes needs Docker (MLflow builds and pushes the project's image); "
                                "no docker executable on PATH")
            return
        if shutil.which("mlflow") is None:
            raise EdpsError("--executor mlflow-project needs the mlflow command on PATH (MLflow's local backend "
                            "starts `mlflow run` for each run); none found")
        if self.env_manager is EnvManager.UV and shutil.which("uv") is None:
            raise EdpsError("--env-manager uv needs the uv executable on PATH; none found (pip install uv)")
        if self.env_manager is EnvManager.VIRTUALENV and shutil.which("pyenv") is None:
            raise EdpsError("--env-manager virtualenv needs pyenv on PATH (MLflow installs the Python of "
                            "python_env.yaml with it); none found")

    def describe(self) -> str:
        if self.backend is Backend.KUBERNETES:
            return f"backend kubernetes, images pushed to {self.kubernetes.repository_uri}"
        return f"backend local, env manager {self.env_manager.value}"


def study_parameters(spec: StudySpec, sweep_run_id: str, sweep_key: str, data_dir: str | None,
                     full_trials: bool, device: str | None, workers: int | None,
                     accept_unverified_data: bool = False) -> dict[str, str]:
    """The ``main`` entry point's parameters for one study of a sweep: every field of fields.STUDY_FIELDS that
    has one, spelled as the command line reads it, so that every value of the study key reads back exactly
    (the study checks: its key must be the one the sweep submitted)."""
    values = {**{f.name: getattr(spec, f.name) for f in KEY_FIELDS}, "sweep_run": sweep_run_id,
              "sweep_key": sweep_key, "full_trials": full_trials, "device": device, "workers": workers,
              "accept_unverified_data": accept_unverified_data,
              # The entry point runs in the project directory: a relative path of ours would point elsewhere there.
              "data_dir": str(Path(data_dir).expanduser().absolute()) if data_dir else None}
    return {f.parameter: _typed(values[f.name], f.default) for f in STUDY_FIELDS if f.parameter}


def _typed(value: Any, default: str | None) -> str:
    """``value`` as the command line reads it back (None: the option's default)."""
    if value is None:
        return default or ""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, tuple):  # names, or a goal ladder's numbers; empty: the option's default
        return ",".join(repr(v) if isinstance(v, float) else str(v) for v in value) if value else default or ""
    return str(value)


def study_command(parameters: dict[str, str], python: str | None = None) -> list[str]:
    """The ``main`` entry point's command line with ``parameters`` as MLflow Projects runs it, for a batch system
    that runs it itself (a ``JobBackend`` whose jobs are plain processes); ``python``: the interpreter."""
    command = yaml.safe_load((project_directory() / MLPROJECT).read_text())["entry_points"][ENTRY_POINT]["command"]
    words = shlex.split(command.format(**{name: shlex.quote(value) for name, value in parameters.items()}))
    if words and words[0] == "python":
        words[0] = python or sys.executable
    return words


def absolute_store_uri(tracking_uri: str) -> str:
    """A ``sqlite:///`` URI with a relative path made absolute (from this working directory)."""
    prefix = "sqlite:///"
    path, _, query = tracking_uri.removeprefix(prefix).partition("?")
    if not tracking_uri.startswith(prefix) or not path or path == ":memory:" or Path(path).is_absolute():
        return tracking_uri
    return prefix + str(Path(path).absolute()) + (f"?{query}" if query else "")


def stage_docker_project(source: Path, base_image: str) -> Path:
    """A copy of the project (in a temporary directory) whose MLproject runs in ``base_image`` (``docker_env``):
    MLflow's Kubernetes backend builds the job's image FROM it with the copy inside, the sweep's own code."""
    staged = Path(tempfile.mkdtemp(prefix="edps-kubernetes-project-"))
    shutil.copytree(source / "edps_mlflow", staged / "edps_mlflow",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "python_env.yaml"):
        if (source / name).is_file():
            shutil.copy2(source / name, staged / name)
    text = (source / MLPROJECT).read_text()
    image = json.dumps(base_image)  # a YAML string, quoted
    (staged / MLPROJECT).write_text(text.replace("python_env: python_env.yaml", f"docker_env:\n  image: {image}"))
    return staged


@contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """This process's stdout and stderr descriptors point at ``path`` inside the block: MLflow starts ``mlflow
    run`` with our own descriptors, and its output is all a failed run leaves on the local backend."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {descriptor: os.dup(descriptor) for descriptor in (1, 2)}
    try:
        with open(path, "ab", buffering=0) as log:
            for descriptor in saved:
                os.dup2(log.fileno(), descriptor)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for descriptor, copy in saved.items():
            os.dup2(copy, descriptor)
            os.close(copy)


def log_file_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last lines of a job's log file (a progress line rewritten in place counts once, as shown last)."""
    try:
        with open(path, "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - _TAIL_BYTES))
            text = log.read().decode(errors="replace")
    except OSError as error:
        return [f"(no log: {error})"]
    kept = [line.rstrip("\r").rsplit("\r", 1)[-1] for line in text.split("\n")]
    kept = [line for line in kept if line.strip()]
    return kept[-lines:]


class SubmittedStudy:
    """A submitted run: its id, its state, its log, and cancel."""

    def __init__(self, submitted: Any, log_path: Path | None) -> None:
        self._submitted = submitted
        self.run_id: str = submitted.run_id
        self.log_path = log_path

    def state(self) -> RunState:
        """RUNNING until the run's process (or job) ends, then FINISHED, FAILED or KILLED."""
        from mlflow.entities import RunStatus

        try:
            status = self._submitted.get_status()
        except Exception as error:  # noqa: BLE001 - the Kubernetes API's errors have no common base here
            raise EdpsError(f"cannot read the state of the submitted run {self.run_id}: {_first_line(error)}") from None
        name = RunStatus.to_string(status) if isinstance(status, int) else str(status)
        return RunState.RUNNING if name == "SCHEDULED" else RunState(name)

    def describe_end(self) -> str:
        process = getattr(self._submitted, "command_proc", None)  # the local backend's `mlflow run`
        code = process.returncode if process is not None else None
        return f"exit code {code}" if code is not None else self.state().value

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> list[str]:
        """The last lines of the run's output; where it has none here (Kubernetes), where to find it."""
        if self.log_path is None:
            job = getattr(self._submitted, "_job_name", None)
            namespace = getattr(self._submitted, "_job_namespace", None)
            return [f"(the log is the job's: kubectl logs job/{job} -n {namespace})"] if job else []
        return log_file_tail(self.log_path, lines)

    def cancel(self) -> None:
        with suppress(Exception):  # a run that is already gone needs no cancelling
            self._submitted.cancel()


def submit(launch: ProjectLaunch, project: Path, parameters: dict[str, str], tracking_uri: str,
           experiment_id: str, log_path: Path | None) -> SubmittedStudy:
    """One study as a run of the ``main`` entry point, not waited for; on the local backend its output goes to
    ``log_path``. An error of MLflow or the backend is one line."""
    import mlflow
    import mlflow.projects
    from mlflow.exceptions import MlflowException

    # mlflow.projects.run creates the run in the store of the fluent API: make it the sweep's, and give
    # the run the same store (its entry point runs in the project directory, not in ours).
    mlflow.set_tracking_uri(absolute_store_uri(tracking_uri))
    arguments: dict[str, Any] = {"uri": str(project), "entry_point": ENTRY_POINT, "parameters": parameters,
                                 "experiment_id": experiment_id, "backend": launch.backend.value,
                                 "synchronous": False}
    try:
        if launch.backend is Backend.KUBERNETES:
            return SubmittedStudy(mlflow.projects.run(**arguments, backend_config=launch.kubernetes.mlflow_config()),
                                  None)
        with _output_to(log_path):
            submitted = mlflow.projects.run(**arguments, env_manager=launch.env_manager.value)
        return SubmittedStudy(submitted, log_path)
    except Exception as error:  # noqa: BLE001 - docker and kubernetes client errors have no common base
        if not isinstance(error, (MlflowException, OSError, ImportError)) and \
                type(error).__module__.split(".")[0] not in ("docker", "kubernetes", "urllib3", "requests"):
            raise
        raise EdpsError(f"mlflow.projects.run ({launch.describe()}): {_first_line(error)}") from None


def _first_line(error: Exception) -> str:
    return redact_uri((str(error).strip().splitlines() or [type(error).__name__])[0])


def preview_kubernetes_job(launch: ProjectLaunch, project: Path, parameters: dict[str, str],
                           tracking_uri: str) -> dict[str, Any]:
    """The Job MLflow would submit for a study with ``parameters`` from the staged ``project`` (a placeholder
    for its image, not built yet), checked: a bad template fails here, before any work."""
    from mlflow.projects.utils import load_project

    spec = load_project(str(project))
    command = spec.get_entry_point(ENTRY_POINT).compute_command(parameters, None)
    if not spec.docker_env:
        raise EdpsError(f"the project staged for Kubernetes ({project}) has no docker_env")
    # The Job as MLflow's Kubernetes backend fills in its template (mlflow.projects.kubernetes): the job's name,
    # and the first container's name, image, command and environment.
    job = json.loads(json.dumps(launch.kubernetes.job_template))
    job["metadata"]["name"] = f"{spec.name}-{datetime.now().strftime('%Y-%m-%d-%H-%M-%S-%f')}"
    environment = {"MLFLOW_RUN_ID": "<run id>", "MLFLOW_EXPERIMENT_ID": "<experiment id>",
                   "MLFLOW_TRACKING_URI": os.environ.get("KUBE_MLFLOW_TRACKING_URI") or tracking_uri}
    container = job["spec"]["template"]["spec"]["containers"][0]
    container.update({"name": spec.name, "image": f"{launch.kubernetes.repository_uri}:<tag>@sha256:<digest>",
                      "command": shlex.split(command)})
    container["env"] = [*container.get("env", []), *({"name": k, "value": v} for k, v in environment.items())]
    return job
