"""The study, trial and probe tables from a tracking store; the only module of the analysis that reads MLflow.
Study runs are read through each experiment's study index (one run, not a search of every run), and trials from
each study run's tag ``edps.trial_outcomes`` (older studies: their ``trials.csv``), never from the trial runs. A
goal ladder's study run is a row per rung, each keyed as the one-goal study that rung answers.
"""

from __future__ import annotations

import fnmatch
import tempfile
from typing import Any

import numpy as np
import pandas as pd

from analysis.csv_io import BEST_METAPARAMETERS, STUDY_COLUMNS, TRIAL_COLUMNS, read_csv
from edps_mlflow import names as n
from edps_mlflow.curves import TAG_DEFAULTS, CurveId
from edps_mlflow.errors import EdpsError
from edps_mlflow.filters import filter_string
from edps_mlflow.results import TrialOutcomeColumns, trial_outcome_columns
from edps_mlflow.store import index as study_index
from edps_mlflow.workloads import get_workload
from edps_mlflow.workloads.contract import GoalMetric
from edps_mlflow.uris import quiet_links_with_credentials, redact_uri, require_existing_store

_LISTED = 12  # an error lists at most this many experiment names (a store may hold thousands)
_TRIAL_OUTCOMES_READ = "edps.trial_outcomes_read"  # attrs of the study table: its runs' trial outcomes tags


def _client(tracking_uri: str | None):
    """A client of a store that exists; any trouble reaching it is one line naming it without its credentials."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from edps_mlflow.store.client import require_answer, resolve_tracking_uri
    from edps_mlflow.store.logs import route_library_logs

    uri = resolve_tracking_uri(tracking_uri)
    require_existing_store(uri)
    quiet_links_with_credentials(uri)
    route_library_logs()  # MLflow's logged tracebacks to the command's log file, off the terminal
    try:
        require_answer(uri)  # a server or database that does not answer: one line within its bound, not a minute
        return MlflowClient(uri)
    except (MlflowException, ImportError) as error:
        raise _store_error(uri, error) from None


def _store_error(uri: str, error: BaseException) -> EdpsError:
    from edps_mlflow.store.trouble import store_error_text

    return EdpsError(f"cannot reach the tracking store {redact_uri(uri)}: {store_error_text(error, uri)}")


def _experiments(client, names: tuple[str, ...]) -> list[tuple[str, str]]:
    """(id, name) per name, matched exactly first, else as a glob pattern; no names: every active experiment that
    holds a study run (``mlflow run .`` puts them in ``Default``). An unknown name lists those that exist."""
    everything = _all_experiments(client)
    if not names:
        found = [(e.experiment_id, e.name) for e in _with_studies(client, everything)]
        if not found:
            raise EdpsError(f"no experiment in {redact_uri(str(client.tracking_uri))} holds a study run"
                            f"{_existing(everything)}; run a study first (edps study, or mlflow run .)")
        return found
    found = []
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
    from mlflow.exceptions import MlflowException

    from edps_mlflow.store.read.status import with_studies

    try:
        return with_studies(client, experiments)
    except MlflowException as error:
        raise _store_error(str(client.tracking_uri), error) from None


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


def _searcher(client, experiment_ids: list[str]) -> study_index.Search:
    from mlflow.exceptions import MlflowException

    from edps_mlflow.store.client import searcher

    search = searcher(client, experiment_ids)

    def runs(conditions: str, deleted: bool, most: int | None) -> list:
        try:
            return search.runs(conditions, deleted, most)
        except MlflowException as error:
            raise _store_error(str(client.tracking_uri), error) from None

    return study_index.Search(search.experiment_ids, runs)


def _finished(runs: list) -> list:
    """The finished study runs that count: not one that a process finished after it had lost it (fence.py)."""
    from edps_mlflow.store.read.fence import Fence
    from edps_mlflow.store.read.runs import leased

    facts = [leased(run) for run in runs]
    experiments: dict[str, list] = {}  # epochs are an experiment's: a study key may be run in several
    for run, fact in zip(runs, facts):
        experiments.setdefault(str(run.info.experiment_id), []).append(fact)
    fences = {experiment_id: Fence.of(found) for experiment_id, found in experiments.items()}
    return [run for run, fact in zip(runs, facts) if fences[str(run.info.experiment_id)].counts(fact)]


def _probed(run: Any) -> bool:
    return bool(run.data.params.get(n.PARAM_SPEC_PREFIX + "probes"))


def _number(text: str | None) -> float | None:
    """A param (MLflow stores them as strings) as a number; None when absent or not a number."""
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


class _Shared(dict):
    """Shared, not copied, by the copies pandas makes of a table's ``attrs`` at every operation."""

    def __deepcopy__(self, memo: dict) -> _Shared:
        return self


