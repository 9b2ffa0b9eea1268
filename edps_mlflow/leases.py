"""Leases: which process owns the study or sweep run of a key, so that nothing is trained twice.

A running study or sweep renews a heartbeat on its run (tracking.Heartbeat). A RUNNING run whose
heartbeat is older than the lease (``EDPS_LEASE_SECONDS``) belongs to a dead process: it is marked
FAILED and its work is taken over. A live run of the same key is never duplicated: the newcomer
stops with one line, or waits (``--wait``; a sweep's studies always wait) until that run ends.

MLflow has no transaction across processes, so claiming is "create mine, then look again": of two
live runs of one key the earlier (start time, then run id) wins and the later one gives way.
This module reads through registry.py and writes through tracking.py; it imports no mlflow.
"""

from __future__ import annotations

import time
from typing import TextIO

from edps_mlflow import registry
from edps_mlflow.registry import LeasedRun
from edps_mlflow.results import RunState
from edps_mlflow.tracking import StoreClient, mark_dead


def expired_reason(lease: float) -> str:
    return f"no heartbeat for more than the lease of {lease:g} s: its process is gone"


def clear_expired(client: StoreClient, experiment_id: str, lease: float, key: str | None = None) -> int:
    """Mark FAILED the runs left RUNNING by dead processes (only those of ``key`` when given)."""
    expired = [r for r in registry.expired_runs(client, experiment_id, lease) if key is None or r.key == key]
    mark_dead(client, [r.run_id for r in expired], expired_reason(lease))
    return len(expired)


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
