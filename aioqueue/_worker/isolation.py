"""Process isolation: a task declared ``isolation="process"`` (or every task of a worker given
``isolation=ProcessIsolation(every_task=True)``, ``--isolation process``) runs in a child
process of a small pool, one job per child at a time, so that:

- a timeout kills the child for real (SIGKILL): the job fails as ``JobTimeout`` and a fresh
  child takes the next job (a thread of a sync task cannot be stopped; a child can);
- a segfault, ``os._exit`` or the kernel's OOM killer in a task fails that job with
  ``ChildCrashed`` (its exit code or signal) and not the worker;
- ``max_jobs_per_child`` and ``max_memory_per_child`` retire a child after a job (leaks stay
  bounded).

Children are made with the ``forkserver`` start method where there is one (Linux, macOS), else
``spawn``: never plain ``fork``, which would copy the worker's event loop, its threads' locks
and its open Redis sockets into the child. A forkserver child is forked from a small clean
server process, so replacing a killed child costs a fork and the import of the task's module,
not a new interpreter. The child (``child.py``) never talks to Redis: the worker leases,
renews and acknowledges; arguments and results cross the pipe as the job's serializer's bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from .._model.checks import check_int
from .._model.codec import Unrunnable
from .._model.exceptions import Retry
from .._model.serialize import Serializer
from . import child

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProcessIsolation:
    """How a worker runs isolated tasks (``Worker(isolation=...)``, ``--isolation process``).

    Args:
        every_task: run every task in a child, not only those declared
            ``isolation="process"``.
        processes: children at most (default: the worker's concurrency, at most the CPUs).
        max_jobs_per_child: retire a child after this many jobs (None: never).
        max_memory_per_child: retire a child whose resident memory is over this many bytes
            after a job (None: never); a job is not stopped midway for its memory.
    """

    every_task: bool = False
    processes: int | None = None
    max_jobs_per_child: int | None = None
    max_memory_per_child: int | None = None

    def __post_init__(self) -> None:
        for name in ("processes", "max_jobs_per_child", "max_memory_per_child"):
            value = getattr(self, name)
            if value is not None:
                check_int(value, 1, name)


class ChildTraceback(Exception):
    """The traceback of an exception raised in a child, attached as its ``__cause__``."""


def _context() -> Any:
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    # the server imports aioqueue once, so that a child forked from it does not (a new
    # child, after a kill or a recycling, then costs a fork and its task's module); this
    # has no effect once the process's forkserver runs
    ctx.set_forkserver_preload(["__main__", child.__name__])
    return ctx


def crash_reason(exitcode: int | None) -> str:
    """How a child ended, in words: ``signal 11 (SIGSEGV)``, ``exit code 3``."""
    if exitcode is None:
        return "an unknown end"
    if exitcode < 0:
        try:
            return f"signal {-exitcode} ({signal.Signals(-exitcode).name})"
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


class _Child:
    """One child process and the parent's end of its pipe."""

    def __init__(self, ctx: Any, serializer: Serializer) -> None:
        self.conn, theirs = ctx.Pipe()
        # held here alone and never written: the child exits when it closes (child.py)
        watched, self.alive = ctx.Pipe(duplex=False)
        self.proc: BaseProcess = ctx.Process(
            target=child.main,
            args=(theirs, watched, serializer),
            name="aioqueue-child",
            daemon=True,
        )
        self.proc.start()
        theirs.close()
        watched.close()
        self.jobs = 0
        #: the functions it has imported (module, qualname)
        self.loaded: set[tuple[str, str]] = set()

    async def call(self, msg: tuple[str, str, bytes | None]) -> tuple[Any, ...]:
        """Send one job and wait for its answer, or for the child's death (``Unrunnable``
        ``ChildCrashed``). Cancelling it leaves the child to be killed by the caller."""
        conn: Connection = self.conn
        conn.send(msg)
        loop = asyncio.get_running_loop()
        ready = loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_reader(conn.fileno(), wake)
        loop.add_reader(self.proc.sentinel, wake)
        try:
            await ready
        finally:
            loop.remove_reader(conn.fileno())
            loop.remove_reader(self.proc.sentinel)
        with contextlib.suppress(EOFError, OSError):
            if conn.poll():  # an answer, even from a child that exited right after it
                reply: tuple[Any, ...] = conn.recv()
                self.jobs += msg[2] is not None
                return reply
        self.proc.join(5)
        how = crash_reason(self.proc.exitcode)
        raise Unrunnable("ChildCrashed", f"the child process running the job died: {how}")

    def kill(self) -> None:
        """End it now (a job it runs is abandoned)."""
        with contextlib.suppress(OSError):
            self.conn.close()
            self.alive.close()
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)

    def retire(self) -> None:
        """End an idle child: it exits when its pipes close (killed if it does not soon)."""
        with contextlib.suppress(OSError):
            self.conn.close()
            self.alive.close()
        self.proc.join(2)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


