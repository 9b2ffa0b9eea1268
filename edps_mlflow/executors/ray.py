"""The ``ray`` executor: each study a Ray task on a cluster (``--ray-address``) or a local Ray instance. Ray
retries lost workers (a task is idempotent: its study's claim finds the work done or live), and a resumed
sweep covers what is left."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, TextIO

from edps_mlflow.config import StudySpec
from edps_mlflow.errors import EdpsError
from edps_mlflow.executors.base import SweepRun, run_study_task, study_label, study_tasks
from edps_mlflow.process_settings import request_settings
from edps_mlflow.progress import SweepProgress
from edps_mlflow.resources import ALLOCATOR_ENVIRONMENT, available_cores, cuda_devices
from edps_mlflow.sweep_spec import SweepOptions, SweepSpec
from edps_mlflow.uris import redact_uri
from edps_mlflow.workloads import MODULES_ENV


class RayExecutor:
    """Ray tasks, one study each: one GPU per study where there are GPUs, else one CPU."""

    def __init__(self) -> None:
        self._in_session = False  # within session(): one Ray instance for every run()

    @staticmethod
    def workers(options: SweepOptions) -> int:
        """One per GPU of this machine, else ``--workers`` or one per core."""
        return _layout(options)[1]

    def check(self, spec: SweepSpec, options: SweepOptions) -> None:
        try:
            import ray  # noqa: F401
        except ImportError:
            raise EdpsError("the ray executor needs Ray: pip install 'edps-mlflow[ray]'") from None

    @contextlib.contextmanager
    def session(self, options: SweepOptions, out: TextIO) -> Iterator[None]:
        """Ray started (or reached) once for every run() inside (an adaptive sweep's rounds), shut down after."""
        import ray

        self._start(options, out)
        self._in_session = True
        try:
            yield
        finally:
            self._in_session = False
            ray.shutdown()

    def run(self, studies: list[StudySpec], sweep: SweepRun, options: SweepOptions, progress: SweepProgress,
            out: TextIO) -> list[str]:
        import ray

        if not self._in_session:
            with self.session(options, out):
                return self.run(studies, sweep, options, progress, out)
        gpus, _, threads = _layout(options)
        labels = {s.study_key: study_label(s) for s in studies}
        remote = ray.remote(num_gpus=1.0 if gpus else 0.0, num_cpus=1.0, max_retries=3)(run_study_task)
        pending = [remote.remote(task) for task in study_tasks(studies, sweep, options, threads)]
        for _ in pending:
            progress.started_study()
        while pending:
            sweep.require_ours()
            ready, pending = ray.wait(pending, num_returns=1, timeout=1.0)
            if not ready:
                progress.render()
            for reference in ready:
                report = ray.get(reference)
                progress.finished_study(report, labels[report.study_key])
        return []

    @staticmethod
    def _start(options: SweepOptions, out: TextIO) -> None:
        import ray

        _, workers, _ = _layout(options)
        # Ray's workers do not inherit this process's environment: pass what training and the store client need.
        environment = {name: os.environ[name] for name in ALLOCATOR_ENVIRONMENT if name in os.environ}
        environment.update({**request_settings(), "OMP_NUM_THREADS": "1"})
        if os.environ.get(MODULES_ENV):  # workloads named by package.module:NAME (an installed one needs nothing)
            environment[MODULES_ENV] = os.environ[MODULES_ENV]
        init: dict[str, Any] = {"runtime_env": {"env_vars": environment}, "include_dashboard": False,
                                "log_to_driver": False, "ignore_reinit_error": True}
        if options.ray_address:
            init["address"] = options.ray_address
        else:
            init["num_cpus"] = workers
        try:
            ray.init(**init)
        except (ConnectionError, RuntimeError) as error:
            raise EdpsError(f"cannot start or reach Ray at {redact_uri(options.ray_address or 'a local instance')}: "
                            f"{redact_uri(str(error))}") from None
        where = f"connected to {redact_uri(options.ray_address)}" if options.ray_address else \
            f"started a local instance with {workers} CPU(s)"
        print(f"ray: {where}", file=out, flush=True)


def _layout(options: SweepOptions) -> tuple[int, int, int]:
    """(GPUs, studies at once, CPU threads per study)."""
    gpus = cuda_devices(options.device, indexed=False)
    workers = gpus or options.workers or available_cores()
    threads = 1 if gpus else max(1, available_cores() // workers)
    return gpus, workers, threads
