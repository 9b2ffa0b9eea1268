"""Worker processes: the one place in the package that starts processes.

    spec = PoolSpec(name="edps-worker", target=work, worker_args=((job,),) * 4)
    run_pool(spec, tasks, on_event=handle)      # in the parent: blocks until every task is done

    def work(worker: Worker, job: Job) -> None:  # module level: spawn pickles it by name
        for task in worker.tasks():
            worker.send(("result", compute(job, task)))

Workers are spawned (a fresh interpreter each: no inherited threads, locks or CUDA state). The
parent puts every task on one queue, then one ``None`` per worker to say there is no more, and
dispatches what the workers send back to ``on_event``. A worker that raises, or dies without
saying it is done, fails the pool with a :class:`WorkerError`; whatever way the parent leaves
(success, error, Ctrl-C), its workers are stopped: SIGTERM, a grace period, then SIGKILL.

Workers die with their parent, however the parent died (SIGKILL included), within about a
second, and never act after it is gone: a sweep worker writes to the tracking store, and a
worker of a dead sweep writing on would corrupt what the next sweep resumes from. On Linux the
kernel delivers SIGKILL to a worker the moment its parent ends (``PR_SET_PDEATHSIG``); SIGKILL
rather than SIGTERM because a SIGTERM'd sweep worker would first mark its runs KILLED, i.e.
write to the store after its parent is gone. The runs a dead sweep leaves RUNNING are marked
FAILED by the next sweep (resume). A watchdog thread in every worker covers the rest: other
systems, and a parent that died before the worker could ask the kernel.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import reduction
from typing import Any, Callable, Iterable, Iterator

from edps_mlflow.interrupts import raise_interrupt

# Spawn, never fork: a forked child would inherit the parent's threads' locks (MLflow, torch).
_CONTEXT = mp.get_context("spawn")
_POLL_SECONDS = 1.0  # how often the parent looks for workers that died without a word
_WATCH_SECONDS = 0.5  # how often a worker looks for its parent
_KILL_WAIT_SECONDS = 5.0  # SIGKILL cannot be caught: this only waits for the kernel
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
ORPHANED_EXIT_CODE = 3  # what a worker exits with when it finds its parent gone (nobody reads it)


@dataclass(frozen=True)
class PoolSpec:
    """The workers of one pool. ``target(worker, *worker_args[i])`` runs in worker ``i``."""

    name: str  # process names are ``{name}-{i}``; errors name the process
    target: Callable[..., None]  # module level, so that spawn can pickle it by name
    worker_args: tuple[tuple[Any, ...], ...]  # one tuple per worker: the pool has this many workers
    # Seconds a worker gets after SIGTERM (and, when all said done, to exit by itself) before SIGKILL.
    stop_timeout: float = 10.0


@dataclass(frozen=True)
class Worker:
    """A worker's end of the pool: the first argument of the target."""

    index: int
    task_queue: Any
    event_queue: Any

    def tasks(self) -> Iterator[Any]:
        """The tasks this worker takes, until the pool is closed. Asking for the next one says that the
        last is done (the pool's ``run`` returns once every task it was given is)."""
        while True:
            task = self.task_queue.get()
            if task is None:
                return
            yield task
            self.event_queue.put(_TaskDone(self.index))

    def send(self, event: Any) -> None:
        """Hand ``event`` (picklable) to the parent's ``on_event``."""
        self.event_queue.put(event)


class WorkerError(RuntimeError):
    """A worker raised, or died without saying that it was done."""


@dataclass(frozen=True)
class _Done:
    worker: int


@dataclass(frozen=True)
class _TaskDone:
    worker: int


@dataclass(frozen=True)
class _Failed:
    worker: int
    traceback: str


class _Deferred:
    """A value pickled while the worker is being spawned but unpickled only when the worker asks.

    Unpickling the target imports its module (torch: seconds); deferring it lets the worker ask
    for the parent-death signal first. Pickling inside ``Process.start`` is what lets shared
    memory and locks travel in ``worker_args``: they may only be pickled while spawning."""

    def __init__(self, value: Any = None, data: bytes | None = None) -> None:
        self.value, self.data = value, data

    def __reduce__(self) -> tuple[Any, ...]:
        return _Deferred, (None, bytes(reduction.ForkingPickler.dumps(self.value)))

    def load(self) -> Any:
        assert self.data is not None, "only a spawned worker loads a deferred value"
        return pickle.loads(self.data)


# Python's resource tracker (one process, shared by a parent and every worker it spawns, started with the
# parent's warning options) releases the locks of a process that ended without releasing them: a worker
# stopped with SIGKILL, or one that ended itself with os._exit when its parent died. That is its job; but it
# then prints "leaked semaphore" warnings, lines that would follow the one-line error or interruption the
# user is reading. This option, in place before the tracker starts, keeps it quiet about exactly that.
_QUIET_RESOURCE_TRACKER = "ignore:resource_tracker:UserWarning"


