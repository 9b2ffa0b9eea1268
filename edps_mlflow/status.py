"""``edps status``: the grid of an experiment from the tracking store alone, one table per curve but its
sparsity. A cell is the study's steps-to-result, ``-`` when it finished without a reaching trial, ``k/N trials
(running)`` while a live process trains it, or ``k/N trials (stopped, rerun to resume)``.
"""

from __future__ import annotations

import os

import pandas as pd

from edps_mlflow.curves import CURVE_AXES, CurveId
from edps_mlflow.errors import EdpsError
from edps_mlflow.pruning import DEFAULT_METHOD
from edps_mlflow.results import RunState
from edps_mlflow.store.ownership.lease import lease_seconds
from edps_mlflow.store.read.status import StudyRow, experiments_with_studies, study_rows

# A table's identity: the curve's axes but the sparsity, which runs across it.
TABLE_AXES = [axis for axis in CURVE_AXES if axis != "sparsity"]


def default_experiment(tracking_uri: str | None = None) -> str:
    """The experiment to show when none is named: ``MLFLOW_EXPERIMENT_NAME``, else the store's only
    experiment with studies."""
    if os.environ.get("MLFLOW_EXPERIMENT_NAME"):
        return os.environ["MLFLOW_EXPERIMENT_NAME"]
    names = experiments_with_studies(tracking_uri)
    if len(names) == 1:
        return names[0]
    if not names:
        raise EdpsError("the tracking store holds no study runs yet")
    raise EdpsError(f"the tracking store holds studies in {len(names)} experiments; name one with --experiment: "
                    + ", ".join(repr(name) for name in sorted(names)[:20]))


def status_tables(experiment: str, tracking_uri: str | None = None) -> dict[tuple, pd.DataFrame]:
    """One table per curve family (workload, optimizer, pruning method), keyed by their values; batch sizes down,
    sparsities across, the dense column in each table of its workload and optimizer."""
    rows = study_rows(experiment, lease_seconds(), tracking_uri)
    if not rows:
        raise EdpsError(f"experiment {experiment!r} has no study runs")
    return tables_of(rows)


def tables_of(rows: list[StudyRow]) -> dict[tuple, pd.DataFrame]:
    """The status tables of some study rows (see :func:`status_tables`)."""
    cells = []
    by_study: dict[tuple[CurveId, int], list[StudyRow]] = {}
    for row in rows:
        by_study.setdefault((row.curve, row.batch_size), []).append(row)
    for (curve, batch_size), group in by_study.items():
        finished = sorted((r for r in group if r.state is RunState.FINISHED), key=lambda r: r.start_time)
        # Every goal measured at this point, the latest study of each: a ladder's rungs, one-goal studies' goals.
        goals = {goal: steps for r in finished for goal, steps in (r.rungs or ((r.goal, r.steps_to_result),))}
        if len(goals) > 1:
            cell = " ".join(f"{goal:g}:{'-' if steps is None else steps}"
                            for goal, steps in sorted(goals.items(), key=lambda g: -(g[0] or 0.0)))
        elif finished:
            steps = finished[-1].steps_to_result
            cell = "-" if steps is None else str(steps)
        else:
            latest = max(group, key=lambda r: r.start_time)
            # Without a live lease its process died (or was stopped): the same command again resumes it.
            state = "running" if any(r.live for r in group) else "stopped, rerun to resume"
            cell = f"{latest.finished_trials}/{latest.trials} trials ({state})"
        cells.append({**curve.as_dict(), "batch_size": batch_size, "cell": cell})
    # The dense study is every method's sparsity 0 (StudySpec names its method snip): its column goes into the
    # table of each method measured beside it.
    siblings = [axis for axis in TABLE_AXES if axis != "pruning"]
    methods: dict[tuple, set[str]] = {}
    for cell in cells:
        if cell["sparsity"] != 0.0:
            methods.setdefault(tuple(cell[axis] for axis in siblings), set()).add(cell["pruning"])
    shown = []
    for cell in cells:
        if cell["sparsity"] == 0.0:
            beside = methods.get(tuple(cell[axis] for axis in siblings), {cell["pruning"]})
            shown += [{**cell, "pruning": method} for method in sorted(beside)]
        else:
            shown.append(cell)
    table = pd.DataFrame(shown)
    tables = {}
    for family, group in table.groupby(TABLE_AXES):
        grid = group.pivot(index="batch_size", columns="sparsity", values="cell").fillna("")
        grid.columns = [f"sparsity {c:g}" for c in grid.columns]
        grid.index.name = "batch size"
        tables[family] = grid
    return tables


def format_status(tables: dict[tuple, pd.DataFrame]) -> str:
    """The tables, each titled by its family; the pruning method is named when another than SNIP is there."""
    parts = []
    named = {family[TABLE_AXES.index("pruning")] for family in tables} != {DEFAULT_METHOD}
    for family, grid in sorted(tables.items()):
        title = " / ".join(f"pruned by {value}" if axis == "pruning" else str(value)
                           for axis, value in zip(TABLE_AXES, family) if axis != "pruning" or named)
        ladder = " (a goal ladder: goal:steps per rung)" if grid.map(lambda c: ":" in c).any(axis=None) else ""
        parts.append(f"{title}: steps-to-result{ladder} (or trials finished)\n{grid.to_string()}")
    return "\n\n".join(parts)
