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
from edps_mlflow.store.client import StoreClient, open_store, resolve_tracking_uri
from edps_mlflow.store.experiment import complete_index, record_doctor_check
from edps_mlflow.store.ownership.claim import mark_dead
from edps_mlflow.store.ownership.lease import expired_reason, lease_seconds
from edps_mlflow.store.read.doctor import (RunFacts, doctor_read, experiments, index_is_complete,
                                           unindexed_study_runs)
from edps_mlflow.store.read.fence import Fence
from edps_mlflow.store.read.runs import expired
from edps_mlflow.store.trouble import store_errors
from edps_mlflow.uris import require_existing_store

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


def _trials(facts: list[RunFacts], counting: bool) -> list[RunFacts]:
    """The FINISHED trial runs that count (``counting``), or those that do not: finished by a process after another
    had taken its study over (read/fence.py; the study runs among ``facts`` tell)."""
    fence = Fence.of(facts)
    return [f for f in facts if f.kind == KIND_TRIAL and f.state is RunState.FINISHED
            and fence.counts_trial(f.trial_epochs) == counting]


def harmless(facts: list[RunFacts]) -> list[tuple[str, str]]:
    """(run id, what it is) for each run that a process finished after its study was taken over: the write landed
    (MLflow has no conditional write), and nothing counts it (read/fence.py)."""
    fence = Fence.of(facts)
    late = "FINISHED by a process after its study was taken over"
    found = []
    for fact in _trials(facts, counting=False):
        epoch, key = max(fact.trial_epochs)
        now = fence.keys.get(key)
        found.append((fact.run_id, f"trial run {late} (epoch {epoch} of study {key[:12]}, whose epoch is now {now})"))
    for fact in facts:
        if fact.kind == KIND_STUDY and fact.state is RunState.FINISHED and not fence.counts(fact):
            now = fence.modes.get((fact.key, fact.full_trials))
            found.append((fact.run_id, f"study run {late} (epoch {fact.epoch}, the study's is now {now})"))
    return [(run_id, f"{text}: harmless, nothing counts it") for run_id, text in found]


def finished_after_lease_lost(facts: list[RunFacts]) -> list[RunFacts]:
    """FINISHED trial runs made before epochs (read/fence.py) that a stalled process of an older version finished
    after it had lost its study's lease, and that still count."""
    ended = {f.run_id: f.end_time for f in facts if f.kind == KIND_STUDY and f.state is not RunState.RUNNING}
    found = []
    for fact in _trials(facts, counting=True):
        parent_end = ended.get(fact.parent_run_id or "")
        late = parent_end is not None and fact.end_time is not None and fact.end_time > parent_end
        if max(fact.trial_epochs)[0] == 0 and (fact.marked_dead or late):
            found.append(fact)
    return found


def rewritten_sweep_ends(facts: list[RunFacts]) -> list[tuple[RunFacts, str, int | None]]:
    """Ended sweep runs whose end is not their owner's, with the owner's (status, end time): the end their current
    owner recorded under its token (read/fence.py), or, on a run without one (older versions), FINISHED (keeping
    the end time) for a run that logged its end-of-grid summary but is FAILED or KILLED."""
    found: list[tuple[RunFacts, str, int | None]] = []
    for fact in facts:
        if fact.kind != KIND_SWEEP or fact.state is RunState.RUNNING:
            continue
        if fact.owner_end is not None:
            if (fact.state.value, fact.end_time) != fact.owner_end:
                found.append((fact, *fact.owner_end))
        elif fact.summarised and fact.state in (RunState.FAILED, RunState.KILLED):
            found.append((fact, RunState.FINISHED.value, None))
    return found


def _rewritten(fact: RunFacts, status: str, end_time: int | None) -> str:
    if end_time is None:
        return (f"sweep run is {fact.state.value} although it finished its grid (its summary is logged): a stalled "
                f"process overwrote its end")
    return (f"sweep run's end was rewritten by a process that did not own it: its owner ended it {status} at "
            f"{_when(end_time)}, it now says {fact.state.value} at {_when(fact.end_time)}")