def _quiet_resource_tracker() -> None:
    if _QUIET_RESOURCE_TRACKER not in sys.warnoptions:
        sys.warnoptions.append(_QUIET_RESOURCE_TRACKER)


def shared_int(initial: int) -> Any:
    """A signed 64-bit integer in shared memory with a lock (``.value``, ``.get_lock()``), to hand
    to workers in ``worker_args``."""
    _quiet_resource_tracker()
    return _CONTEXT.Value("q", initial)


def shared_ints(count: int, initial: int) -> Any:
    """``count`` signed 64-bit integers in shared memory with a lock (indexable, ``.get_lock()``), to hand
    to workers in ``worker_args``."""
    _quiet_resource_tracker()
    return _CONTEXT.Array("q", [initial] * count)


def run_pool(spec: PoolSpec, tasks: Iterable[Any], on_event: Callable[[Any], None],
             on_idle: Callable[[], None] | None = None) -> None:
    """Start the workers, feed them ``tasks``, call ``on_event`` in this process for every event a
    worker sends (``on_idle`` when none came for a second), and return once every worker is done.

    Raises :class:`WorkerError` if a worker fails or dies; whatever ``on_event`` raises propagates.
    Either way no worker outlives the call."""
    with open_pool(spec) as pool:
        pool.run(tasks, on_event, on_idle)


class Pool:
    """Workers started once and given tasks batch after batch (:meth:`run`) until the pool is closed: an
    adaptive sweep's rounds share them instead of starting interpreters (and torch) again each round."""

    def __init__(self, processes: list[Any], task_queue: Any, events: Any) -> None:
        self._processes, self._tasks, self._events = processes, task_queue, events
        self._running = set(range(len(processes)))
        self._on_event: Callable[[Any], None] = lambda event: None

    def run(self, tasks: Iterable[Any], on_event: Callable[[Any], None],
            on_idle: Callable[[], None] | None = None) -> None:
        """Feed ``tasks`` to the workers, call ``on_event`` for every event they send (``on_idle`` when none
        came for a second), and return once every one of these tasks is done. Raises :class:`WorkerError`
        if a worker fails or dies; whatever ``on_event`` raises propagates (the pool is then closed by
        force when its ``with`` ends)."""
        self._on_event = on_event
        pending = 0
        for task in tasks:
            self._tasks.put(task)
            pending += 1
        last_poll = time.monotonic()
        while pending:
            if time.monotonic() - last_poll >= _POLL_SECONDS:
                # A worker killed from outside sends nothing, and the others may keep the queue busy.
                last_poll = time.monotonic()
                pending -= _check_alive(self._processes, self._running, self._events, on_event)
                if not pending:
                    break
            try:
                event = self._events.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                if on_idle is not None:
                    on_idle()
                continue
            pending -= _dispatch(event, self._processes, self._running, on_event)
            if pending and not self._running:
                raise WorkerError(f"every worker ended with {pending} task(s) left")

    def close(self, forgive_idle_deaths: bool = False) -> bool:
        """Tell every worker there is no more work and wait until each has said it is done (the events
        still coming go to the last ``run``'s ``on_event``); True then. Raises :class:`WorkerError` if one
        fails or dies. With ``forgive_idle_deaths``, one that died idle (every task given to the pool was
        done: ``run`` returned) makes it return False instead, so that the work the caller finished does not
        fail for it; the caller stops the others then, which may never get their word (a worker killed while
        waiting for a task can die holding the queue's lock)."""
        for _ in self._processes:
            self._tasks.put(None)
        last_poll = time.monotonic()
        while self._running:
            if time.monotonic() - last_poll >= _POLL_SECONDS:
                last_poll = time.monotonic()
                if not forgive_idle_deaths:
                    _check_alive(self._processes, self._running, self._events, self._on_event)
                    continue
                _drain(self._processes, self._running, self._events, self._on_event)  # a _Failed still raises
                if any(self._processes[w].exitcode is not None for w in self._running):
                    return False
                continue
            try:
                event = self._events.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                continue
            _dispatch(event, self._processes, self._running, self._on_event)
        return True


