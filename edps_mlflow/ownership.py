"""Who owns the run of a study or sweep, and when its owner may write: the one place for leases.

    claimed = claim(client, experiment_id, rules, create, out)      # done? live elsewhere? else ours
    with abort_guard(claimed.owned, open_runs):                       # nothing of ours left RUNNING
        ...
        claimed.owned.require()                                       # still ours? before every write that matters
        claimed.owned.finish()

A running study or sweep renews a heartbeat on its run. A RUNNING run whose heartbeat is older than the
lease (``EDPS_LEASE_SECONDS``) belongs to a dead process: it is marked FAILED and its work taken over (a
study's by a new study run that reuses its finished trials; a sweep's by the same sweep run, resumed
under a new owner token). A live run of the same key is never duplicated: the newcomer stops with one
line, waits until that run ends, or (an executor) watches it in one of its places.

MLflow has no transaction across processes, so claiming is "create mine, then look again": of two live
runs of one key the earlier (start time, then run id) wins and the later one gives way.

A process can also be stalled past its lease and wake up (a laptop asleep, a suspended VM, SIGSTOP, swap):
by then another process may own its work. So an owner proves that its run is still its own (RUNNING, and
with its owner token where it has one) before every write that matters (a trial's end, a study's
outcome and end, a sweep's end, an abort), and stops writing when it is not (:class:`LeaseLost`). Its
heartbeat thread makes the same check at every beat, so a woken process notices at once. A check and the
write after it are two requests: a stall of the few milliseconds between them is not covered.

Reads go through registry.py; every write here goes through the store client.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Iterator, NamedTuple, TextIO

from mlflow.entities import RunStatus
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from edps_mlflow import names as n
from edps_mlflow import registry
from edps_mlflow.config import StudySpec
from edps_mlflow.descriptions import provenance_tags, study_run_name, study_tags
from edps_mlflow.errors import EdpsError
from edps_mlflow.process_settings import launcher_run_id
from edps_mlflow.registry import LeasedRun
from edps_mlflow.results import RunState
from edps_mlflow.store import StoreClient, describe_store_error, index_study_run, log_batch

LEASE_VARIABLE = "EDPS_LEASE_SECONDS"
DEFAULT_LEASE_SECONDS = 120.0
_HEARTBEAT_EVERY = 20.0  # seconds between renewals at most; a sixth of the lease when that is shorter
# Seconds between a new run's two looks for an earlier run of its key (claim): longer than a process is
# descheduled between taking its start time and writing its run, on a loaded machine.
_SETTLE_SECONDS = 1.0
_RUNNING = RunStatus.to_string(RunStatus.RUNNING)


# ---- the lease -------------------------------------------------------------------------------------
def lease_seconds() -> float:
    """How long a run stays live after its last heartbeat (``EDPS_LEASE_SECONDS``, default 120)."""
    text = os.environ.get(LEASE_VARIABLE, "").strip()
    if not text:
        return DEFAULT_LEASE_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value == value and 1.0 <= value <= 86_400.0):
        raise EdpsError(f"{LEASE_VARIABLE} must be a number of seconds between 1 and 86400, got {text!r}")
    return value


def heartbeat_tags() -> dict[str, str]:
    return {n.TAG_HEARTBEAT: f"{time.time():.3f}"}


def expired_reason(lease: float) -> str:
    return f"no heartbeat for more than the lease of {lease:g} s: its process is gone"


class LeaseLost(EdpsError):
    """This process no longer owns its run: it was stalled past its lease and another process took the
    work over. Nothing more is written; the other process's results stand. Exit code 3, so that a script
    or scheduler can tell it from bad input (2)."""

    exit_code = 3


# ---- an owned run ----------------------------------------------------------------------------------
class OwnedRun:
    """A study or sweep run this process owns: its heartbeat, and the check before each write that matters.

    ``token`` is the owner token written on the run (``edps.lease_owner``) by runs that can be taken over
    as they are (sweep runs); None for runs that are only ever marked FAILED when their owner is gone
    (study runs), for which RUNNING alone says they are still ours.
    """

    def __init__(self, client: StoreClient, run_id: str, token: str | None, label: str) -> None:
        self.client, self.run_id, self.token, self.label = client, run_id, token, label
        self.lost = threading.Event()  # set by the heartbeat when it finds the run taken over
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- the heartbeat ---------------------------------------------------------------------------
    def start_heartbeat(self) -> None:
        """Renew the lease from a daemon thread with its own client, until stopped or lost. A failed renewal is
        tried again at the next beat: the lease is several beats long, so one blip does not lose the run."""
        every = min(_HEARTBEAT_EVERY, lease_seconds() / 6)
        client = MlflowClient(str(self.client.tracking_uri))

        def beat() -> None:
            while not self._stop.wait(every):
                try:
                    if self._why_not_ours(client.get_run(self.run_id)) is not None:
                        self.lost.set()  # woken after a stall: never renew a run that is not ours
                        return
                    client.set_tag(self.run_id, n.TAG_HEARTBEAT, heartbeat_tags()[n.TAG_HEARTBEAT])
                except Exception:  # noqa: BLE001 - the next beat tries again; the lease absorbs misses
                    pass

        self._thread = threading.Thread(target=beat, name=f"edps-heartbeat-{self.run_id[:8]}", daemon=True)
        self._thread.start()

    def stop_heartbeat(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout=min(_HEARTBEAT_EVERY, lease_seconds() / 6) + 30)

    # ---- the check -------------------------------------------------------------------------------
    def _why_not_ours(self, run) -> str | None:  # noqa: ANN001 - an mlflow Run
        if run.info.status != _RUNNING:
            return f"marked {run.info.status} by another process"
        if run.data.tags.get(n.TAG_LEASE_OWNER) != self.token:
            return "taken over by another process"
        return None

    def require(self) -> None:
        """Raise :class:`LeaseLost` unless the run is still ours (one read of the store)."""
        if self.lost.is_set():
            raise self._lost("taken over by another process")
        why = self._why_not_ours(self.client.get_run(self.run_id))
        if why is not None:
            self.lost.set()
            raise self._lost(why)

    def require_fresh(self) -> None:
        """Raise :class:`LeaseLost` when the heartbeat already found the run taken over (no store read)."""
        if self.lost.is_set():
            raise self._lost("taken over by another process")

    def still_ours(self) -> bool:
        try:
            self.require()
        except LeaseLost:
            return False
        return True

    def _lost(self, why: str) -> LeaseLost:
        return LeaseLost(f"{self.label}: run {self.run_id} lost its lease ({why} while this process was stalled "
                         f"longer than the lease of {lease_seconds():g} s); its work was taken over and this process "
                         f"wrote nothing more (raise {LEASE_VARIABLE} on machines that stall)")

    # ---- the end -------------------------------------------------------------------------------
    def finish(self) -> None:
        """FINISHED, if still ours (else :class:`LeaseLost`, and nothing written)."""
        self.stop_heartbeat()
        self.require()
        self.client.set_terminated(self.run_id, RunStatus.to_string(RunStatus.FINISHED))

    def abort(self, interrupted: bool, open_runs: list[str] | None = None) -> None:
        """KILLED (interrupted) or FAILED, with ``open_runs`` (its RUNNING trial runs), if still ours; a run
        another process took over keeps what that process wrote."""
        self.stop_heartbeat()
        # One try each, and none after a write that fails: a locked, full or read-only store would make
        # every run wait out the retries again, and the lease marks what is left.
        client = self.client.without_retries()
        try:
            if self.lost.is_set() or self._why_not_ours(client.get_run(self.run_id)) is not None:
                return
        except Exception:  # noqa: BLE001 - the store is failing: marking is best effort, the lease covers the rest
            pass
        status = RunStatus.to_string(RunStatus.KILLED if interrupted else RunStatus.FAILED)
        for run_id in [*(open_runs or []), self.run_id]:
            try:
                client.set_terminated(run_id, status)
            except Exception:  # noqa: BLE001 - as above: aborting must not hide the error that caused it
                return
        try:
            # A study run's entry in the study index says RUNNING until this (a sweep run has none).
            index_study_run(client, self.run_id)
        except Exception:  # noqa: BLE001 - best effort: an entry that says RUNNING is read from the store
            pass


@contextmanager
def abort_guard(owned: OwnedRun, open_runs: Callable[[], list[str]] = list,
                cleanup: Callable[[], None] | None = None) -> Iterator[None]:
    """The one abort guard of studies and sweeps: when the block fails, nothing of ours is left RUNNING
    (``owned`` and its ``open_runs()`` KILLED on an interrupt, FAILED on an error), unless the run is no
    longer ours (:class:`LeaseLost`, or found so now), in which case nothing is written. ``cleanup()`` runs
    after either (local files, monitors)."""
    try:
        yield
    except LeaseLost:
        owned.stop_heartbeat()
        if cleanup:
            cleanup()
        raise
    except BaseException as error:
        owned.abort(isinstance(error, KeyboardInterrupt), open_runs())
        if cleanup:
            cleanup()
        raise


# ---- runs of dead owners ----------------------------------------------------------------------------
def mark_dead(client: StoreClient, run_ids: list[str], reason: str) -> None:
    """Mark runs whose owner is gone FAILED, saying why (several processes may do this at once)."""
    for run_id in run_ids:
        log_batch(client, run_id, tags={n.TAG_ERROR: reason})
        client.set_terminated(run_id, RunStatus.to_string(RunStatus.FAILED))
        index_study_run(client, run_id)  # a study run's entry may say RUNNING, or be missing (study_index.py)


def set_status(client: StoreClient, run_id: str, state: RunState) -> None:
    """Set a run's status (``edps doctor --repair`` of a finished sweep run whose end was overwritten)."""
    client.update_run(run_id, status=state.value)


