"""``edps status``: the grid of an experiment from the tracking store alone.

One table per (workload, optimizer): batch sizes down, sparsities across; a cell is the study's
steps-to-result, ``-`` when it finished without a reaching trial, or ``k/N trials`` while unfinished.
"""

from __future__ import annotations

import pandas as pd

from edps_mlflow import registry
from edps_mlflow.errors import EdpsError
from edps_mlflow.tracking import client_for, resolved_tracking_uri


def status_tables(experiment: str, tracking_uri: str | None = None) -> dict[tuple[str, str], pd.DataFrame]:
    client = client_for(tracking_uri or resolved_tracking_uri())
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise EdpsError(f"no experiment named {experiment!r} in {client.tracking_uri}")
    rows = registry.study_table_rows(client, found.experiment_id)
    if not rows:
        raise EdpsError(f"experiment {experiment!r} has no study runs")
    trial_counts: dict[str, int] = {}
    for workload in {r["workload"] for r in rows}:
        trial_counts.update(registry.finished_trial_counts(client, found.experiment_id, workload))
    frame = pd.DataFrame(rows)
    cells = []
    for (workload, optimizer, sparsity, batch_size), group in frame.groupby(
            ["workload", "optimizer", "sparsity", "batch_size"]):
        finished = group[group["status"] == "FINISHED"].sort_values("start_time")
        if len(finished):
            steps = finished.iloc[-1]["steps_to_result"]
            cell = "-" if pd.isna(steps) else str(int(steps))
        else:
            latest = group.sort_values("start_time").iloc[-1]
            cell = f"{trial_counts.get(latest['study_key'], 0)}/{latest['trials']} trials"
        cells.append({"workload": workload, "optimizer": optimizer, "sparsity": sparsity,
                      "batch_size": batch_size, "cell": cell})
    table = pd.DataFrame(cells)
    tables = {}
    for (workload, optimizer), group in table.groupby(["workload", "optimizer"]):
        grid = group.pivot(index="batch_size", columns="sparsity", values="cell").fillna("")
        grid.columns = [f"sparsity {c:g}" for c in grid.columns]
        grid.index.name = "batch size"
        tables[(workload, optimizer)] = grid
    return tables


def format_status(tables: dict[tuple[str, str], pd.DataFrame]) -> str:
    parts = []
    for (workload, optimizer), grid in sorted(tables.items()):
        parts.append(f"{workload} / {optimizer}: steps-to-result (or trials finished)\n{grid.to_string()}")
    return "\n\n".join(parts)
