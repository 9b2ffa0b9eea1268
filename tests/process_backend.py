"""A ``JobBackend`` whose jobs are plain processes on this machine: the shape of a batch-scheduler backend
(SLURM's ``sbatch``/``squeue``/``scancel``, a Kubernetes Job) in a few dozen lines, for the tests of the
queued-job executor. It knows nothing of MLflow (``makes_runs = False``): the executor makes and claims
each study's run first and the job adopts it through ``MLFLOW_RUN_ID``, as a SLURM job would."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from edps_mlflow.config import StudySpec
from edps_mlflow.executors.queued import QueuedExecutor
from edps_mlflow.mlproject import log_file_tail, study_command
from edps_mlflow.results import RunState


class ProcessJob:
    def __init__(self, process: subprocess.Popen, run_id: str, log_path: Path) -> None:
        self.process, self.run_id, self.log_path = process, run_id, log_path

    def state(self) -> RunState:
        code = self.process.poll()
        if code is None:
            return RunState.RUNNING
        return RunState.FINISHED if code == 0 else RunState.FAILED

    def log_tail(self, lines: int = 20) -> list[str]:
        return log_file_tail(self.log_path, lines)

    def cancel(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)  # `edps study` ends its runs KILLED on SIGTERM
            self.process.wait(timeout=60)

    def describe_end(self) -> str:
        return f"exit code {self.process.poll()}"


class ProcessBackend:
    makes_runs = False

    def __init__(self, tracking_uri: str) -> None:
        self.tracking_uri = tracking_uri
        self.submitted: list[ProcessJob] = []

    def describe(self) -> str:
        return "local processes (the test backend)"

    def submit(self, study: StudySpec, parameters: dict[str, str], run_id: str | None, log_path: Path) -> ProcessJob:
        assert run_id is not None  # makes_runs is False: the executor made the run
        environment = {**os.environ, "MLFLOW_TRACKING_URI": self.tracking_uri, "MLFLOW_RUN_ID": run_id}
        with open(log_path, "w") as log:
            process = subprocess.Popen(study_command(parameters), env=environment, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        job = ProcessJob(process, run_id, log_path)
        self.submitted.append(job)
        return job

    def study_workers(self, places: int) -> int | None:
        return 1

    def close(self) -> None:
        pass


class ProcessExecutor(QueuedExecutor):
    """The queued-job executor over :class:`ProcessBackend` (registered by the tests as ``processes``)."""

    backends: list[ProcessBackend] = []

    def __init__(self) -> None:
        from edps_mlflow.store.client import resolve_tracking_uri

        backend = ProcessBackend(resolve_tracking_uri())
        ProcessExecutor.backends.append(backend)
        super().__init__(backend)