def clear_expired(client: StoreClient, experiment_id: str, lease: float, key: str | None = None) -> int:
    """Mark FAILED the runs left RUNNING by dead processes (only those of ``key`` when given)."""
    expired = [r for r in registry.expired_runs(client, experiment_id, lease) if key is None or r.key == key]
    mark_dead(client, [r.run_id for r in expired], expired_reason(lease))
    return len(expired)


def yield_run(client: StoreClient, run_id: str, winner_run_id: str, keep_kind: bool = True) -> None:
    """Give up our run because ``winner_run_id`` (live, same key, earlier) trains it: FAILED, tagged.

    ``keep_kind=False`` also removes the kind tag, for a run made for us (``mlflow run``'s, or one a sweep
    submitted): MLflow marks it FINISHED when its process exits 0, and it must not then count as a study.
    """
    log_batch(client, run_id, tags={n.TAG_YIELDED_TO: winner_run_id,
                                    n.TAG_ERROR: f"gave way to the earlier live run {winner_run_id} of the same key"})
    study = client.get_run(run_id).data.tags.get(n.TAG_KIND) == n.KIND_STUDY
    if not keep_kind:
        client.delete_tag(run_id, n.TAG_KIND)
    client.set_terminated(run_id, RunStatus.to_string(RunStatus.FAILED))
    if study:
        index_study_run(client, run_id, was_study=True)


