"""Measurements into tidy DataFrames: from a tracking store (paged searches) or from CSV.

The study table has one row per study (the latest finished study run per study key). Columns:

    workload, optimizer, sparsity, batch_size, goal_error   what was measured
    steps_to_result                                         empty when no trial reached the goal
    trials_total, trials_reached, trials_not_reached,
    trials_diverged, trials_superseded                      trial counts by status
    best_learning_rate, best_momentum                       the best trial's metaparameters (if any)
    experiment, study_run_id, study_key                     where it came from

A CSV needs at least ``workload, optimizer, sparsity, batch_size, steps_to_result``; the other
columns are optional. The trial table (for the bootstrap) has ``study_key, trial_index, status,
steps_to_result, steps_trained`` and is read from each study run's ``trials.csv`` artifact, so a
fit that needs only study runs never pages through the trial runs.

This is the only module of the analysis that reads MLflow.
"""

from __future__ import annotations

import fnmatch
import functools
import io
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import pandas as pd

from edps_mlflow import names as n
from edps_mlflow.errors import EdpsError
from edps_mlflow.results import RunState

T = TypeVar("T")

REQUIRED_COLUMNS = ("workload", "optimizer", "sparsity", "batch_size", "steps_to_result")
NUMERIC_COLUMNS = ("sparsity", "batch_size", "steps_to_result", "steps_trained", "trial_index", "goal_error", "trials_total", "trials_reached",
                   "trials_not_reached", "trials_diverged", "trials_superseded", "best_learning_rate",
                   "best_momentum")
STUDY_COLUMNS = ("workload", "optimizer", "sparsity", "batch_size", "goal_error", "steps_to_result", "trials_total",
                 "trials_reached", "trials_not_reached", "trials_diverged", "trials_superseded",
                 "best_learning_rate", "best_momentum", "experiment", "study_run_id", "study_key", "sweep_run_id")
TRIAL_COLUMNS = ("study_key", "trial_index", "status", "steps_to_result", "steps_trained")


# A user waiting on an unreachable server should hear about it in seconds, not minutes. MLflow reads
# these when it sends a request; they are set only while the analysis talks to the store (unless the
# user set them), so that nothing else in the process, nor its subprocesses, inherits them.
_HTTP_LIMITS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "15"}


def _with_http_limits(function: Callable[..., T]) -> Callable[..., T]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        with _http_limits():
            return function(*args, **kwargs)

    return wrapper