def _study_row(run: Any, experiment: str) -> dict[str, Any] | None:
    """A study run as a row of the study table; None for one not of ours (or refused before it logged anything)."""
    tags, metrics, params = run.data.tags, run.data.metrics, run.data.params
    try:
        curve, batch_size = CurveId.from_tags(tags), int(tags[n.TAG_BATCH_SIZE])
    except (KeyError, ValueError):
        return None
    statuses = ("reached", "not_reached", "diverged", "superseded")
    return {**curve.as_dict(), "batch_size": batch_size, "experiment": experiment, "study_run_id": run.info.run_id,
            "study_key": tags.get(n.TAG_STUDY_KEY), "sweep_run_id": tags.get(n.MLFLOW_PARENT_RUN_ID),
            **{name: _number(params.get(n.PARAM_SPEC_PREFIX + name))
               for name in ("check_interval", "max_steps", "seed")},
            **{f"best_{name}": _number(params.get(n.PARAM_BEST_PREFIX + name)) for name in BEST_METAPARAMETERS},
            **{f"trials_{status}": metrics.get(n.trials_metric(status)) for status in statuses},
            "steps_to_result": metrics.get(n.METRIC_STEPS_TO_RESULT), "goal_error": metrics.get(n.METRIC_GOAL_ERROR),
            "trials_total": metrics.get(n.METRIC_TRIALS_TOTAL), "pack_size": metrics.get(n.METRIC_PACK_SIZE),
            "seconds_per_step": metrics.get(n.METRIC_SECONDS_PER_STEP), "device": params.get(n.PARAM_TIMING_DEVICE),
            "model_parameters": metrics.get(n.METRIC_MODEL_PARAMETERS),
            "model_parameter_bytes": metrics.get(n.METRIC_MODEL_PARAMETER_BYTES)}


def _goal_metric(workload: str, known: dict[str, str | None]) -> str | None:
    """"error" or "loss": what the workload's goal bounds; None for a workload this process does not know."""
    if workload not in known:
        try:
            known[workload] = "loss" if get_workload(workload).goal_metric is GoalMetric.LOSS else "error"
        except EdpsError:
            known[workload] = None
    return known[workload]


def _outcomes_tag(tags: dict[str, str], goal: float | None) -> str:
    """The tag of a row's trial outcomes: a ladder rung's own; the hardest rung's and a one-goal study's are
    edps.trial_outcomes."""
    try:
        goals = n.parse_goals_text(tags[n.TAG_GOALS])
    except (KeyError, ValueError):  # a one-goal study
        return n.TAG_TRIAL_OUTCOMES
    return n.TAG_TRIAL_OUTCOMES if goal is None else n.rung_outcomes_tag(goals, goal)


def _status_counts(text: str | None) -> dict[str, float]:
    """trials_<status> of a trial outcomes text; none when it is not readable."""
    columns = trial_outcome_columns([text])
    if not columns.readable[0]:
        return {}
    counts = np.bincount(columns.status_codes, minlength=len(columns.statuses))
    return {f"trials_{status.value}": float(count) for status, count in zip(columns.statuses, counts)}


def _study_rows(run: Any, experiment: str, goal_metrics: dict[str, str | None]) -> list[tuple[str, dict[str, Any]]]:
    """A study run's rows, each with the key of the measurement it is: one row, or one per rung of a goal ladder
    (keyed as the one-goal study of that rung, which measures the same thing); none for a run not of ours."""
    row = _study_row(run, experiment)
    if row is None:
        return []
    tags, metrics = run.data.tags, run.data.metrics
    row["goal_metric"] = _goal_metric(row["workload"], goal_metrics)
    try:
        goals = n.parse_goals_text(tags[n.TAG_GOALS])
    except (KeyError, ValueError):  # a one-goal study; one run again, or differing only in probes, is one result
        return [(tags.get(n.TAG_RESULT_KEY) or tags.get(n.TAG_STUDY_KEY) or run.info.run_id,
                 {**row, "goal": row["goal_error"]})]
    hardest_best = tags.get(n.goal_best_trial_tag(goals[-1]))
    rows = []
    for goal in goals:
        key = tags.get(n.goal_key_tag(goal)) or f"{row['study_key']}/{n.goal_text(goal)}"
        rung = {**row, "goal": goal, "goal_error": goal, "study_key": key,
                "steps_to_result": metrics.get(n.goal_steps_metric(goal), np.nan),
                **_status_counts(tags.get(_outcomes_tag(tags, goal)))}
        if tags.get(n.goal_best_trial_tag(goal)) != hardest_best:  # the run has the hardest rung's best only
            rung.update({f"best_{name}": None for name in BEST_METAPARAMETERS})
        rows.append((key, rung))
    return rows