def live_runs(runs: list[LeasedRun], lease: float) -> list[LeasedRun]:
    now = time.time()
    return [r for r in runs if r.live(lease, now)]


def earlier_live_rival(client: StoreClient, experiment_id: str, kind: str, key: str, mine: str,
                       lease: float) -> LeasedRun | None:
    """After creating run ``mine``: a live run of the same key that came first, if any (we give way)."""
    runs = registry.keyed_runs(client, experiment_id, kind, key)
    own = next((r for r in runs if r.run_id == mine), None)
    if own is None:
        return None
    rivals = [r for r in live_runs(runs, lease) if r.run_id != mine and r.order < own.order]
    return rivals[0] if rivals else None


def describe_live(label: str, run: LeasedRun, lease: float) -> str:
    return (f"{label} is being run by the live run {run.run_id} (heartbeat {time.time() - run.renewed:.0f} s ago, "
            f"lease {lease:g} s); not starting a duplicate: pass --wait to wait for it")


def wait_for(client: StoreClient, run_id: str, lease: float, out: TextIO, label: str) -> LeasedRun:
    """Wait until run ``run_id`` is no longer live: it ended, or its lease ran out (then it is marked
    FAILED here, and the caller takes the work over). Returns the run as it was last seen."""
    print(f"waiting for the live run {run_id} of {label}", file=out, flush=True)
    poll = max(0.5, min(5.0, lease / 4))
    while True:
        run = registry.get_leased(client, run_id)
        if run.state is not RunState.RUNNING:
            return run
        if not run.live(lease):
            mark_dead(client, [run_id], expired_reason(lease))
            print(f"run {run_id} of {label} stopped renewing its lease: taking over", file=out, flush=True)
            return registry.get_leased(client, run_id)
        time.sleep(poll)


