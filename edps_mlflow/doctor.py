"""``edps doctor``: the store's invariants, checked for one experiment or all, one line per problem.

- no study or sweep run RUNNING with an expired lease, and no trial run RUNNING under a study run
  that is not live (``--repair`` marks them FAILED, as a resumed sweep would);
- every run of ours has its kind and its key (study, trial or sweep key);
- at most one FINISHED study run per study key and early-stopping mode;
- at most one FINISHED trial run per trial key (older versions could train a trial twice);
- no trial run finished after its lease was lost: FINISHED although a process had marked it FAILED
  (``edps.error``), or after its study run had ended (a process stalled past its lease and woken up, as
  versions before the ownership checks allowed); ``--repair`` marks them FAILED again (the study that took
  the work over has its own measurement of those trials, or a resume trains them);
- no sweep run that finished its grid (its summary, ``studies/done``, is logged only then) is FAILED or
  KILLED (a stalled sweep woken after another process finished it used to overwrite its end); ``--repair``
  marks it FINISHED again;
- when the experiment's study index says it is complete, every study run is in it (study_index.py).

It reads what can break, not every run (registry.doctor_read), so that its cost follows the studies and
the runs made since its last check, not the trial runs: the study runs (from the study index) and their
sweep runs, the RUNNING runs, the trial runs of the study families where two study runs may have finished
a trial (or where a study run ended without finishing), and the runs of ours without their kind or key:
the first check of an experiment finds those by searches on tags, which scan the store once each; later
checks read the runs that started or ended since the previous one, and the runs of the problems it found
(the experiment's tags edps.doctor.*). An experiment whose study index is not complete (runs made before
it) is said in one line; ``--repair`` completes it.

In an experiment that edps-mlflow created (made_by_edps), the first check does not search for runs without
their kind or keys: every run of ours is created with them in one request, so only a run made by hand
could lack them, and those searches are most of a first check's cost on a large store. Its summary line
says so; ``--full`` and ``--repair`` search anyway (and read as a first check does).

Reads go through registry.py, the writes (``--repair``, and what the next check need not read) through
ownership.py and store.py.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import TextIO

from edps_mlflow import registry
from edps_mlflow.names import (
    EXPERIMENT_TAG_CHECKED_UNTIL,
    EXPERIMENT_TAG_CREATED_BY,
    EXPERIMENT_TAG_RECHECK,
    EXPERIMENT_TAG_SEARCHED_KEYLESS,
    KIND_ANALYSIS,
    KIND_STUDY,
    KIND_STUDY_INDEX,
    KIND_SWEEP,
    KIND_TRIAL,
)
from edps_mlflow.ownership import expired_reason, lease_seconds, mark_dead, set_status
from edps_mlflow.results import RunState
from edps_mlflow.store import StoreClient, complete_index, open_store, record_doctor_check, store_errors

# The runs of problems a check remembers for the next (an experiment tag holds their ids); with more, the next
# check reads every run again.
MAX_RECHECK = 500


def expired(facts: list[registry.RunFacts], lease: float, now: float) -> list[registry.RunFacts]:
    """RUNNING runs whose owner is gone (the same rule as registry.expired_runs)."""
    live = {f.run_id for f in facts if f.kind in (KIND_STUDY, KIND_SWEEP) and f.state is RunState.RUNNING
            and now - f.renewed < lease}
    return [f for f in facts if f.state is RunState.RUNNING and f.ours and f.run_id not in live
            and (f.kind in (KIND_STUDY, KIND_SWEEP) or (f.kind == KIND_TRIAL and f.parent_run_id not in live))]


def _missing_key(fact: registry.RunFacts) -> str | None:
    needed = {KIND_STUDY: (fact.study_key,), KIND_TRIAL: (fact.trial_key, fact.study_key),
              KIND_SWEEP: (fact.sweep_key,), KIND_ANALYSIS: (), KIND_STUDY_INDEX: ()}
    if fact.kind is None:
        # A run that gave way (the launcher's run has its kind removed) is accounted for.
        return None if fact.gave_way else "has edps tags but no edps.kind"
    if fact.kind not in needed:
        return f"has an unknown kind {fact.kind!r}"
    return None if all(needed[fact.kind]) else f"is a {fact.kind} run without its key"


def finished_after_lease_lost(facts: list[registry.RunFacts]) -> list[registry.RunFacts]:
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


def finished_sweeps_marked_failed(facts: list[registry.RunFacts]) -> list[registry.RunFacts]:
    """Sweep runs that logged their end-of-grid summary but are FAILED or KILLED."""
    return [f for f in facts if f.kind == KIND_SWEEP and f.summarised and f.state in (RunState.FAILED, RunState.KILLED)]


def unindexed(facts: list[registry.RunFacts]) -> list[registry.RunFacts]:
    """Study runs that have ended but have no entry in the study index."""
    return [f for f in facts if f.kind == KIND_STUDY and f.state is not RunState.RUNNING and not f.indexed]


def problems(facts: list[registry.RunFacts], lease: float, now: float) -> list[tuple[str, str]]:
    """(run id or key, what is wrong) for every broken invariant."""
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
    without their kind or keys even in an experiment made by edps-mlflow (made_by_edps)."""
    client: StoreClient = open_store(tracking_uri)
    lease = lease_seconds()
    left = 0
    with store_errors(client):
        for experiment_id, name in registry.experiments(client, experiment):
            tags = client.get_experiment(experiment_id).tags
            checked = tags.get(EXPERIMENT_TAG_CHECKED_UNTIL, "")
            checked_until = int(checked) if checked.isdigit() and not repair and not full else None
            recheck = [run_id for run_id in tags.get(EXPERIMENT_TAG_RECHECK, "").split(",") if run_id]
            search_malformed = full or repair or not made_by_edps(tags)
            # A later check reads every run made since the previous one: it has checked every run when the
            # checks before it had (only an experiment made by edps-mlflow is ever checked without searching).
            every_run = search_malformed or (
                checked_until is not None and tags.get(EXPERIMENT_TAG_SEARCHED_KEYLESS) == "true")
            read = registry.doctor_read(client, experiment_id, checked_until, recheck, search_malformed)
            facts = read.facts
            complete = registry.index_is_complete(client, experiment_id)
            now = time.time()
            if repair:
                dead = expired(facts, lease, now)
                mark_dead(client, [f.run_id for f in dead], expired_reason(lease))
                for fact in dead:
                    print(f"{name}: repaired: {fact.kind} run {fact.run_id} marked FAILED (owner gone)", file=out)
                late = finished_after_lease_lost(facts)
                mark_dead(client, [f.run_id for f in late], "finished after its lease was lost: not a measurement "
                                                            "this store trusts (marked FAILED by edps doctor --repair)")
                for fact in late:
                    print(f"{name}: repaired: trial run {fact.run_id} marked FAILED (finished after its lease was "
                          f"lost)", file=out)
                for fact in finished_sweeps_marked_failed(facts):
                    set_status(client, fact.run_id, RunState.FINISHED)
                    print(f"{name}: repaired: sweep run {fact.run_id} marked FINISHED (it had finished its grid)",
                          file=out)
                missing = registry.unindexed_study_runs(client, experiment_id)
                if missing or not complete:
                    indexed = complete_index(client, experiment_id, missing)
                    print(f"{name}: repaired: {indexed} study runs added to the study index"
                          + ("; it is complete" if indexed == len(missing) else ""), file=out)
                    complete = registry.index_is_complete(client, experiment_id)
                read = registry.doctor_read(client, experiment_id, None, search_malformed=search_malformed)
                facts = read.facts
            found = problems(facts, lease, time.time())
            if complete:
                found += [(f.run_id, "study run is not in the study index, which says it is complete (written by "
                                     "an older version?): `edps doctor --repair` adds it") for f in unindexed(facts)]
            for subject, text in found:
                print(f"{name}: {subject}: {text}", file=out)
                left += 1
            if not complete:
                print(f"{name}: the study index is not complete (study runs made before it): commands also search "
                      f"the study runs, more slowly; `edps doctor --repair` completes it", file=out)
            involved = sorted({run_id for subject, text in found for run_id in _run_ids(subject, text, facts)})
            record_doctor_check(client, experiment_id, read.checked_until if len(involved) <= MAX_RECHECK else None,
                                involved[:MAX_RECHECK], every_run)
            if every_run:
                print(f"{name}: {len(facts)} runs read, all runs checked", file=out)
            else:
                print(f"{name}: {len(facts)} runs read, all runs checked but for runs without their kind or keys, "
                      f"which edps-mlflow, that made this experiment, never writes (--full searches for them)",
                      file=out)
    return left


def made_by_edps(experiment_tags: dict[str, str]) -> bool:
    """Whether edps-mlflow created the experiment (the tag it sets in the request that creates it). Every run
    of ours in such an experiment was created with its kind, its keys and its parent in that one request
    (a run ``mlflow run`` made gets them in one batch before anything else), so a first check need not
    search its trial runs for runs without them: only a run made by hand could be one."""
    return bool(experiment_tags.get(EXPERIMENT_TAG_CREATED_BY))


def _run_ids(subject: str, text: str, facts: list[registry.RunFacts]) -> list[str]:
    """The runs a problem line names (its subject, or the runs listed after a key)."""
    known = {f.run_id for f in facts}
    return [word.strip(",") for word in [subject, *text.split()] if word.strip(",") in known]
