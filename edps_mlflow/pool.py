"""Worker processes: the one place in the package that starts processes.

    spec = PoolSpec(name="edps-worker", target=work, worker_args=((job,),) * 4)
    run_pool(spec, tasks, on_event=handle)      # in the parent: blocks until every task is done

    def work(worker: Worker, job: Job) -> None:  # module level: spawn pickles it by name
        for task in worker.tasks():
            worker.send(("result", compute(job, task)))

Workers are spawned, get their tasks from one queue and send events back. A worker that raises or dies
fails the pool with a :class:`WorkerError`; however the parent leaves, its workers are stopped, and
however the parent dies, they die within a second without writing again (docs/reliability.md).
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
class _TaskDone:
    worker: int


@dataclass(frozen=True)
class _Done:
    worker: int
    failure: str | None = None  # the traceback of a worker whose target raised


class _Deferred:
    """A value pickled while the worker is spawned (shared memory and locks may only be pickled then) but
    unpickled when the worker asks: after it has asked for the parent-death signal, not while importing
    the target's module (torch: seconds)."""

    def __init__(self, value: Any = None, data: bytes | None = None) -> None:
        self.value, self.data = value, data

    def __reduce__(self) -> tuple[Any, ...]:
        return _Deferred, (None, bytes(reduction.ForkingPickler.dumps(self.value)))

    def load(self) -> Any:
        assert self.data is not None, "only a spawned worker loads a deferred value"
        return pickle.loads(self.data)


# Python's resource tracker releases the locks of a worker that was killed or ended with os._exit, and prints
# "leaked semaphore" warnings under the user's one-line error; set before it starts, this keeps it quiet.
_QUIET_RESOURCE_TRACKER = "ignore:resource_tracker:UserWarning"


def _quiet_resource_tracker() -> None:
    if _QUIET_RESOURCE_TRACKER not in sys.warnoptions:
        sys.warnoptions.append(_QUIET_RESOURCE_TRACKER)


def shared_int(initial: int) -> Any:
    """A signed 64-bit integer in shared memory with a lock (``.value``, ``.get_lock()``), for ``worker_args``."""
    _quiet_resource_tracker()
    return _CONTEXT.Value("q", initial)


def shared_ints(count: int, initial: int) -> Any:
    """``count`` signed 64-bit integers in shared memory with a lock (indexable, ``.get_lock()``)."""
    _quiet_resource_tracker()
    return _CONTEXT.Array("q", [initial] * count)


def run_pool(spec: PoolSpec, tasks: Iterable[Any], on_event: Callable[[Any], None],
             on_idle: Callable[[], None] | None = None) -> None:
    """Start the workers, feed them ``tasks`` (:meth:`Pool.run`), and return once every worker is done; no
    worker outlives the call."""
    with open_pool(spec) as pool:
        pool.run(tasks, on_event, on_idle)


class Pool:
    """Workers started once and given tasks batch after batch (:meth:`run`) until the pool is closed: an
    adaptive sweep's rounds share them instead of starting interpreters (and torch) again each round."""

    def __init__(self, processes: list[Any], task_queue: Any, events: Any) -> None:
        self._processes, self._tasks, self._events = processes, task_queue, events
        self._running = set(range(len(processes)))
        self._pending = 0  # tasks given and not yet done
        self._on_event: Callable[[Any], None] = lambda event: None

    def run(self, tasks: Iterable[Any], on_event: Callable[[Any], None],
            on_idle: Callable[[], None] | None = None) -> None:
        """Feed ``tasks`` to the workers and hand their events to ``on_event`` (``on_idle`` when none came for a
        second) until every one of these tasks is done; :class:`WorkerError` when a worker fails or dies."""
        self._on_event = on_event
        for task in tasks:
            self._tasks.put(task)
            self._pending += 1
        self._wait(lambda: not self._pending, on_idle)

    def close(self, forgive_idle_deaths: bool = False) -> bool:
        """Tell every worker there is no more work and wait until each says it is done (True). With
        ``forgive_idle_deaths``, a worker that died after every task was done returns False instead of raising,
        so that the finished work does not fail for it (the caller then stops the others)."""
        for _ in self._processes:
            self._tasks.put(None)
        return self._wait(lambda: not self._running, None, forgive_idle_deaths)

    def _wait(self, finished: Callable[[], bool], on_idle: Callable[[], None] | None,
              forgive_idle_deaths: bool = False) -> bool:
        """Dispatch events until ``finished()``; False when a worker died idle and that is forgiven."""
        last_poll = time.monotonic()
        while not finished():
            if time.monotonic() - last_poll >= _POLL_SECONDS:
                # A worker killed from outside sends nothing, and the others may keep the queue busy.
                last_poll = time.monotonic()
                if not forgive_idle_deaths:
                    self._check_alive()
                    continue
                self._drain()  # a failure still raises
                if any(self._processes[w].exitcode is not None for w in self._running):
                    return False
                continue
            try:
                event = self._events.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                if on_idle is not None:
                    on_idle()
                continue
            self._dispatch(event)
            if self._pending and not self._running:
                raise WorkerError(f"every worker ended with {self._pending} task(s) left")
        return True

    def _dispatch(self, event: Any) -> None:
        if isinstance(event, _TaskDone):
            self._pending -= 1
        elif isinstance(event, _Done) and event.failure is not None:
            process = self._processes[event.worker]
            raise WorkerError(f"{process.name} (pid {process.pid}) failed:\n{event.failure}")
        elif isinstance(event, _Done):
            self._running.discard(event.worker)
        else:
            self._on_event(event)

    def _drain(self) -> None:
        """Handle every event already sent."""
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return
            self._dispatch(event)

    def _check_alive(self) -> None:
        """Raise when a worker died. One that exited after saying it is done (or why it failed) flushed that
        into the pipe first: what is there is read before its exit is called a death."""
        if all(self._processes[w].exitcode is None for w in self._running):
            return
        self._drain()
        dead = sorted(w for w in self._running if self._processes[w].exitcode is not None)
        if dead:
            process = self._processes[dead[0]]
            raise WorkerError(f"{process.name} (pid {process.pid}) exited with code {process.exitcode}"
                              f"{_signal_name(process.exitcode)} before finishing its tasks")


@contextmanager
def open_pool(spec: PoolSpec, forgive_idle_deaths: bool = False) -> Iterator[Pool]:
    """The workers of ``spec`` for as long as the ``with`` lasts: on a normal exit closed (:meth:`Pool.close`),
    on an error or Ctrl-C stopped; either way no worker outlives the ``with``."""
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
                         daemon=False)  # a daemon may not start processes; the pool ends its workers itself
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
        events.put(_Done(index, traceback.format_exc()))
        return
    events.put(_Done(index))


def _die_with_parent(parent: int) -> None:
    """SIGKILL from the kernel when the parent ends (Linux), not SIGTERM: a SIGTERM'd worker would mark its
    runs KILLED, a write after its parent is gone. A watchdog thread covers other systems."""
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