def _take_over(client: StoreClient, run_id: str) -> str | None:
    """Continue a run whose owner is gone, under a new owner token; None when another process took it over
    at the same moment (the last owner token written wins)."""
    token = uuid.uuid4().hex
    client.update_run(run_id, status=_RUNNING)
    log_batch(client, run_id, tags={**heartbeat_tags(), n.TAG_LEASE_OWNER: token})
    # A rival that read the run as free before our write writes its token after ours: wait longer than
    # such a read-then-write takes, then see whose token stayed.
    time.sleep(min(3.0, lease_seconds() / 4))
    return token if client.get_run(run_id).data.tags.get(n.TAG_LEASE_OWNER) == token else None


# ---- the one claim ----------------------------------------------------------------------------------
class OnLive(str, Enum):
    """What a claim does when a live run of its key belongs to another process."""

    REFUSE = "refuse"  # one line: not starting a duplicate (pass --wait)
    WAIT = "wait"  # wait until it ends, then look again
    WATCH = "watch"  # return it: the caller (an executor) watches it in one of its places


@dataclass(frozen=True)
class ClaimRules:
    """How one kind of run is claimed; the variants of studies, sweeps and executors are these fields.

    - ``finished``: a finished run that makes the claim unnecessary (a study done already); None: no such run.
    - ``clear_expired``: mark the key's runs of dead owners FAILED first (studies: their work is redone in a
      new run that reuses what they finished).
    - ``resume``: continue the earliest run of the key when no live one exists, under a new owner token
      (sweeps: a resumed sweep keeps its run).
    - ``own_run_id``: a run made for this key on our behalf (a study run a sweep submitted): never a rival;
      it must still be RUNNING once we start, and it gives up its kind when the study is done already.
    - ``tokens``: the runs carry an owner token (those that can be resumed).
    """

    kind: str
    key: str
    label: str
    on_live: OnLive
    finished: Callable[[], LeasedRun | None] | None = None
    clear_expired: bool = False
    resume: bool = False
    own_run_id: str | None = None
    tokens: bool = False


@dataclass(frozen=True)
class Claim:
    """What :func:`claim` found: our run (``owned``), the finished run that makes it unnecessary (``done``),
    or, with ``OnLive.WATCH``, the live run of another process (``busy``). Exactly one is set."""

    owned: OwnedRun | None = None
    done: LeasedRun | None = None
    busy: LeasedRun | None = None
    created: bool = False  # ``owned`` is a run made by this claim (not a resumed one)


def claim(client: StoreClient, experiment_id: str, rules: ClaimRules, create: Callable[[str | None], str],
          out: TextIO, give_way: Callable[[str, LeasedRun], None] | None = None) -> Claim:
    """The run of ``rules.key``, live and ours; or the reason there is none to own.

    ``create(token)`` makes our run (with its kind, key, heartbeat and, when ``rules.tokens``, the owner
    token) and returns its id; ``give_way(run_id, rival)`` gives that run up when an earlier live run of the
    key appeared at the same moment (default: FAILED, tagged). Never a second live run of one key.
    """
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
        runs = registry.keyed_runs(client, experiment_id, rules.kind, rules.key)
        live = [r for r in live_runs(runs, lease) if r.run_id != own]
        if live:
            rival = live[0]
        elif rules.resume and runs:
            token = _take_over(client, runs[0].run_id)
            if token is None:
                continue  # taken over by another process this very moment: it is live now
            return Claim(owned=OwnedRun(client, runs[0].run_id, token, rules.label))
        else:
            token = uuid.uuid4().hex if rules.tokens else None
            run_id = create(token)
            if own is not None and client.get_run(own).info.status != _RUNNING:
                # A run submitted for us whose sweep died before this process began may have been given up
                # as expired in the meantime (by this process a moment ago, or by a resumed sweep).
                raise EdpsError(f"run {own} lost its lease (marked {client.get_run(own).info.status} by another "
                                f"process before this one started); its work was taken over: raise "
                                f"{LEASE_VARIABLE} on loaded machines")
            rival = earlier_live_rival(client, experiment_id, rules.kind, rules.key, run_id, lease)
            if rival is None:
                # A rival that took its start time before ours but was descheduled before its run reached the
                # store (a loaded machine: seen with three sweeps on one core) is not visible yet, and on its
                # own check it finds ours later than its own and keeps its run: both would train. Look once
                # more after such a delay; the later of the two then gives way, whoever looks.
                time.sleep(_SETTLE_SECONDS)
                rival = earlier_live_rival(client, experiment_id, rules.kind, rules.key, run_id, lease)
            if rival is None:
                return Claim(owned=OwnedRun(client, run_id, token, rules.label), created=True)
            (give_way or (lambda mine, winner: yield_run(client, mine, winner.run_id)))(run_id, rival)
            own = None
        if rules.on_live is OnLive.WATCH:
            return Claim(busy=rival)
        if rules.on_live is OnLive.REFUSE:
            raise EdpsError(describe_live(rules.label, rival, lease))
        wait_for(client, rival.run_id, lease, out, rules.label)


