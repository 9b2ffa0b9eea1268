"""``edps doctor``: the store's invariants (docs/reliability.md), one line per problem; ``--repair`` mends what
a resumed sweep would. It reads what can break, not every run (store/read/doctor.py)."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import TextIO

from edps_mlflow.names import (EXPERIMENT_TAG_CHECKED_UNTIL, EXPERIMENT_TAG_CREATED_BY, EXPERIMENT_TAG_RECHECK,
                               EXPERIMENT_TAG_SEARCHED_KEYLESS, KIND_ANALYSIS, KIND_STUDY, KIND_STUDY_INDEX, KIND_SWEEP,
                               KIND_TRIAL)
from edps_mlflow.results import RunState
from edps_mlflow.store.client import StoreClient, open_store
from edps_mlflow.store.experiment import complete_index, record_doctor_check
from edps_mlflow.store.ownership.claim import mark_dead
from edps_mlflow.store.ownership.lease import expired_reason, lease_seconds
from edps_mlflow.store.read.doctor import (RunFacts, doctor_read, experiments, index_is_complete,
                                           unindexed_study_runs)
from edps_mlflow.store.read.runs import expired
from edps_mlflow.store.trouble import store_errors

MAX_RECHECK = 500  # the runs of problems a check remembers for the next (a tag); with more, the next reads all


def _missing_key(fact: RunFacts) -> str | None:
    needed = {KIND_STUDY: (fact.study_key,), KIND_TRIAL: (fact.trial_key, fact.study_key),
              KIND_SWEEP: (fact.sweep_key,), KIND_ANALYSIS: (), KIND_STUDY_INDEX: ()}
    if fact.kind is None:
        # A run that gave way (the launcher's run has its kind removed) is accounted for.
        return None if fact.gave_way else "has edps tags but no edps.kind"
    if fact.kind not in needed:
        return f"has an unknown kind {fact.kind!r}"
    return None if all(needed[fact.kind]) else f"is a {fact.kind} run without its key"


def finished_after_lease_lost(facts: list[RunFacts]) -> list[RunFacts]:
    """FINISHED trial runs that a stalled process finished after it had lost its study's lease."""
    ended = {f.run_id: f.end_time for f in facts if f.kind == KIND_STUDY and f.state is not RunState.RUNNING}
    found = []
    for fact in facts:
        if fact.kind != KIND_TRIAL or fact.state is not RunState.FINISHED:
            continue
        parent_end = ended.get(fact.parent_run_id or "")
        if fact.marked_dead or (parent_end is not None and fact.end_time is not None and fact.end_time > parent_end):
            found.append(fact)
    return found


def finished_sweeps_marked_failed(facts: list[RunFacts]) -> list[RunFacts]:
    """Sweep runs that logged their end-of-grid summary but are FAILED or KILLED."""
    return [f for f in facts if f.kind == KIND_SWEEP and f.summarised and f.state in (RunState.FAILED, RunState.KILLED)]


def problems(facts: list[RunFacts], lease: float, now: float) -> list[tuple[str, str]]:
    """(run id or key, what is wrong) for every broken invariant: a run RUNNING whose owner is gone, a trial run
    FINISHED after its lease was lost, a sweep run that finished its grid but is FAILED or KILLED, a run of ours
    without its kind or key, more than one FINISHED study run per study key and early-stopping mode, or trial
    run per trial key."""
    found = [(f.run_id, f"{f.kind} run is RUNNING but its owner is gone ({expired_reason(lease)})")
             for f in expired(facts, lease, now)]
    found += [(f.run_id, "trial run FINISHED after its lease was lost (a stalled process finished it after "
                         "another process had taken its study over)") for f in finished_after_lease_lost(facts)]
    found += [(f.run_id, f"sweep run is {f.state.value} although it finished its grid (its summary is logged): "
                         f"a stalled process overwrote its end") for f in finished_sweeps_marked_failed(facts)]
    found += [(f.run_id, text) for f in facts if f.ours and (text := _missing_key(f))]
    studies: dict[tuple[str, bool], list[str]] = defaultdict(list)
    trials: dict[str, list[str]] = defaultdict(list)
    for fact in facts:
        if fact.state is RunState.FINISHED and fact.kind == KIND_STUDY and fact.study_key:
            studies[(fact.study_key, fact.full_trials)].append(fact.run_id)
        elif fact.state is RunState.FINISHED and fact.kind == KIND_TRIAL and fact.trial_key:
            trials[fact.trial_key].append(fact.run_id)
    found += [(key, f"{len(ids)} FINISHED study runs of one study key: {', '.join(ids)}")
              for (key, _), ids in studies.items() if len(ids) > 1]
    found += [(key, f"{len(ids)} FINISHED trial runs of one trial key (trained twice): {', '.join(ids)}")
              for key, ids in trials.items() if len(ids) > 1]
    return found


