"""The lease of a study or sweep run: the owner's heartbeat, and its check before each write that matters. A
RUNNING run whose heartbeat is older than the lease (``EDPS_LEASE_SECONDS``) belongs to a dead process; one
stalled past it (asleep, SIGSTOP, swap) may wake to find its work taken over, so an owner proves that its run is
its own before every write that matters and at every beat, and stops writing when not (:class:`LeaseLost`).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager, suppress
from typing import Any, Callable, Iterator

from mlflow.tracking import MlflowClient

from edps_mlflow import names as n
from edps_mlflow.errors import EdpsError
from edps_mlflow.process_settings import LEASE_VARIABLE, lease_seconds
from edps_mlflow.results import RunState
from edps_mlflow.store.client import StoreClient, log_batch
from edps_mlflow.store.experiment import index_study_run
from edps_mlflow.store.ownership.owner import exited_owner, owner_tag
from edps_mlflow.store.read.fence import end_tags
from edps_mlflow.store.trouble import StoreTrouble, store_error_line, store_trouble

_HEARTBEAT_EVERY = 20.0  # seconds between renewals at most; a sixth of the lease when that is shorter


def heartbeat_tags() -> dict[str, str]:
    """A fresh heartbeat, and this process as the owner (the run's creator or taker)."""
    owner = owner_tag()
    return {n.TAG_HEARTBEAT: f"{time.time():.3f}", **({n.TAG_OWNER_PROCESS: owner} if owner else {})}


def renew_heartbeat(client: StoreClient, run_id: str) -> None:
    """One heartbeat on a run (an executor keeps its submitted runs live until their entry point beats itself)."""
    client.set_tag(run_id, n.TAG_HEARTBEAT, heartbeat_tags()[n.TAG_HEARTBEAT])


def expired_reason(lease: float, owner: str | None = None) -> str:
    """Why a run's owner is taken for gone (``owner``: the run's edps.owner_process)."""
    exited = exited_owner(owner)
    if exited:
        return f"its owner, {exited}, exited"
    return f"no heartbeat for more than the lease of {lease:g} s: its process is gone"


class LeaseLost(EdpsError):
    """This process no longer owns its run: another process took its work over while it was stalled. Nothing
    more is written. Exit code 3, which a script can tell from bad input (2)."""

    exit_code = 3


class OwnedRun:
    """A study or sweep run this process owns. ``token``: the owner token on the run (``edps.lease_owner``) of a
    run that can be taken over as it is (a sweep's), which is ours while it holds our token; None for a study run,
    ours while RUNNING, whose ``epoch`` fences what it writes (read/fence.py)."""

    def __init__(self, client: StoreClient, run_id: str, token: str | None, label: str, epoch: int = 0) -> None:
        self.client, self.run_id, self.token, self.label, self.epoch = client, run_id, token, label, epoch
        self.lost = threading.Event()  # set by the heartbeat when it finds the run taken over
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start_heartbeat(self) -> None:
        """Renew the lease from a daemon thread with its own client, until stopped or lost."""
        every = min(_HEARTBEAT_EVERY, lease_seconds() / 6)
        client = MlflowClient(str(self.client.tracking_uri))

        def beat() -> None:
            while not self._stop.wait(every):
                with suppress(Exception):  # the next beat tries again; the lease absorbs misses
                    run = client.get_run(self.run_id)
                    if self._why_not_ours(run) is not None:
                        self.lost.set()  # woken after a stall: never renew a run that is not ours
                        return
                    if run.info.status != RunState.RUNNING.value and not self._stop.is_set():
                        # Still our token: a former owner, woken after we took over, ended it (fence.py).
                        client.update_run(self.run_id, RunState.RUNNING.value)
                    renew_heartbeat(client, self.run_id)

        self._thread = threading.Thread(target=beat, name=f"edps-heartbeat-{self.run_id[:8]}", daemon=True)
        self._thread.start()

    def stop_heartbeat(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout=min(_HEARTBEAT_EVERY, lease_seconds() / 6) + 30)

    def _why_not_ours(self, run: Any) -> str | None:
        if self.token is None and run.info.status != RunState.RUNNING.value:
            return f"marked {run.info.status} by another process"
        if run.data.tags.get(n.TAG_LEASE_OWNER) != self.token:
            return "taken over by another process"
        return None

    def require(self) -> None:
        """Raise :class:`LeaseLost` unless the run is still ours (one read of the store)."""
        self.require_fresh()
        why = self._why_not_ours(self.client.get_run(self.run_id))
        if why is not None:
            self.lost.set()
            raise self._lost(why)

    def require_fresh(self) -> None:
        """Raise :class:`LeaseLost` when the heartbeat already found the run taken over (no store read)."""
        if self.lost.is_set():
            raise self._lost("taken over by another process")

    def _lost(self, why: str) -> LeaseLost:
        return LeaseLost(f"{self.label}: run {self.run_id} lost its lease ({why} while this process was stalled, "
                         f"or waited for the store, longer than the lease of {lease_seconds():g} s); its work was "
                         f"taken over, and nothing it wrote since counts (raise {LEASE_VARIABLE} on machines that "
                         "stall)")

    def finish(self) -> None:
        """FINISHED, if still ours (else :class:`LeaseLost`, and nothing written)."""
        self.stop_heartbeat()
        self.require()
        self._end(self.client, RunState.FINISHED.value)

    def _end(self, client: StoreClient, status: str) -> None:
        """End the run; on a run with an owner token, record the end under it first: the end a reader trusts is
        its current owner's, whatever a former owner woken later writes (fence.py)."""
        end_time = int(time.time() * 1000)
        if self.token is not None:
            log_batch(client, self.run_id, tags=end_tags(self.token, status, end_time))
        client.set_terminated(self.run_id, status, end_time=end_time)

    def abort(self, interrupted: bool, open_runs: list[str] | None = None) -> list[str]:
        """KILLED (interrupted) or FAILED, with ``open_runs`` (its RUNNING trial runs); a run another process took
        over (or marked dead) keeps what that process wrote, and only the open runs are marked. Returns the runs
        the store refused to mark."""
        self.stop_heartbeat()
        # One try each: a locked or unreachable store would make every run wait out the retries again, so none
        # after a write that fails, unless the disk is full: a status is a tiny write, which may still fit.
        client = self.client.without_retries()
        ours = True
        with suppress(Exception):  # the store is failing: marking is best effort, the owner's exit covers the rest
            ours = not self.lost.is_set() and self._why_not_ours(client.get_run(self.run_id)) is None
        status = (RunState.KILLED if interrupted else RunState.FAILED).value
        # The trial runs this process opened are its own whoever holds the run now (a taker opens its own; an
        # interrupted sweep marks its study dead, maybe before a trial run created at that moment): mark them.
        runs, unmarked = [*(open_runs or []), *([self.run_id] if ours else [])], []
        for at, run_id in enumerate(runs):
            try:
                if run_id == self.run_id:
                    self._end(client, status)
                else:
                    client.set_terminated(run_id, status)
            except Exception as error:  # noqa: BLE001 - as above: aborting must not hide the error that caused it
                if store_trouble(error) is not StoreTrouble.FULL:
                    return [*unmarked, *runs[at:]]
                unmarked.append(run_id)
        if ours and self.run_id not in unmarked:
            with suppress(Exception):  # best effort: an entry that says RUNNING is read from the store
                # A study run's entry in the study index says RUNNING until this (a sweep run has none).
                index_study_run(client, self.run_id)
        return unmarked


_LEFT_RUNNING = "; could not mark "


def left_running(line: str, run_ids: list[str]) -> str:
    """``line`` ending with what an abort could not mark: ``run_ids``, and those that ``line`` names already (a
    sweep's, from its worker's study), in one clause."""
    line, _, named = line.partition(_LEFT_RUNNING)
    run_ids = [*(named.split("(", 1)[1].split(")", 1)[0].split(", ") if named else []), *run_ids]
    return (f"{line}{_LEFT_RUNNING}{len(run_ids)} runs FAILED either ({', '.join(run_ids)}): they stay RUNNING "
            f"until the next command takes them over, at once on this machine (their process has exited), "
            f"elsewhere after the lease of {lease_seconds():g} s")


@contextmanager
def abort_guard(owned: OwnedRun, open_runs: Callable[[], list[str]] = list,
                cleanup: Callable[[], None] | None = None) -> Iterator[None]:
    """The one abort guard of studies and sweeps: when the block fails, ``owned`` and its ``open_runs()`` are
    KILLED (an interrupt) or FAILED, unless the run is no longer ours (an error's line names those the store could
    not mark); ``cleanup()`` runs last in any case."""
    try:
        yield
    except LeaseLost:
        owned.stop_heartbeat()
        raise
    except BaseException as error:
        unmarked = owned.abort(isinstance(error, KeyboardInterrupt), open_runs())
        if unmarked and isinstance(error, Exception):  # the one line of a failing store says what it left RUNNING
            uri = str(owned.client.tracking_uri)
            line = str(error) if isinstance(error, EdpsError) else store_error_line(error, uri)
            if line is not None:
                raise EdpsError(left_running(line, unmarked)) from None
        raise
    finally:
        if cleanup:
            cleanup()
