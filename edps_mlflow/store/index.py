"""The study index: every study run of an experiment, readable without a search through its trial runs (a filter
on a tag's value scans every run of the store; docs/performance.md). Each study run is also one tag
``edps.index.<run id>`` of an index run (``edps.kind=study_index``, started 1 ms after the epoch and found by
that), holding the run's state, ``edps.*`` tags, parent, params and metrics as JSON (:func:`entry_of`).

An entry is written when its run is created and after each change of its state, from the run as the store holds
it (experiment.py), so whatever process is killed when: an entry that says FINISHED, FAILED or KILLED is final
(a study run never leaves those), one that says RUNNING is read again from the store, as are the RUNNING runs
(a run killed before its first entry). Readers of an experiment whose index is not complete
(``edps.index_complete``: made with the experiment, or after ``edps doctor --repair``) also search its study
runs by tag. Deleted study runs are left out. An entry is a snapshot: a tag edited by hand afterwards is not
in it. No MLflow here: callers pass their search (client.searcher).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping

from edps_mlflow import names as n
from edps_mlflow.filters import filter_string

ENTRY_FORMAT = 1
MAX_TAG_VALUE = 8000  # MLflow's limit on a tag's value (mlflow.utils.validation.MAX_TAG_VAL_LENGTH)
IDS_PER_SEARCH = 500  # each id is a bound parameter of the store's SQL; sqlite allows some thousands
PAGE_SIZE = 1000  # runs per page of a search (every_page)
DELETED_LISTED = 100  # the most deleted runs a reader lists to leave deleted study runs out (beyond: by id)
RUNNING = "RUNNING"
_OUR_TAGS = "edps."


@dataclass(frozen=True)
class RunInfoView:
    run_id: str
    experiment_id: str
    status: str
    start_time: int | None
    end_time: int | None


@dataclass(frozen=True)
class RunDataView:
    tags: dict[str, str]
    params: dict[str, str]
    metrics: dict[str, float]


@dataclass(frozen=True)
class RunView:
    """A study run with the fields of an MLflow Run that readers read, from the store or its entry (``indexed``)."""

    info: RunInfoView
    data: RunDataView
    indexed: bool = False

    @classmethod
    def of(cls, run: Any) -> "RunView":
        """The view of an MLflow Run."""
        info = run.info
        return cls(RunInfoView(info.run_id, str(info.experiment_id), info.status, info.start_time, info.end_time),
                   RunDataView(dict(run.data.tags), dict(run.data.params), dict(run.data.metrics)))


def entry_of(run: Any) -> str | None:
    """The index entry of a study run (an MLflow Run or a RunView), without its trial outcomes when they would
    not fit MLflow's limit on a tag (the analysis then reads its trials.csv); None when even that does not fit."""
    info, data = run.info, run.data
    tags = {key: value for key, value in data.tags.items()
            if key.startswith(_OUR_TAGS) or key == n.MLFLOW_PARENT_RUN_ID}
    document = {"format": ENTRY_FORMAT, "run_id": info.run_id, "experiment_id": str(info.experiment_id),
                "status": info.status, "start_time": info.start_time, "end_time": info.end_time, "tags": tags,
                "params": dict(data.params), "metrics": dict(data.metrics)}
    # a ladder's easier rungs' outcomes go first, then the hardest's
    for dropped in ((), [key for key in tags if key.startswith(n.TAG_GOAL_OUTCOMES_PREFIX)], [n.TAG_TRIAL_OUTCOMES]):
        for key in dropped:
            tags.pop(key, None)
        text = json.dumps(document, separators=(",", ":"), sort_keys=True)
        if len(text) <= MAX_TAG_VALUE:
            return text
    return None


def view_of_entry(text: str, run_id: str) -> RunView | None:
    """The study run ``run_id`` from its index entry; None when the entry is not one this code can read."""
    try:
        document = json.loads(text)
        if document.get("format") != ENTRY_FORMAT or document.get("run_id") != run_id:
            return None
        info = RunInfoView(run_id, str(document["experiment_id"]), str(document["status"]), document["start_time"],
                           document["end_time"])
        data = RunDataView({str(k): str(v) for k, v in document["tags"].items()},
                           {str(k): str(v) for k, v in document["params"].items()},
                           {str(k): float(v) for k, v in document["metrics"].items()})
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return RunView(info, data, indexed=True)


def entries(index_run: Any) -> dict[str, str]:
    """run id -> entry, of one index run."""
    return {key[len(n.TAG_INDEX_PREFIX):]: value for key, value in index_run.data.tags.items()
            if key.startswith(n.TAG_INDEX_PREFIX)}


@dataclass(frozen=True)
class Search:
    """A search of the runs of ``experiment_ids``: ``search(filter string, deleted)`` returns every run found
    (the deleted ones with ``deleted``); ``runs(filter string, deleted, most)`` the first ``most`` (None: all)."""

    experiment_ids: tuple[str, ...]
    runs: Callable[[str, bool, int | None], Iterable[Any]]

    def __call__(self, conditions: str, deleted: bool = False) -> list[Any]:
        return list(self.runs(conditions, deleted, None))