# ---- runs made for us ------------------------------------------------------------------------------
class LauncherRun(NamedTuple):
    """The run that ``mlflow run`` (or a sweep's submission) made for this process (``MLFLOW_RUN_ID``)."""

    run_id: str
    experiment_name: str
    submitted: bool  # a sweep submitted it and tagged it as this study's run already (a queued-job executor)


def launcher_run(client: StoreClient, study_key: str | None = None) -> LauncherRun | None:
    """The run that ``mlflow run`` made for this process (``MLFLOW_RUN_ID``), if any: our runs go to
    that run's experiment.

    Honoured only while it is RUNNING and still empty (no kind of ours), or, for a study
    (``study_key``), while it is the run a sweep submitted for that very study: any other run (a
    finished study, another study's run) is never reopened; that is one line to the user.
    """
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


def _submitted_tags(spec: StudySpec, sweep_run_id: str, sweep_key: str) -> dict[str, str]:
    return {**study_tags(spec), **heartbeat_tags(), n.MLFLOW_RUN_NAME: study_run_name(spec),
            n.MLFLOW_PARENT_RUN_ID: sweep_run_id, n.TAG_SWEEP_KEY: sweep_key, n.TAG_SUBMITTED_BY: sweep_run_id}


def claim_submitted_run(client: StoreClient, run_id: str, spec: StudySpec, sweep_run_id: str, sweep_key: str) -> None:
    """Make a run submitted for a sweep's study that study's run: its kind, keys, parent and a fresh
    heartbeat, before its entry point starts (seconds to minutes later), so that a resumed sweep or another
    process sees the study as taken from this moment on."""
    log_batch(client, run_id, tags=_submitted_tags(spec, sweep_run_id, sweep_key))
    index_study_run(client, run_id)  # RUNNING in the index from this moment (study_index.py)


def create_submitted_run(client: StoreClient, experiment_id: str, spec: StudySpec, sweep_run_id: str,
                         sweep_key: str) -> str:
    """A new run for a sweep's study that a job will adopt (``MLFLOW_RUN_ID``), made as ``mlflow run`` would
    make it and tagged as :func:`claim_submitted_run` tags one, in one request. Returns its id."""
    run_id = client.create_run(experiment_id, tags={**_submitted_tags(spec, sweep_run_id, sweep_key),
                                                    **provenance_tags()}).info.run_id
    index_study_run(client, run_id)  # RUNNING in the index from this moment (study_index.py)
    return run_id


def renew_heartbeat(client: StoreClient, run_id: str) -> None:
    """One heartbeat on a run (an executor keeps its submitted runs live until their entry point beats itself)."""
    client.set_tag(run_id, n.TAG_HEARTBEAT, heartbeat_tags()[n.TAG_HEARTBEAT])


def mark_refused(run_id: str, message: str) -> None:
    """Record why a command was refused on the run that ``mlflow run`` created before we started.

    MLflow creates that run before the entry point runs and marks it FAILED when we exit non-zero;
    deleting it would make ``mlflow run`` itself crash, so it stays, FAILED, with the reason as a tag.
    """
    try:
        client = MlflowClient()
        run = client.get_run(run_id)
        # Only the launcher's own new run: a finished study named by mistake keeps its tags.
        if run.info.status == _RUNNING and n.TAG_KIND not in run.data.tags:
            client.set_tag(run_id, n.TAG_ERROR, message[:5000])
    except MlflowException:
        pass
