"""The figures of a report, drawn and written by forked processes while this process reads and fits.

Writing a figure (laying out its text, rendering the PNG and the SVG) takes several times as long as drawing
it (making its lines and labels), so a report of many figures hands its figures to a pool of processes and
waits for them all at the end: a figure drawn here goes pickled (:func:`save`), and a figure function goes
with its tables (:func:`call`), to be drawn and written there. A pool forked with ``preload`` (the plotting
modules) is forked at once, before this process imports MLflow and reads the store: the children import
matplotlib meanwhile, on the core that the import of MLflow leaves idle, and this process never needs it.
Outside :func:`writing_in_parallel`, and wherever forking is not safe, figures are drawn and written at once,
in this process."""

from __future__ import annotations

import contextlib
import gc
import importlib
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from edps_mlflow.errors import EdpsError
from edps_mlflow.process_settings import resume_collection

Writer = Callable[[Any, list[Path]], None]  # writes a figure to its files (analysis.plots)

# How often a child looks for its parent: a parent killed outright (SIGKILL) cannot shut the pool down.
PARENT_CHECK_SECONDS = 1.0
# The most processes forked at once: a report has about twenty figures, and each child is a copy of a process
# of a few hundred MB.
MAX_WORKERS = 8


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def forking_is_safe() -> bool:
    """Whether a forked child can draw: fork copies the imports and the drawing state for free, but also every
    lock as it is, and a lock that another thread of this process holds is never released in the child. The
    command line has one thread; a caller with Python threads (a server, a test runner) writes in its own
    process. Linux only: elsewhere (macOS) system libraries that are not safe to fork may be in use."""
    return (sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()
            and threading.active_count() == 1)


def _died(error: BrokenProcessPool) -> EdpsError:
    """A child that ended without a word (killed by the kernel for memory, or by a signal) as one line."""
    return EdpsError(f"a forked process of this command ended abruptly ({error}): out of memory? Run it again, "
                     f"or with fewer CPUs available to it (taskset)")


class _Pool:
    """The processes of one :func:`writing_in_parallel` block, forked at its first figure, or on entering the
    block when they preload modules (the report's: it always has figures, and forks before it starts a thread
    of its own; the pool's own thread makes this process unsafe to fork once started)."""

    def __init__(self, workers: int, preload: tuple[str, ...] = ()) -> None:
        self.workers = workers
        self.preload = preload
        self.executor: ProcessPoolExecutor | None = None
        self.pending: list[Future] = []
        self.refused = False  # a fork was refused: this block's figures are written here

    def _submit(self, function: Callable[..., Any], *args: Any) -> Future | None:
        """``function(*args)`` handed to a child (the children forked at the first); None when there are none,
        or the fork was refused (no memory): the caller then does it here."""
        if self.executor is None and not self.refused and forking_is_safe():
            context = multiprocessing.get_context("fork")
            self.executor = ProcessPoolExecutor(self.workers, mp_context=context,
                                                initializer=_child_setup,
                                                initargs=(os.getpid(), self.preload, context.Lock()))
        if self.executor is None:
            return None
        try:
            with _interrupts_deferred():
                future = self.executor.submit(function, *args)
        except BrokenProcessPool as error:  # a child died while this process drew the figure
            raise _died(error) from None
        except OSError:
            if self.pending:
                raise
            # the first submit forks the children: a fork refused (no memory) leaves the work to this process
            self.executor.shutdown(wait=True, cancel_futures=True)
            self.executor, self.refused = None, True
            return None
        self.pending.append(future)
        return future

    def start(self) -> None:
        """Forks the children now (they import ``preload`` first)."""
        self._submit(_ready)

    def save(self, writer: Writer, figure: Any, paths: list[Path]) -> None:
        if self._submit(_write_pickled, writer, pickle.dumps(figure), paths) is None:
            writer(figure, paths)

    def call(self, module: str, function: str, args: tuple) -> Future:
        future = self._submit(_call_by_name, module, function, args)
        return future if future is not None else _done(_call_by_name, module, function, args)

    def finish(self) -> None:
        """Waits for every figure; a child's error is raised here as the error itself (an OSError of a full
        disk stays one), the first in the order the figures were drawn."""
        try:
            for future in self.pending:
                future.result()
        except BrokenProcessPool as error:
            raise _died(error) from None

    def close(self) -> None:
        """Ends the children (figures not yet started are dropped: only an error or an interrupt gets here
        before :meth:`finish`)."""
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)