def every_page(search_page: Callable[[int, str | None], Any], most: int | None = None) -> list[Any]:
    """Every run of a paged search (``search_page(max_results, page_token)``), or the first ``most``."""
    runs: list[Any] = []
    token = None
    while True:
        page = search_page(min(PAGE_SIZE, most - len(runs)) if most else PAGE_SIZE, token)
        runs.extend(page)
        token = page.token
        if not token or (most is not None and len(runs) >= most):
            return runs


def index_runs(search: Search) -> list[Any]:
    """The active index runs, earliest first (a writer adds to the first), found by their start time (the epoch)
    and kind; one of an earlier version by its name (a scan of tags), only where none is at the epoch."""
    found = [run for run in search(filter_string(started_before=n.INDEX_START_TIME + 1), False)
             if run.data.tags.get(n.TAG_KIND) == n.KIND_STUDY_INDEX]
    without = set(search.experiment_ids) - {str(run.info.experiment_id) for run in found}
    if without:
        found += [run for run in search(filter_string(run_name=n.INDEX_RUN_NAME), False)
                  if run.data.tags.get(n.TAG_KIND) == n.KIND_STUDY_INDEX and str(run.info.experiment_id) in without]
    return sorted(found, key=lambda r: (r.info.start_time or 0, r.info.run_id))


def complete(indexes: list[Any]) -> bool:
    return any(run.data.tags.get(n.TAG_INDEX_COMPLETE) == "true" for run in indexes)


def by_ids(search: Search, run_ids: Iterable[str], deleted: bool = False) -> list[Any]:
    """The runs with these ids (active ones, or deleted ones), a few hundred ids per search."""
    ids = list(dict.fromkeys(run_ids))
    found: list[Any] = []
    for start in range(0, len(ids), IDS_PER_SEARCH):
        found.extend(search(filter_string(run_ids=ids[start:start + IDS_PER_SEARCH]), deleted))
    return found


def deleted_among(search: Search, run_ids: list[str]) -> set[str]:
    """The ids among ``run_ids`` of deleted runs: from the list of the experiments' deleted runs when it holds
    at most DELETED_LISTED (one search without a filter to parse), else by id."""
    if not run_ids:
        return set()
    listed = list(search.runs("", True, DELETED_LISTED + 1))
    if len(listed) > DELETED_LISTED:
        listed = by_ids(search, run_ids, deleted=True)
    return {run.info.run_id for run in listed} & set(run_ids)


def _matches(run: Any, wanted: Mapping[str, str]) -> bool:
    return all(run.data.tags.get(key) == value for key, value in wanted.items())


def with_tags(views: Iterable[RunView], tags: Mapping[str, str]) -> list[RunView]:
    """The runs of ``views`` (as :func:`study_runs` returned them) that carry ``tags``."""
    return [view for view in views if _matches(view, tags)]


def study_runs(search: Search, tags: Mapping[str, str] | None = None) -> list[RunView]:
    """Every active study run that ``search`` covers, with ``tags`` if given (compared here, not in the store's
    search); ``indexed`` says that a run has an entry in an index run."""
    wanted = {n.TAG_KIND: n.KIND_STUDY, **(tags or {})}
    found: dict[str, RunView] = {}
    indexes = index_runs(search)
    for index_run in indexes:
        for run_id, text in entries(index_run).items():
            view = view_of_entry(text, run_id)
            if view is not None:
                found[run_id] = view
    listed = set(found)
    # An entry that says RUNNING is read again from the store: its run may have ended since.
    stale = [run_id for run_id, view in found.items() if view.info.status == RUNNING]
    for run_id in stale:
        found.pop(run_id)
    fresh = [*by_ids(search, stale), *(run for run in search(filter_string(status=RUNNING), False)
                                       if run.data.tags.get(n.TAG_KIND) == n.KIND_STUDY)]
    incomplete = {experiment_id for experiment_id in search.experiment_ids
                  if not complete([run for run in indexes if str(run.info.experiment_id) == experiment_id])}
    if incomplete:
        # Study runs made before the index (or by an older version): searched by their tags.
        fresh += [run for run in search(filter_string(tags=wanted), False)
                  if str(run.info.experiment_id) in incomplete]
    for run in fresh:
        found[run.info.run_id] = replace(RunView.of(run), indexed=run.info.run_id in listed)
    for run_id in deleted_among(search, [run_id for run_id, view in found.items() if view.indexed]):
        found.pop(run_id, None)
    return [view for view in found.values() if _matches(view, wanted)]


def experiments_with_studies(search: Search, experiment_ids: list[str],
                             has_study_run: Callable[[str], bool]) -> list[str]:
    """The ids among ``experiment_ids`` (those ``search`` covers) that hold a study run: told by their index runs;
    ``has_study_run(id)`` (a search by tag) only where the index is missing, or not complete and without one."""
    indexes: dict[str, list[Any]] = {}
    for run in index_runs(search):
        indexes.setdefault(str(run.info.experiment_id), []).append(run)
    found = []
    for experiment_id in experiment_ids:
        runs = indexes.get(str(experiment_id), [])
        listed = any(_matches(view, {n.TAG_KIND: n.KIND_STUDY}) for run in runs
                     for run_id, text in entries(run).items() if (view := view_of_entry(text, run_id)))
        if listed or (not complete(runs) and has_study_run(experiment_id)):
            found.append(experiment_id)
    return found
