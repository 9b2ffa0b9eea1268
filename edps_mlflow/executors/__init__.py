"""Where a sweep runs its studies: the executors, one protocol (``executors.base.Executor``) behind a registry.

    executor = get_executor("ray")                    # the class, imported when asked for
    failures = executor().run(studies, sweep, options, progress, out)

A new executor is one module and one line in ``EXECUTORS``; a batch scheduler is most easily a ``JobBackend``
of ``executors/queued.py``. Nothing heavy is imported here: the command line checks ``--executor`` first.
"""

from __future__ import annotations

import importlib

from edps_mlflow.errors import EdpsError

EXECUTORS: dict[str, str] = {
    "local": "edps_mlflow.executors.local:LocalExecutor",
    "ray": "edps_mlflow.executors.ray:RayExecutor",
    "mlflow-project": "edps_mlflow.executors.mlflow_project:MlflowProjectExecutor",
}


def check_executor_name(name: str) -> None:
    if name not in EXECUTORS:
        raise EdpsError(f"unknown executor {name!r}; known executors: {', '.join(EXECUTORS)}")


def get_executor(name: str) -> type:
    """The class registered as ``name`` (an ``executors.base.Executor``), imported now."""
    check_executor_name(name)
    module, _, attribute = EXECUTORS[name].partition(":")
    return getattr(importlib.import_module(module), attribute)