def run_doctor(experiment: str | None, repair: bool, out: TextIO, tracking_uri: str | None = None,
               full: bool = False) -> int:
    """Print one line per problem (and per repair); the number of problems left. ``full``: search for runs
    without their kind or keys even in an experiment made by edps-mlflow."""
    client = open_store(tracking_uri)
    lease = lease_seconds()
    with store_errors(client):
        return sum(_check(client, experiment_id, name, repair, full, lease, out)
                   for experiment_id, name in experiments(client, experiment))


def _check(client: StoreClient, experiment_id: str, name: str, repair: bool, full: bool, lease: float,
           out: TextIO) -> int:
    """Check one experiment (after repairing it, with ``repair``); the number of problems left."""
    tags = client.get_experiment(experiment_id).tags
    checked = tags.get(EXPERIMENT_TAG_CHECKED_UNTIL, "")
    checked_until = int(checked) if checked.isdigit() and not repair and not full else None
    recheck = [run_id for run_id in tags.get(EXPERIMENT_TAG_RECHECK, "").split(",") if run_id]
    # In an experiment that edps-mlflow created, every run of ours was created with its kind and keys in one
    # request: only a run made by hand lacks them.
    search_malformed = full or repair or not tags.get(EXPERIMENT_TAG_CREATED_BY)
    # A later check reads every run made since the previous one: it has checked every run when the
    # checks before it had (only an experiment made by edps-mlflow is ever checked without searching).
    every_run = search_malformed or (
        checked_until is not None and tags.get(EXPERIMENT_TAG_SEARCHED_KEYLESS) == "true")
    read = doctor_read(client, experiment_id, checked_until, recheck, search_malformed)
    if repair:
        _repair(client, experiment_id, name, read.facts, lease, out)
        read = doctor_read(client, experiment_id, None, search_malformed=search_malformed)
    complete = index_is_complete(client, experiment_id)
    found = problems(read.facts, lease, time.time())
    if complete:
        found += [(f.run_id, "study run is not in the study index, which says it is complete (written by "
                             "an older version?): `edps doctor --repair` adds it") for f in read.facts
                  if f.kind == KIND_STUDY and f.state is not RunState.RUNNING and not f.indexed]
    for subject, text in found:
        print(f"{name}: {subject}: {text}", file=out)
    if not complete:
        print(f"{name}: the study index is not complete (study runs made before it): commands also search "
              f"the study runs, more slowly; `edps doctor --repair` completes it", file=out)
    involved = sorted({run_id for subject, text in found for run_id in _run_ids(subject, text, read.facts)})
    record_doctor_check(client, experiment_id, read.checked_until if len(involved) <= MAX_RECHECK else None,
                        involved[:MAX_RECHECK], every_run)
    if every_run:
        print(f"{name}: {len(read.facts)} runs read, all runs checked", file=out)
    else:
        print(f"{name}: {len(read.facts)} runs read, all runs checked but for runs without their kind or keys, "
              f"which edps-mlflow, that made this experiment, never writes (--full searches for them)", file=out)
    return len(found)


def _repair(client: StoreClient, experiment_id: str, name: str, facts: list[RunFacts], lease: float,
            out: TextIO) -> None:
    """Mark FAILED the runs of dead owners and the trial runs finished after their lease was lost, FINISHED
    the sweep runs that finished their grid, and complete the study index."""
    for runs, reason, why in (
            (expired(facts, lease, time.time()), expired_reason(lease), "owner gone"),
            (finished_after_lease_lost(facts), "finished after its lease was lost: not a measurement this store "
             "trusts (marked FAILED by edps doctor --repair)", "finished after its lease was lost")):
        mark_dead(client, [f.run_id for f in runs], reason)
        for fact in runs:
            print(f"{name}: repaired: {fact.kind} run {fact.run_id} marked FAILED ({why})", file=out)
    for fact in finished_sweeps_marked_failed(facts):
        client.update_run(fact.run_id, status=RunState.FINISHED.value)
        print(f"{name}: repaired: sweep run {fact.run_id} marked FINISHED (it had finished its grid)", file=out)
    missing = unindexed_study_runs(client, experiment_id)
    if missing or not index_is_complete(client, experiment_id):
        indexed = complete_index(client, experiment_id, missing)
        print(f"{name}: repaired: {indexed} study runs added to the study index"
              + ("; it is complete" if indexed == len(missing) else ""), file=out)


def _run_ids(subject: str, text: str, facts: list[RunFacts]) -> list[str]:
    """The runs a problem line names (its subject, or the runs listed after a key)."""
    known = {f.run_id for f in facts}
    return [word.strip(",") for word in [subject, *text.split()] if word.strip(",") in known]
