"""What a sweep leaves in the store: its run (the parent of its study runs, claimed through ``ownership.claim``),
its params, plan, tables and end. Every write that matters first proves that the run is still this process's:
a sweep stalled past its lease and resumed by another process writes nothing more.
"""

from __future__ import annotations

from typing import Any

from edps_mlflow import __version__
from edps_mlflow import names as n
from edps_mlflow.store.client import StoreClient, log_batch, log_points, log_text
from edps_mlflow.store.experiment import create_run
from edps_mlflow.store.ownership.lease import OwnedRun, heartbeat_tags
from edps_mlflow.store.trouble import store_errors


def create_sweep_run(client: StoreClient, experiment_id: str, name: str, sweep_key: str, workload: str,
                     token: str | None, launcher_run_id: str | None = None) -> str:
    """A new sweep run's id (or the run ``mlflow run`` made for us), live and with its owner token at once."""
    tags = {n.TAG_KIND: n.KIND_SWEEP, n.TAG_SWEEP_KEY: sweep_key, n.TAG_WORKLOAD: workload,
            n.TAG_VERSION: __version__, **heartbeat_tags(), n.MLFLOW_RUN_NAME: name}
    if token is not None:
        tags[n.TAG_LEASE_OWNER] = token
    return create_run(client, experiment_id, tags, launcher_run_id)


class SweepTracker:
    """The sweep run: the parent of the sweep's study runs."""

    def __init__(self, client: StoreClient, experiment_id: str, owned: OwnedRun) -> None:
        self.client, self.experiment_id, self.owned = client, experiment_id, owned
        self.charted: set[tuple[str, int]] = set()  # (curve metric, batch size) on the run

    @property
    def run_id(self) -> str:
        return self.owned.run_id

    def log_start(self, params: dict[str, Any], plan: dict[str, int]) -> None:
        """Its params and the plan's counts (tags: a resumed sweep's plan is another)."""
        run = self.client.get_run(self.run_id)
        # A resumed sweep keeps its params; only new ones are written (MLflow forbids changing one).
        new_params = {n.PARAM_SWEEP_PREFIX + k: str(v) for k, v in params.items()
                      if n.PARAM_SWEEP_PREFIX + k not in run.data.params}
        log_batch(self.client, self.run_id, params=new_params,
                  tags={n.TAG_PLAN_PREFIX + k: str(v) for k, v in plan.items()})
        # What a run resumed from another process already charts (sweep_charts: each point once).
        self.charted = {(key, m.step) for key in run.data.metrics if key.startswith(n.METRIC_CURVE_PREFIX)
                        for m in self.client.get_metric_history(self.run_id, key)}

    def log_curve_points(self, values: list[tuple[str, float, int]]) -> None:
        """Points of the sweep's curves (metric, steps, batch size) not charted yet, if the run is still ours."""
        values = [v for v in values if (v[0], v[2]) not in self.charted]
        if values:
            self.owned.require()
            with store_errors(self.client):
                log_points(self.client, self.run_id, values)
            self.charted.update((v[0], v[2]) for v in values)

    def log_table(self, name: str, text: str, tags: dict[str, str] | None = None,
                  metrics: dict[str, float] | None = None) -> None:
        """A table artifact (the adaptive sweep's decisions) with tags and metrics that summarise it; replaced
        when a resumed sweep knows more. Only while ours."""
        self.owned.require()
        with store_errors(self.client):
            log_batch(self.client, self.run_id, tags=tags, metrics=metrics)
            log_text(self.client, self.run_id, name, text)

    def finish(self, studies_done: int, studies_with_result: int, seconds: float, description: str = "",
               fits: dict[str, float] | None = None) -> None:
        """The sweep's summary (``fits``: its curves' fit metrics) and FINISHED, if the run is still ours (else
        ``LeaseLost``, nothing written)."""
        self.owned.require()
        log_batch(self.client, self.run_id, metrics={
            n.METRIC_STUDIES_DONE: studies_done, n.METRIC_STUDIES_WITH_RESULT: studies_with_result,
            n.METRIC_SWEEP_SECONDS: seconds, **(fits or {})},
            tags={n.MLFLOW_NOTE: description[:20_000]} if description else None)
        self.owned.finish()