def _outcome_tags(tags: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in tags.items() if key in (n.TAG_GOALS, n.TAG_TRIAL_OUTCOMES)
            or key.startswith(n.TAG_GOAL_OUTCOMES_PREFIX)}


def load_studies(experiments: tuple[str, ...], tracking_uri: str | None = None) -> pd.DataFrame:
    """The study table of the named experiments, or of every experiment with study runs when none is named."""
    client = _client(tracking_uri)
    found = _experiments(client, experiments)
    names = dict(found)
    runs = _finished(study_index.study_runs(_searcher(client, [i for i, _ in found])))
    rows: dict[str, dict[str, Any]] = {}
    goal_metrics: dict[str, str | None] = {}
    for run in sorted(runs, key=lambda r: r.info.start_time or 0):
        for key, row in _study_rows(run, names[run.info.experiment_id], goal_metrics):
            rows.pop(key, None)  # one row per measurement, the latest
            rows[key] = row
    if not rows:
        raise EdpsError(f"experiment(s) {', '.join(names.values())} hold no finished study runs"
                        + (f"; experiments with study runs: {_names(_with_studies(client, _all_experiments(client)))}"
                           if experiments else ""))
    table = pd.DataFrame(list(rows.values()), columns=list(STUDY_COLUMNS))
    # the trials' outcomes read with the studies, so that load_trials (fit's bootstrap) need not read them again
    table.attrs[_TRIAL_OUTCOMES_READ] = _Shared({run.info.run_id: _outcome_tags(run.data.tags) for run in runs})
    return table


def load_trials(studies: pd.DataFrame, tracking_uri: str | None = None) -> pd.DataFrame:
    """The studies' trials, each row's (a ladder rung's its own): from their tags as read with them, else their
    ``trials.csv``."""
    goals = studies["goal"] if "goal" in studies.columns else pd.Series(np.nan, index=studies.index)
    wanted = [(run_id, key, float(goal) if pd.notna(goal) else None)
              for run_id, key, goal in zip(studies["study_run_id"], studies["study_key"], goals)
              if isinstance(run_id, str)]
    read = studies.attrs.get(_TRIAL_OUTCOMES_READ) or {}
    tags = {run_id: read[run_id] for run_id, _, _ in wanted if run_id in read}
    missing = {run_id for run_id, _, _ in wanted if run_id not in tags}
    client = _client(tracking_uri) if missing else None
    if missing:
        tags.update({run_id: _outcome_tags(found) for run_id, found in _study_tags(client, studies, missing).items()})
    columns = trial_outcome_columns([tags.get(run_id, {}).get(_outcomes_tag(tags.get(run_id, {}), goal))
                                     for run_id, _, goal in wanted])
    downloads = [(*study, tags.get(study[0], {})) for study, readable in zip(wanted, columns.readable)
                 if not readable]
    frames = [_trials_frame([key for _, key, _ in wanted], columns)] if len(columns.trial_index) else []
    if downloads:
        frames += _downloaded_trials(client or _client(tracking_uri), downloads)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(TRIAL_COLUMNS))


def _trials_frame(keys: list[str], columns: TrialOutcomeColumns) -> pd.DataFrame:
    """The trials of studies ``keys`` from their tags' columns; keys and statuses categorical, made at once."""
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


def _downloaded_trials(client, studies: list[tuple[str, str, float | None, dict[str, str]]]) -> list[pd.DataFrame]:
    """Trial tables from the ``trials.csv`` artifacts of (run id, study key, goal, the run's outcome tags); a
    ladder's easier rung from its ``steps_to_goal_<goal>`` column."""
    from mlflow.exceptions import MlflowException

    def one(scratch: str, run_id: str, key: str, goal: float | None, tags: dict[str, str]) -> pd.DataFrame | None:
        try:
            path = client.download_artifacts(run_id, n.ARTIFACT_TRIALS_CSV, dst_path=tempfile.mkdtemp(dir=scratch))
        except (MlflowException, OSError):
            return None  # no artifact: that study gets no intervals
        try:
            frame = read_csv(path, columns=TRIAL_COLUMNS[1:])
        except EdpsError:
            return None  # not a trials table of ours: that study gets no intervals
        rung = n.goal_steps_column(goal) if goal is not None else ""
        if _outcomes_tag(tags, goal) != n.TAG_TRIAL_OUTCOMES:
            if rung not in frame.columns:
                return None  # the hardest rung's trials are not this rung's: no intervals
            # reached at this rung where the column has a value; else as at the hardest rung
            steps = pd.to_numeric(frame[rung], errors="coerce")
            frame["status"] = frame["status"].where(steps.isna(), "reached")
            frame["steps_to_result"] = steps
        frame["study_key"] = key
        return frame[[c for c in TRIAL_COLUMNS if c in frame.columns]]

    with tempfile.TemporaryDirectory(prefix="edps-analysis-") as scratch:
        frames = [one(scratch, *study) for study in studies]
    return [frame for frame in frames if frame is not None]


