"""Measurements into tidy DataFrames: from a tracking store (paged searches) or from CSV.

The study table has one row per study (the latest finished study run per study key). Columns:

    workload, optimizer, sparsity, batch_size, pruning,
    goal_error                                              what was measured (pruning: the method; a
                                                            run or CSV row without one was SNIP's)
    check_interval, max_steps                               the study's protocol (from its spec params)
    steps_to_result                                         empty when no trial reached the goal
    trials_total, trials_reached, trials_not_reached,
    trials_diverged, trials_superseded                      trial counts by status
    best_learning_rate, best_momentum                       the best trial's metaparameters (if any)
    seconds_per_step, pack_size, device                     the best trial's measured training seconds per
                                                            step, the trials that shared its steps, and
                                                            the device (empty for runs that predate them)
    model_parameters, model_parameter_bytes                 the network's size (every parameter)
    experiment, study_run_id, study_key                     where it came from

A CSV needs at least ``workload, optimizer, sparsity, batch_size, steps_to_result``; the other
columns are optional. Every cell is checked when the file is read (numbers finite and in range,
batch sizes positive integers, statuses known), and the first bad one is named by file, line and
column in one line. A text cell that a spreadsheet would run as a formula is written with a
leading ``'`` (see :func:`spreadsheet_text`), and read back without it. The study runs are read through
the experiment's study index (store/index.py: one run, not a search of every study run). The trial table
(for the bootstrap) has ``study_key, trial_index, status, steps_to_result, steps_trained`` and is read
from each study run's tag ``edps.trial_outcomes`` (studies written before it: their ``trials.csv``
artifacts, a few downloads at a time), so a fit never pages through the trial runs.

This is the only module of the analysis that reads MLflow.
"""

from __future__ import annotations

import csv
import fnmatch
import functools
import io
import math
import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import numpy as np
import pandas as pd

from edps_mlflow import names as n
from edps_mlflow.store import index as study_index
from edps_mlflow.curves import TAG_DEFAULTS, CurveId
from edps_mlflow.errors import EdpsError
from edps_mlflow.filters import filter_string
from edps_mlflow.results import RunState, TrialOutcomeColumns, TrialStatus, trial_outcome_columns
from edps_mlflow.uris import explain_store_error, quiet_links_with_credentials, redact_uri, require_existing_store

T = TypeVar("T")

REQUIRED_COLUMNS = ("workload", "optimizer", "sparsity", "batch_size", "steps_to_result")
STUDY_COLUMNS = ("workload", "optimizer", "sparsity", "batch_size", "pruning", "goal_error", "check_interval",
                 "max_steps",
                 "steps_to_result", "trials_total", "trials_reached", "trials_not_reached", "trials_diverged",
                 "trials_superseded", "best_learning_rate", "best_momentum", "seconds_per_step", "pack_size", "device",
                 "model_parameters", "model_parameter_bytes", "experiment", "study_run_id", "study_key",
                 "sweep_run_id")
TRIAL_COLUMNS = ("study_key", "trial_index", "status", "steps_to_result", "steps_trained")

