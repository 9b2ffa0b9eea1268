"""What ``edps doctor`` reads: the runs on which the store's invariants can fail, as plain facts."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterable

from edps_mlflow import names as n
from edps_mlflow.errors import EdpsError
from edps_mlflow.filters import filter_string
from edps_mlflow.results import RunState
from edps_mlflow.store import index
from edps_mlflow.store.client import StoreClient, every_experiment, searcher
from edps_mlflow.store.read.fence import owner_end, trial_epochs
from edps_mlflow.store.read.runs import LeasedRun, leased
from edps_mlflow.uris import redact_uri

# A client's clock may be behind doctor's: a run it starts now may carry a time up to this much earlier.
CLOCK_MARGIN_MS = 10 * 60 * 1000
_FINISHED = RunState.FINISHED.value


@dataclass(frozen=True)
class RunFacts(LeasedRun):
    """What ``edps doctor`` checks of one run of ours: its lease, and what else can break."""

    study_key: str | None
    trial_key: str | None
    sweep_key: str | None
    ours: bool  # carries a tag that only this project writes
    gave_way: bool  # a run that yielded to an earlier live run of its key
    end_time: int | None = None  # ms; None while RUNNING
    marked_dead: bool = False  # carries the reason a process wrote when it marked the run FAILED (edps.error)
    summarised: bool = False  # a sweep run that logged its end-of-sweep summary (studies/done)
    indexed: bool = False  # a study run with an entry in the study index
    trial_epochs: tuple[tuple[int, str], ...] = ()  # a trial run's (fence.trial_epochs)
    owner_end: tuple[str, int] | None = None  # a sweep run's end as its current owner recorded it (fence.owner_end)


@dataclass(frozen=True)
class DoctorRead:
    """What doctor read of one experiment: the runs to check, and the time from which the next check need
    read only the runs that start or end later (None: it read none of that kind)."""

    facts: list[RunFacts]
    checked_until: int | None


def experiments(client: StoreClient, name: str | None) -> list[tuple[str, str]]:
    """(id, name) of the experiment named ``name``, or of every active experiment."""
    if name is None:
        return [(e.experiment_id, e.name) for e in every_experiment(client)]
    found = client.get_experiment_by_name(name)
    if found is None:
        raise EdpsError(f"no experiment named {name!r} in {redact_uri(str(client.tracking_uri))}")
    return [(found.experiment_id, found.name)]


def doctor_read(client: StoreClient, experiment_id: str, checked_until: int | None = None,
                recheck: Iterable[str] = (), search_malformed: bool = True) -> DoctorRead:
    """The runs of the experiment on which doctor's invariants can fail (docs/reliability.md): the study runs, their
    sweep runs and the RUNNING runs; with ``checked_until`` (ms) the runs that started or ended since and those of
    ``recheck``; without, every sweep run and (``search_malformed``) the runs of ours without their kind or keys,
    by searches on tags; and the FINISHED trial runs of :func:`_trial_searches`."""
    started = int(time.time() * 1000)
    search = searcher(client, [experiment_id])
    studies, found = _runs_to_check(search, checked_until, recheck, search_malformed)
    for conditions in _trial_searches(search, studies, list(found.values()), first_check=checked_until is None):
        for run in search(conditions, False):
            found.setdefault(run.info.run_id, run)
    return DoctorRead([_facts(run) for run in found.values()], started)


def _runs_to_check(search: index.Search, checked_until: int | None, recheck: Iterable[str],
                   search_malformed: bool) -> tuple[list[index.RunView], dict[str, Any]]:
    """(the study runs, run id -> every run to check but the trial runs of :func:`_trial_searches`)."""
    searches: tuple[str, ...] = ()
    if checked_until is None:
        known_kinds = (n.KIND_STUDY, n.KIND_TRIAL, n.KIND_SWEEP, n.KIND_ANALYSIS, n.KIND_STUDY_INDEX)
        malformed = (filter_string(tags={n.TAG_KIND: n.KIND_TRIAL}, tags_absent=[n.TAG_TRIAL_KEY]),
                     filter_string(tags={n.TAG_KIND: n.KIND_TRIAL}, tags_absent=[n.TAG_STUDY_KEY]),
                     filter_string(tags_absent=[n.TAG_KIND], tags_present=[n.TAG_VERSION]),
                     filter_string(tags_present=[n.TAG_KIND], tags_not={n.TAG_KIND: known_kinds}),
                     filter_string(tags={n.TAG_KIND: n.KIND_TRIAL}, status=_FINISHED,
                                   tags_absent=[n.MLFLOW_PARENT_RUN_ID]))
        # every sweep run (a few): one that finished its grid may have been overwritten FAILED, and one that
        # ran no study is not the parent of any
        searches = (malformed if search_malformed else ()) + (filter_string(tags={n.TAG_KIND: n.KIND_SWEEP}),)
    # Each search on tags scans the tags of every run in the store: sent at once, they share the store's cores
    # with the index's read and each other (sqlite releases the GIL while it reads).
    with ThreadPoolExecutor(max_workers=len(searches) or 1) as pool:
        scans = [pool.submit(search, conditions, False) for conditions in searches]
        studies = index.study_runs(search)
        found: dict[str, Any] = {run.info.run_id: run for run in studies}
        parents = {p for run in studies if (p := run.data.tags.get(n.MLFLOW_PARENT_RUN_ID))}
        more = [search(filter_string(status=RunState.RUNNING.value), False), index.by_ids(search, parents)]
        if checked_until is not None:
            since = checked_until - CLOCK_MARGIN_MS
            more += [search(filter_string(started_from=since), False), search(filter_string(ended_from=since), False),
                     index.by_ids(search, recheck)]
        for runs in [*more, *(scan.result() for scan in scans)]:
            for run in runs:
                found.setdefault(run.info.run_id, run)
    return studies, found


def _trial_searches(search: index.Search, studies: list[index.RunView], found: list[Any],
                    first_check: bool) -> list[str]:
    """The searches for the FINISHED trial runs doctor must see: those of each study family where two study runs
    may have finished trial runs (a FINISHED one whose count METRIC_TRIAL_RUNS_FINISHED is 0 finished none), and
    of those without a parent; in the first check, those of the study runs that ended without finishing."""
    writers: dict[str, int] = {}  # study family -> study runs that may have finished trial runs in it
    for run in studies:
        if run.info.status == _FINISHED and run.data.metrics.get(n.METRIC_TRIAL_RUNS_FINISHED) == 0:
            continue
        for family in _trial_families(search, run):
            writers[family] = writers.get(family, 0) + 1
    families = {family for family, count in writers.items() if count > 1}
    parents = []
    if first_check:
        # A trial run finished after its lease was lost is FINISHED under an ended study run that did not
        # finish: the run's own trial runs when it names no family.
        for run in studies:
            if run.info.status in (_FINISHED, RunState.RUNNING.value):
                continue
            own = _trial_families(search, run)
            families.update(own)
            if not own:
                parents.append(run.info.run_id)
    keys = set()
    for run in found:
        tags = run.data.tags
        orphan = not tags.get(n.MLFLOW_PARENT_RUN_ID)
        if tags.get(n.TAG_KIND) == n.KIND_TRIAL and run.info.status == _FINISHED and orphan:
            if tags.get(n.TAG_STUDY_FAMILY):
                families.add(tags[n.TAG_STUDY_FAMILY])
            elif tags.get(n.TAG_STUDY_KEY):
                keys.add(tags[n.TAG_STUDY_KEY])
    finished_trials = [*({n.TAG_STUDY_FAMILY: family} for family in sorted(families)),
                       *({n.TAG_STUDY_KEY: key} for key in sorted(keys)),
                       *({n.MLFLOW_PARENT_RUN_ID: parent} for parent in parents)]
    return [filter_string(tags={n.TAG_KIND: n.KIND_TRIAL, **tags}, status=_FINISHED) for tags in finished_trials]


def _trial_families(search: index.Search, run: Any) -> list[str]:
    """The study families of a study run's trial runs (see :func:`_trial_searches`)."""
    tags, params = run.data.tags, run.data.params
    if tags.get(n.TAG_TRIAL_FAMILIES):
        return tags[n.TAG_TRIAL_FAMILIES].split(",")
    if params.get(n.PARAM_SPEC_PREFIX + "probes") and params.get(n.PARAM_SPEC_PREFIX + "probe_trials") == "best":
        # Made before the tag, by a study whose trials are another study's (StudySpec.training_spec): ask its
        # trial runs for their families.
        trials = search(filter_string(tags={n.TAG_KIND: n.KIND_TRIAL, n.MLFLOW_PARENT_RUN_ID: run.info.run_id}), False)
        return sorted({t.data.tags[n.TAG_STUDY_FAMILY] for t in trials if t.data.tags.get(n.TAG_STUDY_FAMILY)})
    return [tags[n.TAG_STUDY_FAMILY]] if tags.get(n.TAG_STUDY_FAMILY) else []


