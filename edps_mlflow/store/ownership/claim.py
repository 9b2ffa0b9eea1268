"""Who owns the run of a study or sweep key: the claim, the runs of dead owners, ``mlflow run``'s run for us.

    claimed = claim(client, experiment_id, rules, create, out)      # done? live elsewhere? else ours
    with abort_guard(claimed.owned, open_runs):                       # nothing of ours left RUNNING (lease.py)
        ...
        claimed.owned.require()                                       # still ours? before every write that matters
        claimed.owned.finish()

A run whose owner is gone is marked FAILED and its work taken over (a study's by a new run that reuses its
finished trials; a sweep's by the same run under a new owner token); a live run of a key is never duplicated
(docs/reliability.md). MLflow has no transaction across processes, so claiming is "create mine, then look
again": of two live runs of one key the earlier (start time, then run id) wins and the later one gives way.
"""

from __future__ import annotations

import time
import uuid
from contextlib import suppress
from dataclasses import dataclass
from enum import Enum
from typing import Callable, NamedTuple, TextIO

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from edps_mlflow import names as n
from edps_mlflow.errors import EdpsError
from edps_mlflow.process_settings import launcher_run_id
from edps_mlflow.results import RunState
from edps_mlflow.store.client import StoreClient, log_batch
from edps_mlflow.store.experiment import index_study_run
from edps_mlflow.store.ownership.lease import (LEASE_VARIABLE, OwnedRun, abort_guard, expired_reason, heartbeat_tags,
                                              lease_seconds)
from edps_mlflow.store.read.fence import next_epoch
from edps_mlflow.store.read.runs import LeasedRun, expired_runs, get_leased, keyed_runs
from edps_mlflow.store.trouble import describe_store_error

# Between a new run's two looks for an earlier run of its key: longer than a process is descheduled between
# taking its start time and writing its run, on a loaded machine.
_SETTLE_SECONDS = 1.0
_RUNNING = RunState.RUNNING.value


class OnLive(str, Enum):
    """What a claim does when a live run of its key belongs to another process."""

    REFUSE = "refuse"  # one line: not starting a duplicate (pass --wait)
    WAIT = "wait"  # wait until it ends, then look again
    WATCH = "watch"  # return it: the caller (an executor) watches it in one of its places


@dataclass(frozen=True)
class ClaimRules:
    """How one kind of run is claimed; the variants of studies, sweeps and executors are these fields."""

    kind: str
    key: str
    label: str
    on_live: OnLive
    finished: Callable[[], LeasedRun | None] | None = None  # the finished run that makes the claim unnecessary
    clear_expired: bool = False  # mark the key's runs of dead owners FAILED first (studies redo their work)
    resume: bool = False  # continue the earliest run of the key under a new owner token (sweeps keep their run)
    # A run made for this key on our behalf (a study run a sweep submitted): never a rival; it must still be
    # RUNNING once we start, and it gives up its kind when the study is done already.
    own_run_id: str | None = None
    tokens: bool = False  # the runs carry an owner token (those that can be resumed)
    indexed: bool = False  # study runs: in the study index from their first moment (RUNNING until they end)


@dataclass(frozen=True)
class Claim:
    """What :func:`claim` found: our run (``owned``), the finished run that makes it unnecessary (``done``),
    or, with ``OnLive.WATCH``, the live run of another process (``busy``). Exactly one is set."""

    owned: OwnedRun | None = None
    done: LeasedRun | None = None
    busy: LeasedRun | None = None