class ChildPool:
    """The children of one worker: a job takes an idle child (or starts one, up to
    ``processes``), runs in it, and gives it back unless it must be retired."""

    def __init__(self, serializer: Serializer, options: ProcessIsolation, processes: int) -> None:
        self.serializer = serializer
        self.options = options
        self._ctx = _context()
        self._idle: list[_Child] = []
        self._slots = asyncio.Semaphore(processes)
        self._ending: set[asyncio.Future[None]] = set()
        #: children started, and retired or killed (for tests and logs)
        self.started = 0
        self.ended = 0

    async def run(self, module: str, qualname: str, payload: bytes, timeout: float | None) -> bytes:
        """Run a job's function in a child, killed after ``timeout`` seconds of its run (a
        wait for a free child and the child's start do not count): its result as the
        serializer's bytes.

        Raises:
            Retry: the task asked to run again later.
            Exception: what the task raised (with the child's traceback as its cause), or
                ``Unrunnable``: ``ChildCrashed`` when the child died, ``JobTimeout``.
        """
        async with self._slots:
            c = await self._take()
            done = False
            try:
                if (module, qualname) not in c.loaded:  # its import is not the job's time
                    reply = await c.call((module, qualname, None))
                    if reply[0] == "loaded":
                        c.loaded.add((module, qualname))
                try:
                    async with asyncio.timeout(timeout):
                        reply = await c.call((module, qualname, payload))
                except TimeoutError:
                    why = f"job exceeded its timeout of {timeout} s; its child process was killed"
                    raise Unrunnable("JobTimeout", why) from None
                done = True
            finally:
                if done:
                    self._give_back(c, reply[-1])
                else:  # cancelled (timeout, shutdown, abort) or dead: a child is never reused
                    self._end(c, kill=True)
        return _outcome(reply)

    async def _take(self) -> _Child:
        while self._idle:
            c = self._idle.pop()
            if c.proc.is_alive():
                return c
            self._end(c, kill=True)  # died while idle
        # started in a thread (the forkserver's answer blocks); a start cancelled midway is
        # not left behind: the child is ended once it exists
        starting = asyncio.ensure_future(asyncio.to_thread(_Child, self._ctx, self.serializer))
        try:
            c = await asyncio.shield(starting)
        except asyncio.CancelledError:
            starting.add_done_callback(_end_started)
            raise
        self.started += 1
        return c

    def _give_back(self, c: _Child, rss: int) -> None:
        o = self.options
        if o.max_jobs_per_child is not None and c.jobs >= o.max_jobs_per_child:
            logger.info("retiring child %s after %d jobs", c.proc.pid, c.jobs)
            self._end(c)
        elif o.max_memory_per_child is not None and rss > o.max_memory_per_child:
            logger.info("retiring child %s: %d bytes resident", c.proc.pid, rss)
            self._end(c)
        else:
            self._idle.append(c)

    def _end(self, c: _Child, kill: bool = False) -> None:
        """End a child; waiting for its exit is a thread's work, not the event loop's."""
        self.ended += 1
        if kill and c.proc.is_alive():
            c.proc.kill()  # at once: a timed-out job stops now, not when the thread runs
        ending = asyncio.get_running_loop().run_in_executor(None, c.kill if kill else c.retire)
        self._ending.add(ending)
        ending.add_done_callback(self._ending.discard)

    def close(self) -> None:
        """Retire the idle children (running ones are killed as their jobs are cancelled)."""
        while self._idle:
            self.ended += 1
            self._idle.pop().retire()


def _end_started(starting: asyncio.Future[_Child]) -> None:
    if not starting.cancelled() and starting.exception() is None:
        starting.result().kill()


def _outcome(reply: tuple[Any, ...]) -> bytes:
    kind = reply[0]
    if kind == "ok":
        return bytes(reply[1])
    if kind == "retry":
        raise Retry(reply[1], *((reply[2],) if reply[2] else ()))
    _, exc, type_name, message, text = reply[:5]
    if exc is None:
        exc = Unrunnable(type_name, message)
    if text:
        exc.__cause__ = ChildTraceback(f"in the child process:\n{text}")
    raise exc


def default_processes(concurrency: int) -> int:
    """Children of a pool by default: the worker's concurrency, at most the CPUs."""
    return max(1, min(concurrency, os.cpu_count() or 1))
