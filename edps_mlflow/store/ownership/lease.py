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
from edps_mlflow.store.client import StoreClient
from edps_mlflow.store.experiment import index_study_run

_HEARTBEAT_EVERY = 20.0  # seconds between renewals at most; a sixth of the lease when that is shorter


def heartbeat_tags() -> dict[str, str]:
    return {n.TAG_HEARTBEAT: f"{time.time():.3f}"}


def renew_heartbeat(client: StoreClient, run_id: str) -> None:
    """One heartbeat on a run (an executor keeps its submitted runs live until their entry point beats itself)."""
    client.set_tag(run_id, n.TAG_HEARTBEAT, heartbeat_tags()[n.TAG_HEARTBEAT])


def expired_reason(lease: float) -> str:
    return f"no heartbeat for more than the lease of {lease:g} s: its process is gone"


class LeaseLost(EdpsError):
    """This process no longer owns its run: another process took its work over while it was stalled. Nothing
    more is written. Exit code 3, which a script can tell from bad input (2)."""

    exit_code = 3


class OwnedRun:
    """A study or sweep run this process owns. ``token``: the owner token on the run (``edps.lease_owner``) of a
    run that can be taken over as it is (a sweep's); None for a study run, for which RUNNING says it is ours."""

    def __init__(self, client: StoreClient, run_id: str, token: str | None, label: str) -> None:
        self.client, self.run_id, self.token, self.label = client, run_id, token, label
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
                    if self._why_not_ours(client.get_run(self.run_id)) is not None:
                        self.lost.set()  # woken after a stall: never renew a run that is not ours
                        return
                    renew_heartbeat(client, self.run_id)

        self._thread = threading.Thread(target=beat, name=f"edps-heartbeat-{self.run_id[:8]}", daemon=True)
        self._thread.start()

    def stop_heartbeat(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout=min(_HEARTBEAT_EVERY, lease_seconds() / 6) + 30)

    def _why_not_ours(self, run: Any) -> str | None:
        if run.info.status != RunState.RUNNING.value:
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
        return LeaseLost(f"{self.label}: run {self.run_id} lost its lease ({why} while this process was stalled "
                         f"longer than the lease of {lease_seconds():g} s); its work was taken over and this process "
                         f"wrote nothing more (raise {LEASE_VARIABLE} on machines that stall)")

    def finish(self) -> None:
        """FINISHED, if still ours (else :class:`LeaseLost`, and nothing written)."""
        self.stop_heartbeat()
        self.require()
        self.client.set_terminated(self.run_id, RunState.FINISHED.value)

    def abort(self, interrupted: bool, open_runs: list[str] | None = None) -> None:
        """KILLED (interrupted) or FAILED, with ``open_runs`` (its RUNNING trial runs), if still ours; a run
        another process took over keeps what that process wrote."""
        self.stop_heartbeat()
        # One try each, and none after a write that fails: a locked, full or read-only store would make
        # every run wait out the retries again, and the lease marks what is left.
        client = self.client.without_retries()
        with suppress(Exception):  # the store is failing: marking is best effort, the lease covers the rest
            if self.lost.is_set() or self._why_not_ours(client.get_run(self.run_id)) is not None:
                return
        status = (RunState.KILLED if interrupted else RunState.FAILED).value
        for run_id in [*(open_runs or []), self.run_id]:
            try:
                client.set_terminated(run_id, status)
            except Exception:  # noqa: BLE001 - as above: aborting must not hide the error that caused it
                return
        with suppress(Exception):  # best effort: an entry that says RUNNING is read from the store
            # A study run's entry in the study index says RUNNING until this (a sweep run has none).
            index_study_run(client, self.run_id)


@contextmanager
def abort_guard(owned: OwnedRun, open_runs: Callable[[], list[str]] = list,
                cleanup: Callable[[], None] | None = None) -> Iterator[None]:
    """The one abort guard of studies and sweeps: when the block fails, ``owned`` and its ``open_runs()`` are
    KILLED (an interrupt) or FAILED, unless the run is no longer ours; ``cleanup()`` runs last in any case."""
    try:
        yield
    except LeaseLost:
        owned.stop_heartbeat()
        raise
    except BaseException as error:
        owned.abort(isinstance(error, KeyboardInterrupt), open_runs())
        raise
    finally:
        if cleanup:
            cleanup()