_active: _Pool | None = None


@contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Ctrl-C held back until the block ends. A submit may fork the children, one after the other, and then
    start the thread that will tell them to end: interrupted between the two, a command would leave children
    that nobody tells to end, and wait for them at exit for ever. Held back, the interrupt is raised just after
    the submit, with the pool whole, and shutting the pool down ends them. Threads started in the block (the
    pool's) inherit the mask, so Ctrl-C is delivered to this thread as before; the children inherit it too,
    and take it back only once they ignore Ctrl-C (:func:`_child_setup`)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextmanager
def writing_in_parallel(workers: int | None = None, preload: tuple[str, ...] = ()) -> Iterator[None]:
    """Within the block, figures are written by ``workers`` forked processes (default: one per available CPU,
    at most MAX_WORKERS) and their paths returned before the files exist; the block ends once every file is
    written, or with the first error of a child. With one worker, figures are written at once; nested in
    another such block, they go to the outer block's processes and are waited for at its end. With
    ``preload`` (modules), the processes are forked on entering the block and import those modules first."""
    global _active
    workers = min(available_cpus(), MAX_WORKERS) if workers is None else workers
    if workers < 2 or _active is not None:
        yield
        return
    pool = _active = _Pool(workers, preload)
    try:
        if preload:
            pool.start()
        yield
        pool.finish()
    finally:
        _active = None
        pool.close()


def save(writer: Writer, figure: Any, paths: list[Path]) -> None:
    """Writes ``figure`` to ``paths`` with ``writer``: in a child within :func:`writing_in_parallel`, else now."""
    if _active is None:
        writer(figure, paths)
    else:
        _active.save(writer, figure, paths)


def call(module: str, function: str, *args: Any) -> Future:
    """``module.function(*args)`` (a figure function: it draws and writes its figures, and returns their
    paths), done by a child within :func:`writing_in_parallel`, else now; its result once the block ended.
    Named, not passed: this process need not import the plotting modules that the children import."""
    if _active is None:
        return _done(_call_by_name, module, function, args)
    return _active.call(module, function, args)


def _done(function: Callable[..., Any], *args: Any) -> Future:
    """A future of ``function(*args)`` done now, in this process; its error raised now, as a call's would be."""
    future: Future = Future()
    future.set_result(function(*args))
    return future


def _call_by_name(module: str, function: str, args: tuple) -> Any:
    return getattr(importlib.import_module(module), function)(*args)


def _write_pickled(writer: Writer, figure: bytes, paths: list[Path]) -> None:
    writer(pickle.loads(figure), paths)


def _ready() -> None:
    """The first work of a pool forked at once: nothing (the children's setup is what is wanted)."""


def _child_setup(parent: int, preload: tuple[str, ...] = (), one_at_a_time: Any = None) -> None:
    """A child leaves Ctrl-C to its parent (which then stops the pool) and ends when the parent is gone. The
    objects it inherits are never garbage here: frozen, they are left out of its collections, which would
    otherwise walk the parent's whole heap (the studies, the trials) and copy it page by page. What it is
    given to do it does here (:func:`save` and :func:`call` within it are not handed on); it imports
    ``preload`` first."""
    global _active
    _active = None
    gc.freeze()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C held back since the fork is dropped here
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    threading.Thread(target=_end_with, args=(parent,), daemon=True, name="forked-parent-check").start()
    # The children import one after the other: the parent, importing MLflow meanwhile, keeps a core to itself.
    with one_at_a_time if one_at_a_time is not None else contextlib.nullcontext():
        for module in preload:
            importlib.import_module(module)
    # Forked while the command paused the collector to read the store: the modules imported, it runs again.
    resume_collection()


def _end_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_SECONDS)
    os._exit(1)