def _facts(run: Any) -> RunFacts:
    tags = run.data.tags
    return RunFacts(
        **vars(leased(run)), study_key=tags.get(n.TAG_STUDY_KEY), trial_key=tags.get(n.TAG_TRIAL_KEY),
        sweep_key=tags.get(n.TAG_SWEEP_KEY), gave_way=n.TAG_YIELDED_TO in tags, end_time=run.info.end_time,
        ours=any(tag in tags for tag in (n.TAG_KIND, n.TAG_VERSION, n.TAG_HEARTBEAT)), marked_dead=n.TAG_ERROR in tags,
        summarised=n.METRIC_STUDIES_DONE in run.data.metrics, indexed=getattr(run, "indexed", False),
        trial_epochs=tuple(trial_epochs(tags)) if tags.get(n.TAG_KIND) == n.KIND_TRIAL else (),
        owner_end=owner_end(tags))


def unindexed_study_runs(client: StoreClient, experiment_id: str) -> list[str]:
    """The experiment's study runs without an entry in its study index (a search by tag: --repair only)."""
    search = searcher(client, [experiment_id])
    listed = {run_id for index_run in index.index_runs(search) for run_id in index.entries(index_run)}
    return [run.info.run_id for run in search(filter_string(tags={n.TAG_KIND: n.KIND_STUDY}), False)
            if run.info.run_id not in listed]


def index_is_complete(client: StoreClient, experiment_id: str) -> bool:
    """Whether the experiment's study index holds every study run of it."""
    return index.complete(index.index_runs(searcher(client, [experiment_id])))