def claim(client: StoreClient, experiment_id: str, rules: ClaimRules, create: Callable[[str | None, int], str],
          out: TextIO, give_way: Callable[[str, LeasedRun], None] | None = None) -> Claim:
    """The run of ``rules.key``, live and ours; or the reason there is none to own. ``create(token, epoch)`` makes
    our run (with its kind, key, heartbeat, owner token and epoch: one more than any run of the key had, fence.py)
    and returns its id; ``give_way(run_id, rival)`` gives it up when an earlier live run of the key appeared at
    the same moment (default: FAILED, tagged)."""
    lease = lease_seconds()
    own = rules.own_run_id
    while True:
        done = rules.finished() if rules.finished else None
        if done is not None:
            if own is not None:
                yield_run(client, own, done.run_id, keep_kind=False)
            return Claim(done=done)
        if rules.clear_expired:
            cleared = clear_expired(client, experiment_id, lease, rules.key)
            if cleared:
                print(f"marked {cleared} runs of {rules.label} left RUNNING by a dead process as FAILED", file=out)
        runs = keyed_runs(client, experiment_id, rules.kind, rules.key)
        live = [r for r in live_runs(runs, lease) if r.run_id != own]
        if live:
            rival = live[0]
        elif rules.resume and runs:
            # Finished since we looked (this process stalled in between, and another completed the work): done,
            # never taken over and ended again. Looked again after reading the run, for what it read before.
            done = rules.finished() if rules.finished and runs[0].state is RunState.FINISHED else None
            if done is not None:
                return Claim(done=done)
            token = _take_over(client, runs[0].run_id)
            if token is None:
                continue  # taken over by another process this very moment: it is live now
            return Claim(owned=OwnedRun(client, runs[0].run_id, token, rules.label))
        else:
            token, epoch = uuid.uuid4().hex if rules.tokens else None, next_epoch(runs)
            run_id = create(token, epoch)
            owned = OwnedRun(client, run_id, token, rules.label, epoch)
            with abort_guard(owned):  # our new run exists: a store failing from here on marks or names it
                if rules.indexed:
                    index_study_run(client, run_id)
                if own is not None:
                    _require_running(client, own)
                rival = earlier_live_rival(client, experiment_id, rules.kind, rules.key, run_id, lease)
                if rival is None:
                    # A rival that took an earlier start time but was descheduled before its run reached the store
                    # (a loaded machine) is not visible yet, and finds ours later than its own: both would train.
                    # Look once more after such a delay; the later of the two then gives way, whoever looks.
                    time.sleep(_SETTLE_SECONDS)
                    rival = earlier_live_rival(client, experiment_id, rules.kind, rules.key, run_id, lease)
                if rival is None:
                    return Claim(owned=owned)
                (give_way or (lambda mine, winner: yield_run(client, mine, winner.run_id)))(run_id, rival)
            own = None
        if rules.on_live is OnLive.WATCH:
            return Claim(busy=rival)
        if rules.on_live is OnLive.REFUSE:
            raise EdpsError(f"{rules.label} is being run by the live run {rival.run_id} (heartbeat "
                            f"{time.time() - rival.renewed:.0f} s ago, lease {lease:g} s); not starting a duplicate: "
                            "pass --wait to wait for it")
        wait_for(client, rival.run_id, lease, out, rules.label)


def _require_running(client: StoreClient, run_id: str) -> None:
    """A run submitted for us may have been given up as expired before we began (its sweep died)."""
    status = client.get_run(run_id).info.status
    if status != _RUNNING:
        raise EdpsError(f"run {run_id} lost its lease (marked {status} by another process before this one "
                        f"started); its work was taken over: raise {LEASE_VARIABLE} on loaded machines")


def live_runs(runs: list[LeasedRun], lease: float) -> list[LeasedRun]:
    now = time.time()
    return [r for r in runs if r.live(lease, now)]


def earlier_live_rival(client: StoreClient, experiment_id: str, kind: str, key: str, mine: str,
                       lease: float) -> LeasedRun | None:
    """After creating run ``mine``: a live run of the same key that came first, if any (we give way)."""
    runs = keyed_runs(client, experiment_id, kind, key)
    own = next((r for r in runs if r.run_id == mine), None)
    if own is None:
        return None
    rivals = [r for r in live_runs(runs, lease) if r.run_id != mine and r.order < own.order]
    return rivals[0] if rivals else None


def wait_for(client: StoreClient, run_id: str, lease: float, out: TextIO, label: str) -> LeasedRun:
    """Wait until run ``run_id`` ended, or its lease ran out (then it is marked FAILED here, and the caller takes
    the work over); the run as it was last seen."""
    print(f"waiting for the live run {run_id} of {label}", file=out, flush=True)
    poll = max(0.5, min(5.0, lease / 4))
    while True:
        run = get_leased(client, run_id)
        if run.state is not RunState.RUNNING:
            return run
        if not run.live(lease):
            reason = expired_reason(lease, run.owner)
            mark_dead(client, [run_id], reason)
            print(f"run {run_id} of {label} is left by a dead owner ({reason}): taking over", file=out, flush=True)
            return get_leased(client, run_id)
        time.sleep(poll)


def _take_over(client: StoreClient, run_id: str) -> str | None:
    """Continue a run whose owner is gone under a new owner token; None when another process took it over at the
    same moment (the last token written wins)."""
    token = uuid.uuid4().hex
    client.update_run(run_id, status=_RUNNING)
    log_batch(client, run_id, tags={**heartbeat_tags(), n.TAG_LEASE_OWNER: token})
    # A rival that read the run as free before our write writes its token after ours: wait longer than
    # such a read-then-write takes, then see whose token stayed.
    time.sleep(min(3.0, lease_seconds() / 4))
    return token if client.get_run(run_id).data.tags.get(n.TAG_LEASE_OWNER) == token else None


