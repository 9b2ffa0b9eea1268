"""Waits on file locks, bounded and said: who holds a lock (its pid, command line, and whether it is stopped),
read from Linux's /proc/locks, and a wait that names that holder on one line once it lasts a few seconds and
ends at its bound. Used for sqlite's locks (store/trouble.py), a new store's creation lock (store/sqlite.py) and
the pruning-score cache; standard library only. A process's /proc/<pid>/stat is read here too (proc_stat).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Callable

from edps_mlflow.uris import redact_uri

NOTICE_SECONDS = 2.0  # a wait on a lock that lasts this long says what it waits for and who holds it
_POLL_SECONDS = 0.1


def lock_holders(path: Path, first: int = 0, last: int | None = None) -> list[int]:
    """The processes (other than this one) that hold a lock on the file ``path`` covering a byte of [first,
    last] (a flock covers all): those holding a write lock, else those holding a read lock. From /proc/locks, so
    Linux only ([] elsewhere)."""
    try:
        stat = path.stat()
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    writers: set[int] = set()
    readers: set[int] = set()
    for line in lines:
        fields = line.split()
        # "1: POSIX  ADVISORY  WRITE 2155 fe:00:2171355 1073741824 1073742335", "2: FLOCK ... 0 EOF"; "->" marks
        # a waiter (a ninth field); an open-file-description lock has no pid (-1).
        if len(fields) != 8 or fields[5] != device:
            continue
        kind, pid, start = fields[3], int(fields[4]), int(fields[6])
        if pid <= 0 or pid == os.getpid() or (fields[7] != "EOF" and int(fields[7]) < first) or \
                (last is not None and start > last):
            continue
        (writers if kind == "WRITE" else readers).add(pid)
    return sorted(writers or readers)


def describe_holders(pids: list[int]) -> str:
    """``process 1234 (python -m edps_mlflow.cli study ..., stopped)``; ``another process`` when none is known."""
    if not pids:
        return "another process"
    return f"{'process' if len(pids) == 1 else 'processes'} {', '.join(_description(pid) for pid in pids)}"


def what_to_do(pids: list[int]) -> str:
    """What frees a lock that these processes hold: resuming the stopped ones, or their end."""
    stopped = [pid for pid in pids if is_stopped(pid)]
    if stopped:
        return f"resume it (`kill -CONT {' '.join(map(str, stopped))}`) or end it"
    return "wait for it to finish or end it"


def say_waiting(what: str, bound: float, pids: list[int]) -> None:
    """The line of a wait that lasts: what it waits for, for how long at most, and who holds it."""
    print(f"edps-mlflow: waiting up to {bound:g} s for {what}, held by {describe_holders(pids)}", file=sys.stderr,
          flush=True)


class LockWait:
    """One bounded wait on a lock, polled: says so once it lasts :data:`NOTICE_SECONDS`, naming the holders
    (Linux: where none can be seen, it is not said)."""

    def __init__(self, what: str, bound: float) -> None:
        self.what, self.bound = what, bound
        self.started = time.monotonic()
        self.said = False

    def pause(self, holders: Callable[[], list[int]]) -> bool:
        """Sleep one poll and True; False, at once, when the bound has passed."""
        waited = time.monotonic() - self.started
        if waited >= self.bound:
            return False
        # Said once a holder is seen: a file that changes under a writer holding no lock now is no lock's wait.
        if not self.said and waited >= NOTICE_SECONDS and (pids := holders()):
            say_waiting(self.what, self.bound, pids)
            self.said = True
        time.sleep(_POLL_SECONDS)
        return True


def proc_stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command's name: its state first, its start (clock ticks since
    boot) at index 19; None where there is no such process, or no /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def is_stopped(pid: int) -> bool:
    """Whether the process is stopped (Ctrl-Z, SIGSTOP) or held by a debugger."""
    fields = proc_stat(pid)
    return fields is not None and fields[0] in ("T", "t")


def _description(pid: int) -> str:
    """``1234 (python -m edps_mlflow.cli study ..., stopped)``: its command line, cut and without secrets."""
    try:
        words = [w.decode(errors="replace") for w in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if w]
    except OSError:
        return str(pid)
    command = redact_uri(" ".join(" ".join(words).split()))  # one line, whatever the arguments hold
    command = command if len(command) <= 100 else command[:100] + "..."
    return f"{pid} ({command}{', stopped' if is_stopped(pid) else ''})"
