"""SIGTERM and Ctrl-C as KeyboardInterrupt, held back while a tracking-store call of the main thread is in
flight: raised inside one, it could leave a sqlite transaction open whose lock blocks the write that records
the interruption (docs/reliability.md). No imports of mlflow or torch.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager, suppress
from types import FrameType
from typing import Iterator

_depth = 0  # store calls of the main thread in flight
_pending = False  # a SIGTERM or SIGINT arrived during one
_last_signal = signal.SIGTERM  # the signal raise_interrupt last turned into KeyboardInterrupt
_REDELIVER_SECONDS = 0.02  # long enough for the callback that swallowed an interrupt to end


def raise_interrupt(signum: int, frame: FrameType | None) -> None:
    """The SIGTERM and SIGINT handler: KeyboardInterrupt now, or when the store call in flight ends."""
    global _pending, _last_signal
    _catch_swallowed_interrupts()
    _last_signal = signal.Signals(signum)
    if _depth and not (_pending and signum == signal.SIGINT):
        _pending = True
        return
    # Outside a store call, or a second Ctrl-C while one hangs (a store that stopped answering can hold a
    # call for its whole retry budget): the user insists, and an open transaction is the lesser harm.
    _pending = False
    raise KeyboardInterrupt


@contextmanager
def store_call() -> Iterator[None]:
    """Around one call to the tracking store: a SIGTERM or SIGINT inside it is raised when it ends."""
    global _depth, _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _pending:
            _pending = False
            raise KeyboardInterrupt


def _catch_swallowed_interrupts() -> None:
    """An interrupt raised inside a callback Python cannot raise out of (a weak reference's, the garbage
    collector's) is printed as "Exception ignored" and lost: send the signal again a moment later, from
    another thread, so that it is raised outside the callback."""
    if getattr(sys.unraisablehook, "_edps_redelivers", False):
        return
    previous = sys.unraisablehook

    def redeliver(unraisable: "sys.UnraisableHookArgs") -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and threading.current_thread() is threading.main_thread():
            timer = threading.Timer(_REDELIVER_SECONDS, os.kill, (os.getpid(), _last_signal))
            timer.daemon = True
            with suppress(RuntimeError):  # no new thread while the interpreter shuts down: it is ending anyway
                timer.start()
                return
        previous(unraisable)

    redeliver._edps_redelivers = True  # type: ignore[attr-defined]
    sys.unraisablehook = redeliver