# ---- runs of dead owners, and runs that give way ------------------------------------------------------
def mark_dead(client: StoreClient, run_ids: list[str], reason: str) -> None:
    """Mark runs whose owner is gone FAILED, saying why (several processes may do this at once)."""
    for run_id in run_ids:
        log_batch(client, run_id, tags={n.TAG_ERROR: reason})
        client.set_terminated(run_id, RunState.FAILED.value)
        index_study_run(client, run_id)  # a study run's entry may say RUNNING, or be missing


def clear_expired(client: StoreClient, experiment_id: str, lease: float, key: str | None = None) -> int:
    """Mark FAILED the runs left RUNNING by dead processes (only those of ``key`` when given)."""
    expired = [r for r in expired_runs(client, experiment_id, lease) if key is None or r.key == key]
    for run in expired:
        mark_dead(client, [run.run_id], expired_reason(lease, run.owner))
    return len(expired)


def yield_run(client: StoreClient, run_id: str, winner_run_id: str, keep_kind: bool = True) -> None:
    """Give up our run because ``winner_run_id`` (live, same key, earlier) trains it: FAILED, tagged. A run made
    for us (``keep_kind=False``) loses its kind: MLflow marks it FINISHED when we exit 0, and it must not count."""
    log_batch(client, run_id, tags={n.TAG_YIELDED_TO: winner_run_id,
                                    n.TAG_ERROR: f"gave way to the earlier live run {winner_run_id} of the same key"})
    study = client.get_run(run_id).data.tags.get(n.TAG_KIND) == n.KIND_STUDY
    if not keep_kind:
        client.delete_tag(run_id, n.TAG_KIND)
    client.set_terminated(run_id, RunState.FAILED.value)
    if study:
        index_study_run(client, run_id, was_study=True)


# ---- the run that `mlflow run` made for us --------------------------------------------------------------
class LauncherRun(NamedTuple):
    run_id: str
    experiment_name: str
    submitted: bool  # a sweep submitted it and tagged it as this study's run already (a queued-job executor)


def claim_launched(client: StoreClient, experiment_id: str, rules: ClaimRules,
                   create: Callable[[str | None, int, str | None], str], out: TextIO,
                   launcher: LauncherRun | None) -> Claim:
    """:func:`claim`, whose first ``create(token, epoch, launcher_run_id)`` makes our run in the run that ``mlflow
    run`` made for us (``launcher``), which loses its kind if it gives way (yield_run)."""
    unused = [launcher.run_id] if launcher is not None else []

    def give_way(run_id: str, rival: LeasedRun) -> None:
        yield_run(client, run_id, rival.run_id, keep_kind=launcher is None or run_id != launcher.run_id)

    return claim(client, experiment_id, rules,
                 lambda token, epoch: create(token, epoch, unused.pop() if unused else None), out, give_way)


def launcher_run(client: StoreClient, study_key: str | None = None) -> LauncherRun | None:
    """The run that ``mlflow run`` made for this process (``MLFLOW_RUN_ID``), if any: honoured only while it is
    RUNNING and empty, or the run a sweep submitted for this very study (``study_key``); any other is one line."""
    run_id = launcher_run_id()
    if not run_id:
        return None
    try:
        run = client.get_run(run_id)
    except MlflowException as error:
        raise EdpsError(f"MLFLOW_RUN_ID={run_id}: {describe_store_error(str(client.tracking_uri), error)}") from None
    tags = run.data.tags
    kind = tags.get(n.TAG_KIND)
    running = run.info.status == _RUNNING
    submitted = bool(kind == n.KIND_STUDY and tags.get(n.TAG_SUBMITTED_BY) and study_key)
    if submitted and running and tags.get(n.TAG_STUDY_KEY) != study_key:
        raise EdpsError(f"MLFLOW_RUN_ID={run_id} was submitted for study {tags.get(n.TAG_STUDY_KEY, '')[:12]}, but "
                        f"these parameters and data make study {study_key[:12]}: the sweep and this process see "
                        f"different data or code")
    if not running or (kind and not submitted):
        what = f"a {kind} run" if kind else "not a new run"
        raise EdpsError(f"MLFLOW_RUN_ID={run_id} is {run.info.status} and {what}: only the empty RUNNING run that "
                        f"`mlflow run` creates is used; unset MLFLOW_RUN_ID to start a new run")
    return LauncherRun(run_id, client.get_experiment(run.info.experiment_id).name, submitted)


def mark_refused(run_id: str, message: str) -> None:
    """Why a command was refused, on the run that ``mlflow run`` made before we started (which MLflow marks FAILED
    when we exit non-zero; deleting it would crash ``mlflow run``)."""
    with suppress(MlflowException):
        client = MlflowClient()
        run = client.get_run(run_id)
        # Only the launcher's own new run: a finished study named by mistake keeps its tags.
        if run.info.status == _RUNNING and n.TAG_KIND not in run.data.tags:
            client.set_tag(run_id, n.TAG_ERROR, message[:5000])
