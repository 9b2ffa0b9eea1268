"""The process that owns a study or sweep run, as the run records it (``edps.owner_process``): a command that finds
a RUNNING run whose owner ran on this machine and has exited takes it over at once instead of waiting out the
lease. An owner that still exists (paused, swapping) keeps its lease; one on another machine cannot be seen."""

from __future__ import annotations

import os
import socket
from functools import cache
from pathlib import Path

from edps_mlflow.locks import proc_stat


def _start_ticks(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat, when the process started (clock ticks since boot): a reused pid has another.
    None when no such process runs (gone, or a zombie that only waits for its parent to read its exit)."""
    fields = proc_stat(pid)
    return None if fields is None or fields[0] in ("Z", "X") else fields[19]


@cache
def _machine() -> str | None:
    """This kernel's boot and pid namespace: hosts or containers that share a name (or a pid) do not share these."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() + "/" + os.readlink("/proc/self/ns/pid")
    except OSError:
        return None  # not Linux: owners are never seen to exit, and only the lease tells


def owner_tag() -> str | None:
    """This process as a run's owner: "<pid> <start ticks> <machine> <host name>" (None where /proc is missing)."""
    machine, start = _machine(), _start_ticks(os.getpid())
    return None if machine is None or start is None else f"{os.getpid()} {start} {machine} {socket.gethostname()}"


def exited_owner(tag: str | None) -> str | None:
    """"process <pid> on <host>" when ``tag`` names a process of this machine that no longer runs; None when it
    runs, or ran elsewhere (its lease decides), or the run has no such tag (written before it)."""
    fields = (tag or "").split()
    if len(fields) != 4 or not fields[0].isdigit() or fields[2] != _machine():
        return None
    return None if _start_ticks(int(fields[0])) == fields[1] else f"process {fields[0]} on {fields[3]}"
