"""The ``mlflow-project`` executor: each pending study a run of the MLproject's ``main`` entry point,
submitted through MLflow Projects to its local backend (an ``mlflow run`` process per study) or to
Kubernetes (a job per study), scheduled by the queued-job executor.

    edps sweep --executor mlflow-project --workers 2 --batch-sizes 16,64
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TextIO

from edps_mlflow.config import StudySpec
from edps_mlflow.executors.base import SweepRun
from edps_mlflow.executors.queued import QueuedExecutor
from edps_mlflow.mlproject import (Backend, ProjectLaunch, SubmittedStudy, preview_kubernetes_job, project_directory,
                                   stage_docker_project, study_parameters, submit)
from edps_mlflow.progress import SweepProgress
from edps_mlflow.resources import available_cores
from edps_mlflow.store.client import resolve_tracking_uri
from edps_mlflow.sweep_spec import SweepOptions, SweepSpec


class MlflowProjectsBackend:
    """MLflow Projects as a ``JobBackend``: ``mlflow.projects.run(..., synchronous=False)`` per study."""

    makes_runs = True

    def __init__(self, launch: ProjectLaunch, tracking_uri: str, experiment_id: str) -> None:
        self.launch, self.tracking_uri, self.experiment_id = launch, tracking_uri, experiment_id
        self.source = project_directory()
        # Kubernetes builds the job's image from a copy of the project whose MLproject has docker_env.
        self.project = (stage_docker_project(self.source, launch.kubernetes.base_image)
                        if launch.backend is Backend.KUBERNETES else self.source)

    def describe(self) -> str:
        if self.launch.backend is Backend.KUBERNETES:
            return f"Kubernetes jobs ({self.launch.describe()})"
        return f"runs of {self.source / 'MLproject'} ({self.launch.describe()})"

    def submit(self, study: StudySpec, parameters: dict[str, str], run_id: str | None,
               log_path: Path) -> SubmittedStudy:
        local = self.launch.backend is Backend.LOCAL
        return submit(self.launch, self.project, parameters, self.tracking_uri, self.experiment_id,
                      log_path if local else None)

    def study_workers(self, places: int) -> int | None:
        # On this machine the submitted studies share its cores; a Kubernetes pod sizes its own.
        return max(1, available_cores() // places) if self.launch.backend is Backend.LOCAL else None

    def close(self) -> None:
        if self.project != self.source:
            # MLflow built each job's image from the staged copy when it submitted the job.
            shutil.rmtree(self.project, ignore_errors=True)


class MlflowProjectExecutor:
    """Studies as MLflow Projects runs, at most ``--workers`` at once."""

    def check(self, spec: SweepSpec, options: SweepOptions) -> None:
        """The project, the backend's and environment manager's tools, and on Kubernetes the job MLflow would submit."""
        project = project_directory()
        launch = options.project
        tracking_uri = resolve_tracking_uri()
        launch.check_environment(tracking_uri)
        if launch.backend is Backend.KUBERNETES:
            staged = stage_docker_project(project, launch.kubernetes.base_image)
            try:
                preview_kubernetes_job(launch, staged, study_parameters(
                    spec.studies()[0], "<sweep run id>", spec.sweep_key, options.data_dir, options.full_trials,
                    options.device, None), tracking_uri)
            finally:
                shutil.rmtree(staged, ignore_errors=True)

    def run(self, studies: list[StudySpec], sweep: SweepRun, options: SweepOptions, progress: SweepProgress,
            out: TextIO) -> list[str]:
        backend = MlflowProjectsBackend(options.project, sweep.tracking_uri, sweep.experiment_id)
        return QueuedExecutor(backend).run(studies, sweep, options, progress, out)