def _metric_rows(client, run_id: str, metric: str, base: dict, **more: Any) -> list[dict[str, Any]]:
    return [{**base, "step": point.step, "value": point.value, **more}
            for point in client.get_metric_history(run_id, metric)]


def _probed_trial_runs(client, experiment_ids: list[str], metric: str) -> list:
    return _searcher(client, experiment_ids)(filter_string(tags={n.TAG_KIND: n.KIND_TRIAL},
                                                           metrics_above={metric: -1e300}))


def load_probe_values(experiments: tuple[str, ...], metric: str, tracking_uri: str | None = None) -> pd.DataFrame:
    """A probe metric's latest value in each trial run that logged it."""
    client = _client(tracking_uri)
    ids = [i for i, _ in _experiments(client, experiments)]
    # Only a study with probes has trials that log them: without one, no search of every trial run's tags.
    probed = any(_probed(run) for run in study_index.study_runs(_searcher(client, ids)))
    rows = []
    for run in _probed_trial_runs(client, ids, metric) if probed else []:
        tags = run.data.tags
        base = {"workload": tags.get(n.TAG_WORKLOAD), "optimizer": tags.get(n.TAG_OPTIMIZER),
                "sparsity": float(tags.get(n.TAG_SPARSITY, "nan")),
                "pruning": tags.get(n.TAG_PRUNING, TAG_DEFAULTS["pruning"]),
                "parameterization": tags.get(n.TAG_PARAMETERIZATION, TAG_DEFAULTS["parameterization"]),
                "batch_size": int(tags.get(n.TAG_BATCH_SIZE, 0)),
                "trial_run_id": run.info.run_id, "study_key": tags.get(n.TAG_STUDY_KEY)}
        rows.append({**base, "value": run.data.metrics[metric]})
    if not rows:
        raise EdpsError(f"no trial in {_described(experiments)} logged {metric}; run studies with --probes")
    return pd.DataFrame(rows)


def _described(experiments: tuple[str, ...]) -> str:
    return ", ".join(experiments) if experiments else "every experiment with study runs"


def load_best_trial_probes(experiments: tuple[str, ...], metric: str, tracking_uri: str | None = None) -> pd.DataFrame:
    """``metric`` along each study's best trial's whole run (tag ``edps.best_probe_run``): a row per (study, probe
    step); a study probed before that tag pools its probed trials, cut by early stopping (column ``source``)."""
    client = _client(tracking_uri)
    ids = [i for i, _ in _experiments(client, experiments)]
    rows: list[dict[str, Any]] = []
    legacy: dict[str, dict[str, Any]] = {}
    seen_results: set[str] = set()
    for run in sorted(_finished(study_index.study_runs(_searcher(client, ids))),
                      key=lambda r: r.info.start_time or 0, reverse=True):
        tags = run.data.tags
        try:
            base = {**CurveId.from_tags(tags).as_dict(), "batch_size": int(tags[n.TAG_BATCH_SIZE]),
                    "study_run_id": run.info.run_id}
        except (KeyError, ValueError):
            continue
        result = tags.get(n.TAG_RESULT_KEY) or tags.get(n.TAG_STUDY_KEY) or run.info.run_id
        if not _probed(run) or result in seen_results:  # a result's latest study: probes never change a result
            continue
        seen_results.add(result)
        if tags.get(n.TAG_BEST_PROBE_RUN):
            rows += _metric_rows(client, tags[n.TAG_BEST_PROBE_RUN], metric, base,
                                 trial_run_id=tags[n.TAG_BEST_PROBE_RUN], source="best trial, whole run")
        elif n.TAG_PROBED_TRIALS not in tags and tags.get(n.TAG_STUDY_KEY):
            legacy[tags[n.TAG_STUDY_KEY]] = base
    for trial in _probed_trial_runs(client, ids, metric) if legacy else []:
        base = legacy.get(trial.data.tags.get(n.TAG_STUDY_KEY, ""))
        if base is not None:
            rows += _metric_rows(client, trial.info.run_id, metric, base, trial_run_id=trial.info.run_id,
                                 source="all probed trials, cut by early stopping (studies probed before "
                                        "--probe-trials)")
    if not rows:
        raise EdpsError(f"no study in {_described(experiments)} has {metric} along its best trial's run; run "
                        f"studies with --probes (a study whose trials all missed the goal has no best trial)")
    return pd.DataFrame(rows)