@contextmanager
def _http_limits() -> Iterator[None]:
    added = [name for name in _HTTP_LIMITS if name not in os.environ]
    os.environ.update({name: _HTTP_LIMITS[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def _client(tracking_uri: str | None):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri)


def _experiments(client, names: tuple[str, ...]) -> list[tuple[str, str]]:
    """(id, name) for each name or glob pattern; an unknown name is an error."""
    from mlflow.exceptions import MlflowException

    try:
        everything = client.search_experiments(max_results=50_000)
    except MlflowException as error:
        raise EdpsError(f"cannot reach the tracking store {client.tracking_uri}: "
                        f"{str(error).splitlines()[0][:200]}") from None
    except Exception as error:  # connection errors surface as requests exceptions
        raise EdpsError(f"cannot reach the tracking store {client.tracking_uri}: {str(error)[:200]}") from None
    found: list[tuple[str, str]] = []
    for name in names:
        matches = [(e.experiment_id, e.name) for e in everything
                   if (fnmatch.fnmatchcase(e.name, name) if any(c in name for c in "*?[") else e.name == name)]
        if not matches:
            raise EdpsError(f"no experiment matches {name!r} in {client.tracking_uri}")
        found.extend(m for m in matches if m not in found)
    return found


def _paged(client, experiment_ids: list[str], filter_string: str) -> list:
    runs, token = [], None
    while True:
        page = client.search_runs(experiment_ids, filter_string=filter_string, max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


@_with_http_limits
def load_studies(experiments: tuple[str, ...], tracking_uri: str | None = None) -> pd.DataFrame:
    """The study table of the named experiments (FINISHED study runs only; the latest per key)."""
    if not experiments:
        raise EdpsError("name at least one experiment (--experiment), or read a CSV (--csv)")
    client = _client(tracking_uri)
    found = _experiments(client, experiments)
    names = dict(found)
    runs = _paged(client, [i for i, _ in found],
                  f"tags.`{n.TAG_KIND}` = '{n.KIND_STUDY}' and attributes.status = '{RunState.FINISHED.value}'")
    rows = []
    for run in sorted(runs, key=lambda r: r.info.start_time or 0):
        tags, metrics, params = run.data.tags, run.data.metrics, run.data.params
        if n.TAG_BATCH_SIZE not in tags:
            continue
        best_learning_rate = params.get(n.PARAM_BEST_PREFIX + "learning_rate")
        best_momentum = params.get(n.PARAM_BEST_PREFIX + "momentum")
        rows.append({
            "workload": tags.get(n.TAG_WORKLOAD), "optimizer": tags.get(n.TAG_OPTIMIZER),
            "sparsity": float(tags[n.TAG_SPARSITY]), "batch_size": int(tags[n.TAG_BATCH_SIZE]),
            "goal_error": metrics.get(n.METRIC_GOAL_ERROR), "steps_to_result": metrics.get(n.METRIC_STEPS_TO_RESULT),
            "trials_total": metrics.get(n.METRIC_TRIALS_TOTAL), "trials_reached": metrics.get(n.trials_metric("reached")),
            "trials_not_reached": metrics.get(n.trials_metric("not_reached")),
            "trials_diverged": metrics.get(n.trials_metric("diverged")),
            "trials_superseded": metrics.get(n.trials_metric("superseded")),
            "best_learning_rate": float(best_learning_rate) if best_learning_rate is not None else None,
            "best_momentum": float(best_momentum) if best_momentum is not None else None,
            "experiment": names[run.info.experiment_id], "study_run_id": run.info.run_id,
            "study_key": tags.get(n.TAG_STUDY_KEY), "sweep_run_id": tags.get(n.MLFLOW_PARENT_RUN_ID),
        })
    if not rows:
        raise EdpsError(f"experiment(s) {', '.join(experiments)} hold no finished study runs")
    table = pd.DataFrame(rows, columns=list(STUDY_COLUMNS))
    # A study run again (same key) is the same measurement: keep the latest.
    return table.drop_duplicates("study_key", keep="last").reset_index(drop=True)


@_with_http_limits
def load_trials(studies: pd.DataFrame, tracking_uri: str | None = None) -> pd.DataFrame:
    """Per-trial outcomes of the given studies, from their ``trials.csv`` artifacts."""
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    frames = []
    with tempfile.TemporaryDirectory(prefix="edps-analysis-") as scratch:
        for run_id, key in zip(studies["study_run_id"], studies["study_key"]):
            if not isinstance(run_id, str):
                continue
            try:
                path = client.download_artifacts(run_id, n.ARTIFACT_TRIALS_CSV, dst_path=scratch)
            except (MlflowException, OSError):
                continue
            frame = pd.read_csv(path)
            frame["study_key"] = key
            frames.append(frame[[c for c in TRIAL_COLUMNS if c in frame.columns]])
    if not frames:
        return pd.DataFrame(columns=list(TRIAL_COLUMNS))
    return pd.concat(frames, ignore_index=True)


def read_csv(path: str | Path, columns: tuple[str, ...] = REQUIRED_COLUMNS) -> pd.DataFrame:
    """A study (or trial) table from CSV, with its columns and types checked."""
    try:
        table = pd.read_csv(path)
    except FileNotFoundError:
        raise EdpsError(f"no such CSV file: {path}") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
        raise EdpsError(f"{path} is not a readable CSV file: {str(error).splitlines()[0]}") from None
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise EdpsError(f"{path} lacks the column(s) {', '.join(missing)}; required: {', '.join(columns)}")
    for column in NUMERIC_COLUMNS:
        if column in table.columns:
            converted = pd.to_numeric(table[column], errors="coerce")
            bad = table[column].notna() & converted.isna()
            if bad.any():
                row = int(bad.idxmax())
                raise EdpsError(f"{path}: column {column} must be numeric; row {row + 2} has {table[column][row]!r}")
            table[column] = converted
    if "batch_size" in table.columns:
        if table["batch_size"].isna().any() or (table["batch_size"] <= 0).any() \
                or (table["batch_size"] != table["batch_size"].round()).any():
            raise EdpsError(f"{path}: batch_size must hold positive integers")
        table["batch_size"] = table["batch_size"].astype(int)
        for column in STUDY_COLUMNS:
            if column not in table.columns:
                table[column] = None
    return table


def write_csv(table: pd.DataFrame, path: str | Path | None = None) -> str:
    buffer = io.StringIO()
    columns = [c for c in STUDY_COLUMNS if c in table.columns]
    table[columns].to_csv(buffer, index=False)
    if path is not None:
        Path(path).write_text(buffer.getvalue())
    return buffer.getvalue()


@_with_http_limits
def load_probe_values(experiments: tuple[str, ...], metric: str, tracking_uri: str | None = None,
                      history: bool = True) -> pd.DataFrame:
    """Probe metrics of trial runs: one row per (trial run, step), or per trial run (latest value)
    when ``history`` is False. Only trial runs that logged ``metric`` are read."""
    client = _client(tracking_uri)
    found = _experiments(client, experiments)
    runs = _paged(client, [i for i, _ in found],
                  f"tags.`{n.TAG_KIND}` = '{n.KIND_TRIAL}' and metrics.`{metric}` > -1e300")
    rows = []
    for run in runs:
        tags = run.data.tags
        base = {"workload": tags.get(n.TAG_WORKLOAD), "optimizer": tags.get(n.TAG_OPTIMIZER),
                "sparsity": float(tags.get(n.TAG_SPARSITY, "nan")), "batch_size": int(tags.get(n.TAG_BATCH_SIZE, 0)),
                "trial_run_id": run.info.run_id, "study_key": tags.get(n.TAG_STUDY_KEY)}
        if history:
            for point in client.get_metric_history(run.info.run_id, metric):
                rows.append({**base, "step": point.step, "value": point.value})
        else:
            rows.append({**base, "step": None, "value": run.data.metrics[metric]})
    if not rows:
        raise EdpsError(f"no trial in {', '.join(experiments)} logged {metric}; run studies with --probes")
    return pd.DataFrame(rows)