# What a number in each column may be: (lowest, highest, lowest included, must be an integer).
# Empty cells are allowed (a missing value) except in the columns of _REQUIRED_VALUES.
_RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "sparsity": (0.0, 1.0, True, False), "batch_size": (1, math.inf, True, True),
    "goal_error": (0.0, 1.0, False, False), "check_interval": (1, math.inf, True, True),
    "max_steps": (1, math.inf, True, True), "steps_to_result": (0, math.inf, False, False),
    "steps_trained": (0, math.inf, True, False), "trial_index": (0, math.inf, True, True),
    "trials_total": (1, math.inf, True, True), "trials_reached": (0, math.inf, True, True),
    "trials_not_reached": (0, math.inf, True, True), "trials_diverged": (0, math.inf, True, True),
    "trials_superseded": (0, math.inf, True, True), "best_learning_rate": (0.0, math.inf, False, False),
    "best_momentum": (0.0, 1.0, True, False), "seconds_per_step": (0.0, math.inf, False, False),
    "pack_size": (1.0, math.inf, True, False), "model_parameters": (1, math.inf, True, True),
    "model_parameter_bytes": (1, math.inf, True, True),
}
NUMERIC_COLUMNS = tuple(_RANGES)
_REQUIRED_VALUES = ("workload", "optimizer", "sparsity", "batch_size", "study_key", "trial_index", "status")
# A CSV larger than this is not a study table of this project (a sweep of 10,000 studies is ~2 MB).
MAX_CSV_BYTES = 256 * 2**20


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
    """A client of the store that exists (an unknown scheme, a missing driver or a missing local
    database is one line naming the store, without its credentials)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient, get_tracking_uri

    from edps_mlflow.store.client import require_database
    from edps_mlflow.store.logs import route_library_logs

    uri = tracking_uri or get_tracking_uri()
    require_existing_store(uri)
    quiet_links_with_credentials(uri)
    route_library_logs()  # MLflow's logged tracebacks to the command's log file, off the terminal
    require_database(uri)  # a database that does not answer: one line within seconds, not 100 s of retries
    try:
        return MlflowClient(uri)
    except (MlflowException, ImportError) as error:
        raise _store_error(uri, error) from None


def _store_error(uri: str, error: BaseException) -> EdpsError:
    lines = str(error).strip().splitlines() or [type(error).__name__]
    # Redacted before it is cut: a cut through a password would leave its start unrecognised.
    return EdpsError(f"cannot reach the tracking store {redact_uri(uri)}: {explain_store_error(redact_uri(lines[0], uri)[:400])}")


def _experiments(client, names: tuple[str, ...]) -> list[tuple[str, str]]:
    """(id, name) for each name, else glob pattern; an unknown name is an error that lists the experiments
    that exist. No names: every active experiment that holds a study run, wherever it is (a study run by
    ``mlflow run .`` sits in MLflow's ``Default`` experiment), as ``edps status`` finds them.

    A name is matched exactly first, so an experiment whose name holds ``*``, ``?`` or ``[`` is found
    by its own name; only a name that no experiment has is read as a pattern.
    """
    everything = _all_experiments(client)
    if not names:
        found = [(e.experiment_id, e.name) for e in _with_studies(client, everything)]
        if not found:
            raise EdpsError(f"no experiment in {redact_uri(str(client.tracking_uri))} holds a study run"
                            f"{_existing(everything)}; run a study first (edps study, or mlflow run .)")
        return found
    found: list[tuple[str, str]] = []
    for name in names:
        matches = [(e.experiment_id, e.name) for e in everything if e.name == name]
        if not matches and any(c in name for c in "*?["):
            matches = [(e.experiment_id, e.name) for e in everything if fnmatch.fnmatchcase(e.name, name)]
        if not matches:
            raise EdpsError(f"no experiment matches {name!r} in {redact_uri(str(client.tracking_uri))}"
                            f"{_existing(everything, _with_studies(client, everything))}")
        found.extend(m for m in matches if m not in found)
    return found


def _all_experiments(client) -> list:
    try:
        return client.search_experiments(max_results=50_000)
    except Exception as error:  # MLflow's errors, and connection errors surfacing as requests exceptions
        raise _store_error(str(client.tracking_uri), error) from None


def _with_studies(client, experiments: list) -> list:
    """The experiments among ``experiments`` that hold at least one study run (one small search each)."""
    from mlflow.exceptions import MlflowException

    try:
        ids = [e.experiment_id for e in experiments]
        with_studies = set(study_index.experiments_with_studies(
            _searcher(client, ids), ids,
            lambda experiment_id: bool(client.search_runs(
                [experiment_id], filter_string(tags={n.TAG_KIND: n.KIND_STUDY}), max_results=1))))
        return [e for e in experiments if e.experiment_id in with_studies]
    except MlflowException as error:
        raise _store_error(str(client.tracking_uri), error) from None


# An error lists at most this many experiment names (a store may hold thousands).
_LISTED = 12


def _names(experiments: list) -> str:
    names = sorted(e.name for e in experiments)
    more = f" and {len(names) - _LISTED} more" if len(names) > _LISTED else ""
    return ", ".join(repr(name) for name in names[:_LISTED]) + more


def _existing(everything: list, with_studies: list | None = None) -> str:
    """``; experiments: 'Default', 'edps/x' (with study runs: 'Default')``, for an error that matched nothing."""
    if not everything:
        return "; the store has no experiments"
    text = f"; experiments: {_names(everything)}"
    if with_studies is not None:
        text += f" (with study runs: {_names(with_studies) if with_studies else 'none'})"
    return text


def describe_experiments(experiments: tuple[str, ...]) -> str:
    """What the analysis read, in words: the names given, or every experiment with study runs."""
    return ", ".join(experiments) if experiments else "every experiment with study runs"


def _paged(client, experiment_ids: list[str], conditions: str, deleted: bool = False, most: int | None = None) -> list:
    """Every run matching ``conditions`` (built by :func:`filter_string`), page by page, or the first ``most``;
    the active runs, or with ``deleted`` the deleted ones."""
    from mlflow.entities import ViewType
    from mlflow.exceptions import MlflowException

    view = ViewType.DELETED_ONLY if deleted else ViewType.ACTIVE_ONLY

    def page(size: int, token: str | None):
        try:
            return client.search_runs(experiment_ids, filter_string=conditions, run_view_type=view,
                                      max_results=size, page_token=token)
        except MlflowException as error:
            raise _store_error(str(client.tracking_uri), error) from None

    return study_index.every_page(page, most)


def _searcher(client, experiment_ids: list[str]):
    """study_index's search over ``experiment_ids`` (every page; active runs, or the deleted ones)."""
    return study_index.Search(tuple(str(experiment_id) for experiment_id in experiment_ids),
                              functools.partial(_paged, client, experiment_ids))


def _finished_studies(client, experiment_ids: list[str]) -> list:
    """The FINISHED study runs of the experiments: from their study index, and the rest from the store."""
    return _finished(study_index.study_runs(_searcher(client, experiment_ids)))


def _finished(runs: list) -> list:
    return [run for run in runs if run.info.status == RunState.FINISHED.value]


@_with_http_limits
def load_studies(experiments: tuple[str, ...], tracking_uri: str | None = None) -> pd.DataFrame:
    """The study table of the named experiments, or of every experiment with study runs when none is named
    (FINISHED study runs only; the latest per key)."""
    client = _client(tracking_uri)
    found = _experiments(client, experiments)
    names = dict(found)
    every = study_index.study_runs(_searcher(client, [i for i, _ in found]))
    runs = _finished(every)
    rows: dict[str, dict[str, Any]] = {}
    for run in sorted(runs, key=lambda r: r.info.start_time or 0):
        tags, metrics, params = run.data.tags, run.data.metrics, run.data.params
        try:
            curve, batch_size = CurveId.from_tags(tags), int(tags[n.TAG_BATCH_SIZE])
        except (KeyError, ValueError):
            continue  # not a study run of ours, or one refused before it logged anything
        best_learning_rate = params.get(n.PARAM_BEST_PREFIX + "learning_rate")
        best_momentum = params.get(n.PARAM_BEST_PREFIX + "momentum")
        # One row per measurement, the latest: a study run again (same key), or a study that differs only in
        # its probes (same result key: probes never change a result), is the same measurement.
        result_key = tags.get(n.TAG_RESULT_KEY) or tags.get(n.TAG_STUDY_KEY) or run.info.run_id
        rows.pop(result_key, None)
        rows[result_key] = ({
            **curve.as_dict(), "batch_size": batch_size, "goal_error": metrics.get(n.METRIC_GOAL_ERROR),
            "check_interval": _number(params.get(n.PARAM_SPEC_PREFIX + "check_interval")),
            "max_steps": _number(params.get(n.PARAM_SPEC_PREFIX + "max_steps")),
            "steps_to_result": metrics.get(n.METRIC_STEPS_TO_RESULT),
            "trials_total": metrics.get(n.METRIC_TRIALS_TOTAL), "trials_reached": metrics.get(n.trials_metric("reached")),
            "trials_not_reached": metrics.get(n.trials_metric("not_reached")),
            "trials_diverged": metrics.get(n.trials_metric("diverged")),
            "trials_superseded": metrics.get(n.trials_metric("superseded")),
            "best_learning_rate": _number(best_learning_rate), "best_momentum": _number(best_momentum),
            "seconds_per_step": metrics.get(n.METRIC_SECONDS_PER_STEP), "pack_size": metrics.get(n.METRIC_PACK_SIZE),
            "device": params.get(n.PARAM_TIMING_DEVICE), "model_parameters": metrics.get(n.METRIC_MODEL_PARAMETERS),
            "model_parameter_bytes": metrics.get(n.METRIC_MODEL_PARAMETER_BYTES),
            "experiment": names[run.info.experiment_id], "study_run_id": run.info.run_id,
            "study_key": tags.get(n.TAG_STUDY_KEY), "sweep_run_id": tags.get(n.MLFLOW_PARENT_RUN_ID),
        })
    if not rows:
        raise EdpsError(f"experiment(s) {', '.join(names.values())} hold no finished study runs"
                        + (f"; experiments with study runs: {_names(_with_studies(client, _all_experiments(client)))}"
                           if experiments else ""))
    table = pd.DataFrame(list(rows.values()), columns=list(STUDY_COLUMNS))
    table.attrs[_TRIAL_OUTCOMES_READ] = _ReadTags({run.info.run_id: run.data.tags.get(n.TAG_TRIAL_OUTCOMES)
                                                   for run in runs})
    table.attrs[_PROBED_READ] = any(_probed(run) for run in every)
    return table


# The study table's attrs key of the trial outcomes read with it (a _ReadTags).
_TRIAL_OUTCOMES_READ = "edps.trial_outcomes_read"
# The study table's attrs key of whether any study run read with it, finished or not, ran with probes.
_PROBED_READ = "edps.probed_read"


def _probed(run: Any) -> bool:
    return bool(run.data.params.get(n.PARAM_SPEC_PREFIX + "probes"))


def read_without_probes(studies: pd.DataFrame) -> bool:
    """Whether ``studies`` was read from the store (:func:`load_studies`) with no study run that ran with probes:
    then :func:`load_probe_values` and :func:`load_best_trial_probes` of the same experiments find nothing,
    without reading the study index again. False when unknown (a table from a CSV)."""
    return studies.attrs.get(_PROBED_READ) is False


class _ReadTags:
    """run id -> a study run's tag edps.trial_outcomes, as read with the study table (``DataFrame.attrs``), so
    that :func:`load_trials` need not read the study index again. Read-only, so pandas, which deep-copies
    ``attrs`` through every operation on the table, shares it instead (1,500 studies: about a millisecond
    a copy)."""

    def __init__(self, tags: dict[str, str | None]) -> None:
        self._tags = tags

    def get(self, run_id: str) -> str | None:
        return self._tags.get(run_id)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._tags

    def __deepcopy__(self, memo: dict) -> _ReadTags:
        return self


def _number(text: str | None) -> float | None:
    """A param (MLflow stores them as strings) as a number; None when absent or not a number."""
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


@_with_http_limits
def load_trials(studies: pd.DataFrame, tracking_uri: str | None = None) -> pd.DataFrame:
    """Per-trial outcomes of the given studies: from each study run's tag edps.trial_outcomes (as
    :func:`load_studies` read it with the table, else from the study index: one search for all of them),
    else (studies written before the tag) from its ``trials.csv`` artifact, downloaded a few at a time."""
    wanted = [(run_id, key) for run_id, key in zip(studies["study_run_id"], studies["study_key"])
              if isinstance(run_id, str)]
    if not wanted:
        return pd.DataFrame(columns=list(TRIAL_COLUMNS))
    # The tags read with the study table when it came from the store, else (or for runs it did not read)
    # one read of the study index.
    read = studies.attrs.get(_TRIAL_OUTCOMES_READ)
    texts = {run_id: read.get(run_id) for run_id, _ in wanted if isinstance(read, _ReadTags) and run_id in read}
    missing = {run_id for run_id, _ in wanted if run_id not in texts}
    client = None
    if missing:
        client = _client(tracking_uri)
        texts.update({run_id: tags.get(n.TAG_TRIAL_OUTCOMES)
                      for run_id, tags in _study_tags(client, studies, missing).items()})
    columns = trial_outcome_columns([texts.get(run_id) for run_id, _ in wanted])
    downloads = [study for study, readable in zip(wanted, columns.readable) if not readable]
    frames = [_trials_frame([key for _, key in wanted], columns)] if len(columns.trial_index) else []
    if downloads:
        frames += _downloaded_trials(client or _client(tracking_uri), downloads)
    if not frames:
        return pd.DataFrame(columns=list(TRIAL_COLUMNS))
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def _trials_frame(keys: list[str], columns: TrialOutcomeColumns) -> pd.DataFrame:
    """The trials table of studies ``keys`` from their tags' columns (:func:`trial_outcome_columns`; a study
    whose tag is not readable has no rows). study_key and status are categorical: made into pandas strings
    one by one, 150,000 trials' keys and statuses took most of the read."""
    readable = [key for key, read in zip(keys, columns.readable) if read]
    key_codes, unique_keys = pd.factorize(pd.Series(readable, dtype=object))
    status = pd.Categorical.from_codes(columns.status_codes, categories=[s.value for s in columns.statuses])
    return pd.DataFrame({
        "study_key": pd.Categorical.from_codes(np.repeat(key_codes, columns.counts[columns.readable]),
                                               categories=unique_keys.astype(str)),
        "trial_index": columns.trial_index, "status": status.remove_unused_categories(),
        "steps_to_result": columns.steps_to_result, "steps_trained": columns.steps_trained},
        columns=list(TRIAL_COLUMNS))


def _study_tags(client, studies: pd.DataFrame, run_ids: set[str]) -> dict[str, dict[str, str]]:
    """run id -> tags of the given study runs, read with the study index of their experiments."""
    names = set(studies["experiment"].dropna()) if "experiment" in studies.columns else set()
    ids = [e.experiment_id for e in _all_experiments(client) if e.name in names]
    if not ids:
        return {}
    return {run.info.run_id: run.data.tags for run in study_index.study_runs(_searcher(client, ids))
            if run.info.run_id in run_ids}


# Artifact downloads at once for studies without the tag (each is a request to the artifact store).
_DOWNLOADS_AT_ONCE = 8


def _downloaded_trials(client, studies: list[tuple[str, str]]) -> list[pd.DataFrame]:
    """Trial tables from the ``trials.csv`` artifacts of (run id, study key), a few downloads at a time."""
    from concurrent.futures import ThreadPoolExecutor

    from mlflow.exceptions import MlflowException

    def one(scratch: str, run_id: str, key: str) -> pd.DataFrame | None:
        try:
            path = client.download_artifacts(run_id, n.ARTIFACT_TRIALS_CSV, dst_path=tempfile.mkdtemp(dir=scratch))
        except (MlflowException, OSError):
            return None
        try:
            frame = read_csv(path, columns=TRIAL_COLUMNS[1:])
        except EdpsError:
            return None  # an artifact that is not a trials table of ours: that study gets no intervals
        frame["study_key"] = key
        return frame[[c for c in TRIAL_COLUMNS if c in frame.columns]]

    if not studies:
        return []
    with tempfile.TemporaryDirectory(prefix="edps-analysis-") as scratch, \
            ThreadPoolExecutor(max_workers=_DOWNLOADS_AT_ONCE) as pool:
        frames = list(pool.map(lambda study: one(scratch, *study), studies))
    return [frame for frame in frames if frame is not None]


def read_csv(path: str | Path, columns: tuple[str, ...] = REQUIRED_COLUMNS) -> pd.DataFrame:
    """A study (or trial) table from CSV, every cell checked; the first bad one is an EdpsError
    naming the file, the line and the column."""
    text = _read_text(Path(path))
    try:
        records = [record for record in csv.reader(io.StringIO(text)) if record]
    except csv.Error as error:
        raise EdpsError(f"{path} is not a readable CSV file: {error}") from None
    header = [name.strip() for name in (records[0] if records else [])]
    if not any(header):
        raise EdpsError(f"{path} is empty: it needs a header line with the columns {', '.join(columns)}")
    seen: set[str] = set()
    for name in header:
        if name in seen:
            raise EdpsError(f"{path}: the column {name!r} appears more than once in the header")
        seen.add(name)
    missing = [c for c in columns if c not in header]
    if missing:
        raise EdpsError(f"{path} lacks the column(s) {', '.join(missing)}; required: {', '.join(columns)}")
    for number, record in enumerate(records[1:], 2):
        if len(record) > len(header):
            # pandas would silently drop the extra cells or shift the row onto an index
            raise EdpsError(f"{path} is not a readable CSV file: row {number} has {len(record)} cells, "
                            f"the header {len(header)}")
    try:
        # Everything as text: numbers are converted and checked below, cell by cell.
        table = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False, na_values=[""],
                            skipinitialspace=True, index_col=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError, csv.Error) as error:
        lines = str(error).strip().splitlines() or [type(error).__name__]
        raise EdpsError(f"{path} is not a readable CSV file: {lines[0]}") from None
    if len(table.columns) != len(header):
        raise EdpsError(f"{path}: the header has {len(header)} columns but was read as {len(table.columns)}")
    table.columns = header
    if table.empty:
        raise EdpsError(f"{path} has a header but no rows")
    for column in table.columns:
        if column in _REQUIRED_VALUES:
            empty = table[column].isna() | (table[column].astype(str).str.strip() == "")
            if empty.any():
                raise EdpsError(f"{path}: column {column} needs a value in every row; row {_line(empty)} has none")
        if column in _RANGES:
            table[column] = _checked_numbers(path, table, column)
        else:
            table[column] = table[column].map(unquoted_text)
    if "status" in table.columns:
        known = {status.value for status in TrialStatus}
        bad = table["status"].notna() & ~table["status"].isin(known)
        if bad.any():
            row = _line(bad)
            raise EdpsError(f"{path}: column status must be one of {', '.join(sorted(known))}; "
                            f"row {row} has {table['status'].iloc[row - 2]!r}")
    if "pruning" in table.columns:
        table["pruning"] = _checked_methods(path, table["pruning"])
    if "batch_size" in table.columns:
        table["batch_size"] = table["batch_size"].astype(int)
        for column in STUDY_COLUMNS:
            if column not in table.columns:
                table[column] = None
    return table


def _checked_methods(path: str | Path, column: pd.Series) -> pd.Series:
    """Each pruning method named in its canonical spelling; an unknown one is an EdpsError naming the row."""
    from edps_mlflow.pruning import parse_method

    names = []
    for row, value in enumerate(column, 2):
        if value is None or (isinstance(value, float) and math.isnan(value)) or not str(value).strip():
            names.append(None)
            continue
        try:
            names.append(parse_method(str(value)))
        except EdpsError as error:
            raise EdpsError(f"{path}: column pruning, row {row}: {error}") from None
    return pd.Series(names, index=column.index, dtype=object)


def _read_text(path: Path) -> str:
    try:
        if not path.is_file():
            raise EdpsError(f"no such CSV file: {path}" if not path.exists() else f"{path} is not a file")
        if path.stat().st_size > MAX_CSV_BYTES:
            raise EdpsError(f"{path} is larger than {MAX_CSV_BYTES // 2**20} MiB; not a study table")
        data = path.read_bytes()
    except OSError as error:
        raise EdpsError(f"cannot read {path}: {error.strerror or error}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        row = data[:error.start].count(b"\n") + 1
        raise EdpsError(f"{path}: row {row} is not UTF-8 text (byte {error.start})") from None


def _line(mask: pd.Series) -> int:
    """The row of the file of the first True entry (row 1 is the header; blank lines are not counted)."""
    return int(mask.to_numpy().argmax()) + 2


def _parses_as_float(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _checked_numbers(path: str | Path, table: pd.DataFrame, column: str) -> pd.Series:
    low, high, low_included, integer = _RANGES[column]
    text = table[column]
    numbers = pd.to_numeric(text.str.strip(), errors="coerce")
    present = text.notna()
    finite = numbers.notna() & numbers.map(lambda v: math.isfinite(v) if v == v else False)
    if integer:
        in_range = finite & (numbers == numbers.round())
    else:
        in_range = finite
    in_range &= (numbers >= low if low_included else numbers > low) & (numbers < high if high == 1.0 else True)
    bad = present & ~in_range
    if bad.any():
        row = _line(bad)
        value = text.iloc[row - 2]
        if not _parses_as_float(value):
            demand = "numeric"
        else:
            kind = "an integer" if integer else "a finite number"
            bounds = (f"in [{low:g}, {high:g})" if high == 1.0 and low_included else f"in ({low:g}, {high:g})"
                      if high == 1.0 else f">= {low:g}" if low_included else f"> {low:g}")
            demand = f"{kind} {bounds}"
        raise EdpsError(f"{path}: column {column} must be {demand}; row {row} has {value!r}")
    return numbers


# What a spreadsheet (Excel, LibreOffice, Google Sheets) runs as a formula when a cell starts with it
# (OWASP, CSV injection): '=', '+', '-', '@', a tab, a carriage return. A number such as -0.5 or +3e2 starts
# with a sign but is read as a number, never run.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _quoted_for_spreadsheets(text: str) -> bool:
    """Whether ``text`` is written with a leading "'": it would run as a formula, or it starts with "'"s
    before such a text (so that reading back, which removes one "'", gives every text back as it was)."""
    rest = text.lstrip("'")
    return rest.startswith(_FORMULA_STARTS) and not _NUMBER.fullmatch(rest)


def spreadsheet_text(value: Any) -> Any:
    """A cell as the analysis writes it to CSV: text that a spreadsheet would run as a formula gets a
    leading "'", the spreadsheets' own mark of a text cell (``=HYPERLINK(...)`` becomes
    ``'=HYPERLINK(...)``); numbers and every other value are left as they are."""
    return "'" + value if isinstance(value, str) and _quoted_for_spreadsheets(value) else value


def unquoted_text(value: Any) -> Any:
    """The inverse of :func:`spreadsheet_text`, applied to the text cells :func:`read_csv` reads."""
    if isinstance(value, str) and value.startswith("'") and _quoted_for_spreadsheets(value[1:]):
        return value[1:]
    return value


def csv_text(table: pd.DataFrame) -> str:
    """``table`` as the analysis writes every CSV (export, --format csv, the analysis run's tables): text
    cells quoted (a newline, a carriage return or a ';' stays inside its cell in every reader) and made
    inert for spreadsheets (:func:`spreadsheet_text`); numbers as numbers."""
    return table.map(spreadsheet_text).to_csv(index=False, quoting=csv.QUOTE_NONNUMERIC)


def write_csv(table: pd.DataFrame, path: str | Path | None = None) -> str:
    """The study table's columns as CSV (:func:`csv_text`), which :func:`read_csv` reads back as the same
    table; written to ``path`` when given."""
    columns = [c for c in STUDY_COLUMNS if c in table.columns]
    text = csv_text(table[columns])
    if path is not None:
        try:
            # newline="": the text's line ends are written as they are (a "\r" inside a quoted cell too).
            with open(path, "w", encoding="utf-8", newline="") as file:
                file.write(text)
        except OSError as error:
            raise EdpsError(f"cannot write {path}: {error.strerror or error}") from None
    return text


@_with_http_limits
def load_probe_values(experiments: tuple[str, ...], metric: str, tracking_uri: str | None = None,
                      history: bool = True) -> pd.DataFrame:
    """Probe metrics of trial runs: one row per (trial run, step), or per trial run (latest value)
    when ``history`` is False. Only trial runs that logged ``metric`` are read."""
    client = _client(tracking_uri)
    found = _experiments(client, experiments)
    ids = [i for i, _ in found]
    # Only the trials of a study with probes log them: without such a study, no search of the trial runs
    # (it would scan the tags of every run in the store).
    probed = any(_probed(run) for run in study_index.study_runs(_searcher(client, ids)))
    runs = _paged(client, ids, filter_string(tags={n.TAG_KIND: n.KIND_TRIAL}, metrics_above={metric: -1e300})) \
        if probed else []
    rows = []
    for run in runs:
        tags = run.data.tags
        base = {"workload": tags.get(n.TAG_WORKLOAD), "optimizer": tags.get(n.TAG_OPTIMIZER),
                "sparsity": float(tags.get(n.TAG_SPARSITY, "nan")),
                "pruning": tags.get(n.TAG_PRUNING, TAG_DEFAULTS["pruning"]),
                "batch_size": int(tags.get(n.TAG_BATCH_SIZE, 0)),
                "trial_run_id": run.info.run_id, "study_key": tags.get(n.TAG_STUDY_KEY)}
        if history:
            for point in client.get_metric_history(run.info.run_id, metric):
                rows.append({**base, "step": point.step, "value": point.value})
        else:
            rows.append({**base, "step": None, "value": run.data.metrics[metric]})
    if not rows:
        raise EdpsError(f"no trial in {describe_experiments(experiments)} logged {metric}; run studies with --probes")
    return pd.DataFrame(rows)


@_with_http_limits
def load_best_trial_probes(experiments: tuple[str, ...], metric: str, tracking_uri: str | None = None) -> pd.DataFrame:
    """``metric`` along each study's best trial's whole run: one row per (study, probe step).

    A study names that run in its ``edps.best_probe_run`` tag (``--probe-trials best`` or ``all``). A study
    probed before the tag existed has no such run: its probed trials, cut short by early stopping, are
    pooled instead, and the ``source`` column says so. ``trials_used`` counts the trial runs read.
    """
    client = _client(tracking_uri)
    found = _experiments(client, experiments)
    studies = _finished_studies(client, [i for i, _ in found])
    rows: list[dict[str, Any]] = []
    legacy: dict[str, dict[str, Any]] = {}
    seen_results: set[str] = set()
    for run in sorted(studies, key=lambda r: r.info.start_time or 0, reverse=True):
        tags = run.data.tags
        if not _probed(run):
            continue
        try:
            base = {**CurveId.from_tags(tags).as_dict(), "batch_size": int(tags[n.TAG_BATCH_SIZE]),
                    "study_run_id": run.info.run_id}
        except (KeyError, ValueError):
            continue
        # One measurement per result (the latest study of it): probes never change a result.
        result = tags.get(n.TAG_RESULT_KEY) or tags.get(n.TAG_STUDY_KEY) or run.info.run_id
        if result in seen_results:
            continue
        seen_results.add(result)
        probe_run = tags.get(n.TAG_BEST_PROBE_RUN)
        if probe_run:
            for point in client.get_metric_history(probe_run, metric):
                rows.append({**base, "step": point.step, "value": point.value, "trial_run_id": probe_run,
                             "source": "best trial, whole run"})
        elif n.TAG_PROBED_TRIALS not in tags and tags.get(n.TAG_STUDY_KEY):
            legacy[tags[n.TAG_STUDY_KEY]] = base
    if legacy:
        trials = _paged(client, [i for i, _ in found],
                        filter_string(tags={n.TAG_KIND: n.KIND_TRIAL}, metrics_above={metric: -1e300}))
        for trial in trials:
            base = legacy.get(trial.data.tags.get(n.TAG_STUDY_KEY, ""))
            if base is None:
                continue
            for point in client.get_metric_history(trial.info.run_id, metric):
                rows.append({**base, "step": point.step, "value": point.value, "trial_run_id": trial.info.run_id,
                             "source": "all probed trials, cut by early stopping (studies probed before "
                                       "--probe-trials)"})
    if not rows:
        raise EdpsError(f"no study in {describe_experiments(experiments)} has {metric} along its best trial's run; run "
                        f"studies with --probes (a study whose trials all missed the goal has no best trial)")
    return pd.DataFrame(rows)