def _when(ms: int | None) -> str:
    return "-" if ms is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


def problems(facts: list[RunFacts], lease: float, now: float) -> list[tuple[str, str]]:
    """(run id or key, what is wrong) for every broken invariant: a run RUNNING whose owner is gone, a trial run
    FINISHED after its lease was lost (older versions), a sweep run whose end is not its owner's, a run of ours
    without its kind or key, more than one FINISHED study run that counts per study key and early-stopping mode,
    or trial run per trial key (read/fence.py: what a process wrote after it lost its run counts nowhere)."""
    found = [(f.run_id, f"{f.kind} run is RUNNING but its owner is gone ({expired_reason(lease, f.owner)})")
             for f in expired(facts, lease, now)]
    found += [(f.run_id, "trial run FINISHED after its lease was lost (a stalled process finished it after "
                         "another process had taken its study over)") for f in finished_after_lease_lost(facts)]
    found += [(f.run_id, _rewritten(f, status, end)) for f, status, end in rewritten_sweep_ends(facts)]
    found += [(f.run_id, text) for f in facts if f.ours and (text := _missing_key(f))]
    fence = Fence.of(facts)
    studies: dict[tuple[str, bool], list[str]] = defaultdict(list)
    trials: dict[str, list[str]] = defaultdict(list)
    for fact in facts:
        if fact.kind == KIND_STUDY and fact.study_key and fence.counts(fact):
            studies[(fact.study_key, fact.full_trials)].append(fact.run_id)
    for fact in _trials(facts, counting=True):
        if fact.trial_key:
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
    uri = resolve_tracking_uri(tracking_uri)
    require_existing_store(uri)  # a check never creates the store it was asked to check
    client = open_store(uri)
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
    for subject, text in [*found, *harmless(read.facts)]:
        print(f"{name}: {subject}: {text}", file=out)
    if not complete and any(f.kind == KIND_STUDY for f in read.facts):  # an experiment of no studies needs none
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
    """Mark FAILED the runs of dead owners and the trial runs finished after their lease was lost (older versions),
    end the sweep runs whose end was rewritten as their owner did, and complete the study index."""
    late = ("finished after its lease was lost: not a measurement this store trusts (marked FAILED by edps doctor "
            "--repair)")
    for runs, reason, why in (
            (expired(facts, lease, time.time()), lambda f: expired_reason(lease, f.owner), "owner gone"),
            (finished_after_lease_lost(facts), lambda f: late, "finished after its lease was lost")):
        for fact in runs:
            mark_dead(client, [fact.run_id], reason(fact))
            print(f"{name}: repaired: {fact.kind} run {fact.run_id} marked FAILED ({why})", file=out)
    for fact, status, end_time in rewritten_sweep_ends(facts):
        if end_time is None:
            client.update_run(fact.run_id, status=status)
            print(f"{name}: repaired: sweep run {fact.run_id} marked FINISHED (it had finished its grid)", file=out)
        else:
            client.set_terminated(fact.run_id, status, end_time=end_time)
            print(f"{name}: repaired: sweep run {fact.run_id} ended {status} again, as its owner ended it", file=out)
    missing = unindexed_study_runs(client, experiment_id)
    if missing or not index_is_complete(client, experiment_id):
        indexed = complete_index(client, experiment_id, missing)
        print(f"{name}: repaired: {indexed} study runs added to the study index"
              + ("; it is complete" if indexed == len(missing) else ""), file=out)


def _run_ids(subject: str, text: str, facts: list[RunFacts]) -> list[str]:
    """The runs a problem line names (its subject, or the runs listed after a key)."""
    known = {f.run_id for f in facts}
    return [word.strip(",") for word in [subject, *text.split()] if word.strip(",") in known]