@contextmanager
def open_pool(spec: PoolSpec, forgive_idle_deaths: bool = False) -> Iterator[Pool]:
    """The workers of ``spec``, started, for as long as the ``with`` lasts. On a normal exit they are told
    there is no more work and the ``with`` waits until each says it is done (:meth:`Pool.close`, which
    ``forgive_idle_deaths`` is passed to); on an error (or Ctrl-C) they are stopped. Either way no worker
    outlives the ``with``."""
    if threading.current_thread() is not threading.main_thread():
        # The kernel's parent-death signal fires when the *thread* that started a worker ends.
        raise RuntimeError("worker processes must be started from the main thread")
    if not spec.worker_args:
        raise ValueError("a pool needs at least one worker")
    _quiet_resource_tracker()
    task_queue, events = _CONTEXT.Queue(), _CONTEXT.Queue()
    parent = os.getpid()
    processes = [
        _CONTEXT.Process(target=_worker_main, name=f"{spec.name}-{index}",
                         args=(parent, index, task_queue, events, _Deferred((spec.target, args))),
                         # Not daemon: a daemon process may not start processes of its own, and
                         # this pool ends its workers itself.
                         daemon=False)
        for index, args in enumerate(spec.worker_args)]
    started: list[Any] = []
    finished = False
    try:
        for process in processes:
            process.start()
            started.append(process)
        pool = Pool(processes, task_queue, events)
        yield pool
        finished = pool.close(forgive_idle_deaths)
    finally:
        _stop(started, all_done=finished, timeout=spec.stop_timeout)
        # Tasks or events still buffered must not make this process wait at exit for dead readers.
        task_queue.cancel_join_thread()
        events.cancel_join_thread()


def _dispatch(event: Any, processes: list[Any], running: set[int], on_event: Callable[[Any], None]) -> int:
    """Handle one event; 1 when it says a task is done, else 0."""
    if isinstance(event, _TaskDone):
        return 1
    if isinstance(event, _Done):
        running.discard(event.worker)
    elif isinstance(event, _Failed):
        process = processes[event.worker]
        raise WorkerError(f"{process.name} (pid {process.pid}) failed:\n{event.traceback}")
    else:
        on_event(event)
    return 0


def _check_alive(processes: list[Any], running: set[int], events: Any, on_event: Callable[[Any], None]) -> int:
    """Raise when a worker died; the tasks done that were read on the way."""
    if all(processes[w].exitcode is None for w in running):
        return 0
    # A worker that exited after saying "done" (or why it failed) flushed that into the pipe before
    # it exited: read what is there before calling its exit a death.
    done = _drain(processes, running, events, on_event)
    dead = sorted(w for w in running if processes[w].exitcode is not None)
    if dead:
        process = processes[dead[0]]
        raise WorkerError(f"{process.name} (pid {process.pid}) exited with code {process.exitcode}"
                          f"{_signal_name(process.exitcode)} before finishing its tasks")
    return done


def _drain(processes: list[Any], running: set[int], events: Any, on_event: Callable[[Any], None]) -> int:
    """Handle every event already sent; the tasks done among them."""
    done = 0
    while True:
        try:
            event = events.get_nowait()
        except queue.Empty:
            return done
        done += _dispatch(event, processes, running, on_event)


def _signal_name(exitcode: int) -> str:
    try:
        return f" (killed by {signal.Signals(-exitcode).name})" if exitcode < 0 else ""
    except ValueError:
        return ""


def _stop(processes: list[Any], all_done: bool, timeout: float) -> None:
    if all_done:  # every worker said it is done: let them exit by themselves
        _join_all(processes, timeout)
    for process in processes:
        if process.is_alive():
            process.terminate()  # SIGTERM: a worker may end what it is doing cleanly
    _join_all(processes, timeout)
    for process in processes:
        if process.is_alive():
            process.kill()
    _join_all(processes, _KILL_WAIT_SECONDS)


def _join_all(processes: list[Any], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for process in processes:
        process.join(timeout=max(0.0, deadline - time.monotonic()))


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Inside, SIGTERM raises KeyboardInterrupt, so that the code inside can record that it was
    stopped (a study marks its runs KILLED); afterwards SIGTERM does what it did before."""
    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _worker_main(parent: int, index: int, task_queue: Any, events: Any, payload: _Deferred) -> None:
    """What every worker process runs: die with the parent, then the target."""
    _die_with_parent(parent)
    # Ctrl-C reaches the whole process group: the parent decides what it means and stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        target, args = payload.load()
        target(Worker(index, task_queue, events), *args)
    except KeyboardInterrupt:
        return  # SIGTERM inside sigterm_interrupts: the parent is stopping us and expects no word
    except BaseException:  # reported to the parent, which fails the pool
        events.put(_Failed(index, traceback.format_exc()))
        return
    events.put(_Done(index))


def _die_with_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        # The C library is already loaded into this process; CDLL(None) finds prctl there.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0), ctypes.c_ulong(0),
                   ctypes.c_ulong(0))  # if it fails, the watchdog below still ends us
    # The parent may have died before we asked the kernel (it would not signal us then): an
    # orphan is adopted by another process, so our parent pid is no longer the one we were given.
    if os.getppid() != parent:
        os._exit(ORPHANED_EXIT_CODE)
    threading.Thread(target=_watch_parent, args=(parent,), name="edps-parent-watchdog", daemon=True).start()


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(_WATCH_SECONDS)
        if os.getppid() != parent:
            os._exit(ORPHANED_EXIT_CODE)  # no cleanup: nothing may run after the parent is gone
