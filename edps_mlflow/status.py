"""``edps status``: the grid of an experiment (or of each) from the tracking store alone, one table per curve but its
sparsity. A cell is the study's steps-to-result, ``-`` when it finished without a reaching trial, ``k/N trials
(running)`` while a live process trains it, or ``k/N trials (stopped, rerun to resume)``. A point measured at
several seeds (replicates) shows its value over them (analysis.replicates), e.g. ``412 (3/3 seeds, 380..450)``.
"""

from __future__ import annotations

import os
import textwrap

import numpy as np
import pandas as pd

from analysis.replicates import point_value, spread
from edps_mlflow.curves import CURVE_AXES, TAG_DEFAULTS, CurveId
from edps_mlflow.errors import EdpsError
from edps_mlflow.pruning import DEFAULT_METHOD
from edps_mlflow.results import RunState
from edps_mlflow.store.ownership.lease import lease_seconds
from edps_mlflow.store.read.status import StudyRow, experiments_with_studies, study_rows

# A table's identity: the curve's axes but the sparsity, which runs across it.
TABLE_AXES = [axis for axis in CURVE_AXES if axis != "sparsity"]


def status_text(experiment: str | None, tracking_uri: str | None = None) -> str:
    """The grids of ``experiment``, else of ``MLFLOW_EXPERIMENT_NAME``, else of every experiment with studies,
    each titled by its name where there are several (a first ``mlflow run`` lands in Default, a sweep in its own)."""
    named = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME")
    names = [named] if named else sorted(experiments_with_studies(tracking_uri))
    if not names:
        raise EdpsError("the tracking store holds no study runs yet")
    if len(names) == 1:
        return format_status(status_tables(names[0], tracking_uri))
    return "\n\n".join(f"experiment {name!r}\n{format_status(status_tables(name, tracking_uri))}" for name in names)


def status_tables(experiment: str, tracking_uri: str | None = None) -> dict[tuple, pd.DataFrame]:
    """One table per curve family (workload, optimizer, pruning method, parameterization), keyed by their values;
    batch sizes down, sparsities across, the dense column in each table of its workload and optimizer."""
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
        cells.append({**curve.as_dict(), "batch_size": batch_size, "cell": _point_cell(group)})
    # The dense study is every method's and parameterisation's sparsity 0 (StudySpec names it snip and sp): its
    # column goes into the table of each measured beside it.
    shared = ("pruning", "parameterization")
    siblings = [axis for axis in TABLE_AXES if axis not in shared]
    methods: dict[tuple, set[tuple]] = {}
    for cell in cells:
        if cell["sparsity"] != 0.0:
            methods.setdefault(tuple(cell[axis] for axis in siblings), set()).add(tuple(cell[a] for a in shared))
    shown = []
    for cell in cells:
        if cell["sparsity"] == 0.0:
            beside = methods.get(tuple(cell[axis] for axis in siblings), {tuple(cell[a] for a in shared)})
            shown += [{**cell, **dict(zip(shared, values))} for values in sorted(beside)]
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


def _goals(group: list[StudyRow]) -> dict[float | None, int | None]:
    """Every goal measured by the finished studies of ``group``, the latest study of each: a ladder's rungs,
    one-goal studies' goals."""
    finished = sorted((r for r in group if r.state is RunState.FINISHED), key=lambda r: r.start_time)
    return {goal: steps for r in finished for goal, steps in (r.rungs or ((r.goal, r.steps_to_result),))}


def _unfinished(group: list[StudyRow]) -> str:
    latest = max(group, key=lambda r: r.start_time)
    # Without a live lease its process died (or was stopped): the same command again resumes it.
    state = "running" if any(r.live for r in group) else "stopped, rerun to resume"
    return f"{latest.finished_trials}/{latest.trials} trials ({state})"


def _point_cell(group: list[StudyRow]) -> str:
    """One point's cell: its study's steps-to-result, or over its replicates (studies at several seeds) the
    point's value (analysis.replicates) with how many reached and their range."""
    seeds: dict[int, list[StudyRow]] = {}
    for row in group:
        seeds.setdefault(row.seed, []).append(row)
    measured = {seed: goals for seed, rows in seeds.items() if (goals := _goals(rows))}
    if not measured:
        return _unfinished(group) + (f", {len(seeds)} seeds" if len(seeds) > 1 else "")
    values, spreads = {}, {}
    for goal in dict.fromkeys(goal for goals in measured.values() for goal in goals):
        steps = [goals[goal] for goals in measured.values() if goal in goals]
        reached = [s for s in steps if s is not None]
        value = point_value(np.array([np.inf if s is None else s for s in steps], dtype=float))
        values[goal] = "-" if np.isnan(value) else (str(steps[0]) if len(steps) == 1 else f"{value:.0f}")
        span = f", {spread(min(reached), max(reached))}" if len(reached) > 1 else ""
        spreads[goal] = f" ({len(reached)}/{len(steps)} seeds{span})" if len(seeds) > 1 else ""
    if len(values) > 1:  # a ladder: its rungs' values, hardest last
        cell = " ".join(f"{goal:g}:{values[goal]}" for goal in sorted(values, key=lambda g: -(g or 0.0)))
        cell += f" ({len(measured)} seeds)" if len(seeds) > 1 else ""
    else:
        goal = next(iter(values))
        cell = values[goal] + spreads[goal]
    pending = [rows for seed, rows in seeds.items() if seed not in measured]
    return cell + "".join(f"; seed {rows[0].seed}: {_unfinished(rows)}" for rows in pending)


def format_status(tables: dict[tuple, pd.DataFrame]) -> str:
    """The tables, each titled by its family; the pruning method is named when another than SNIP is there."""
    parts = []
    named = {family[TABLE_AXES.index("pruning")] for family in tables} != {DEFAULT_METHOD}
    for family, grid in sorted(tables.items()):
        title = " / ".join(f"pruned by {value}" if axis == "pruning" else str(value)
                           for axis, value in zip(TABLE_AXES, family) if (axis != "pruning" or named)
                           and (axis != "parameterization" or value != TAG_DEFAULTS["parameterization"]))
        ladder = " (a goal ladder: goal:steps per rung)" if grid.map(lambda c: ":" in c).any(axis=None) else ""
        seeds = " (replicates: the geometric mean of the seeds that reached, where more than half reached; " \
            "reached/seeds, min..max)" if grid.map(lambda c: "seeds" in c).any(axis=None) else ""
        heading = textwrap.fill(f"{title}: steps-to-result{ladder}{seeds} (or trials finished)", 100,
                                subsequent_indent="  ", break_on_hyphens=False)  # a 100-column terminal
        parts.append(f"{heading}\n{grid.to_string(line_width=100)}")
    return "\n\n".join(parts)
