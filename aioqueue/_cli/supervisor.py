"""``python -m aioqueue worker --processes N`` and ``--reload``: a supervisor of worker processes.

The supervisor runs no event loop and no jobs. It starts N worker processes, each the same
command line without the supervisor's options (each its own event loop and connection pool;
they share nothing but Redis), in their own process group so that a Ctrl-C reaches them once,
through the supervisor. Then:

- SIGTERM/SIGINT is forwarded to every worker (each stops gracefully within its ``--grace``); a
  second one is forwarded too, and the workers stop at once. The supervisor exits when they all
  have: 0 if every one exited 0 (or was ended by the signal it was sent), else 1;
- a worker that dies unexpectedly (killed, crashed) is restarted after a pause that doubles
  with each quick death of its slot (0.5 s to 30 s; a worker that ran 30 s resets it). Its
  jobs come back by their leases, as for any dead worker;
- a worker that exits before it was ready (registered on its queues) failed at startup: the
  first start of a slot failing is a configuration error (its own one-line message is on
  stderr) and the supervisor stops the others and exits with its code, no restart loop; a
  restarted worker gets ``MAX_START_FAILURES`` tries before the supervisor gives up (exit 1);
- a worker that exits 0 on its own (``--burst``) is done, not restarted;
- with ``--reload``, a change to a ``.py`` file under the watched directories restarts every
  worker gracefully, and a worker that fails to start waits for the next change.

A worker learns it is supervised from its environment: ``SUPERVISOR_FD`` (a pipe on which it
writes one byte once ready) and ``SUPERVISOR_PID`` (it stops if that process goes away, so
that a supervisor killed with SIGKILL leaves no orphans behind).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from .format import error
from .parser import Parser

if TYPE_CHECKING:
    from .._worker.worker import Worker

logger = logging.getLogger("aioqueue.supervisor")

SUPERVISOR_FD = "AIOQUEUE_SUPERVISOR_FD"
SUPERVISOR_PID = "AIOQUEUE_SUPERVISOR_PID"
#: the first and the longest pause before a dead worker is started again
RESTART_BACKOFF = (0.5, 30.0)
#: seconds a worker must run for its slot's pause to start again from the first
STABLE_AFTER = 30.0
#: restarts of a slot in a row that may fail at startup before the supervisor gives up
MAX_START_FAILURES = 5
#: how often the supervisor looks at its workers, and a worker at its supervisor
TICK = 0.1
PARENT_CHECK = 1.0


@dataclass(slots=True)
class _Slot:
    """One of the N places a worker process runs in."""

    number: int
    popen: subprocess.Popen[bytes] | None = None
    ready_fd: int | None = None
    ready: bool = False
    #: a worker of this slot was ready once
    ever_ready: bool = False
    started: float = 0.0
    #: consecutive deaths: before ready (startup failures), and quick ones (for the backoff)
    start_failures: int = 0
    quick_deaths: int = 0
    restart_at: float | None = None
    #: nothing more to run here (exited 0, or stopped)
    done: bool = False
    #: under --reload: failed to start, waits for the next change
    waiting: bool = False
    stopping: bool = False
    pids: list[int] = field(default_factory=list)


class Supervisor:
    """Runs ``processes`` worker processes, each started with ``command(slot)``.

    Args:
        command: the worker command line for slot ``0..processes-1``.
        processes: how many worker processes run at once.
        watch: directories whose ``.py`` files restart the workers when they change
            (``--reload``; needs ``watchfiles``); empty: no reload.
    """

    def __init__(
        self,
        command: Callable[[int], list[str]],
        processes: int,
        watch: Sequence[Path] = (),
    ) -> None:
        self.command = command
        self.slots = [_Slot(i) for i in range(processes)]
        self.watch = list(watch)
        self._signals: list[int] = []
        self._forwarded = 0
        self._changed = threading.Event()
        self._stop_watching = threading.Event()
        self._exit_code = 0
        self._giving_up = False

    # ------------------------------------------------------------------ the loop
    def run(self) -> int:
        """Start the workers and supervise them until they all exited; the exit code."""
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        watcher = self._start_watcher() if self.watch else None
        try:
            logger.info("supervisor %d starting %d worker processes", os.getpid(), len(self.slots))
            for slot in self.slots:
                if not self._giving_up:
                    self._start(slot)
            while not self._finished():
                self._forward_signals()
                if self._changed.is_set():
                    self._changed.clear()
                    self._reload()
                self._wait_ready()
                for slot in self.slots:
                    self._check(slot)
                self._restart_due()
            return self._exit_code
        finally:
            self._stop_watching.set()
            if watcher is not None:
                watcher.join(5.0)
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _finished(self) -> bool:
        if any(s.popen is not None or not s.done for s in self.slots):
            return False
        # under --reload, a worker that failed to start waits for a change (or a signal)
        waiting = any(s.waiting for s in self.slots)
        return not waiting or bool(self._signals) or self._giving_up

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals.append(signum)

    def _forward_signals(self) -> None:
        while self._forwarded < len(self._signals):
            signum = self._signals[self._forwarded]
            self._forwarded += 1
            name = signal.Signals(signum).name
            if self._forwarded == 1:
                logger.info("%s: stopping the worker processes (again to force)", name)
            else:
                logger.warning("%s again: stopping the worker processes now", name)
            self._stop_all(signum)

    def _stop_all(self, signum: int = signal.SIGTERM) -> None:
        """Ask every worker to stop and start no more."""
        for slot in self.slots:
            slot.done = True
            slot.restart_at = None
            if slot.popen is not None and slot.popen.poll() is None:
                slot.stopping = True
                with contextlib.suppress(ProcessLookupError):
                    slot.popen.send_signal(signum)

    # ------------------------------------------------------------------ one slot
    def _start(self, slot: _Slot) -> None:
        read_fd, write_fd = os.pipe()
        env = dict(os.environ)
        env[SUPERVISOR_FD] = str(write_fd)
        env[SUPERVISOR_PID] = str(os.getpid())
        try:
            slot.popen = subprocess.Popen(
                self.command(slot.number),
                env=env,
                pass_fds=(write_fd,),
                stdin=subprocess.DEVNULL,
                process_group=0,  # a Ctrl-C reaches the workers once, through us
            )
        except OSError as exc:  # no process at all (no memory, too many processes)
            os.close(read_fd)
            error(f"cannot start a worker process: {exc}")
            slot.ready = False
            self._startup_failed(slot, 0, 1)
            return
        finally:
            os.close(write_fd)
        slot.ready_fd = read_fd
        slot.ready = slot.done = slot.stopping = slot.waiting = False
        slot.restart_at = None
        slot.started = time.monotonic()
        slot.pids.append(slot.popen.pid)
        logger.info("worker process %d started (pid %d)", slot.number + 1, slot.popen.pid)

    def _wait_ready(self) -> None:
        """Wait up to a tick for a worker to say it is ready, and note who did."""
        fds = {s.ready_fd: s for s in self.slots if s.ready_fd is not None}
        if not fds:
            time.sleep(TICK)
            return
        with contextlib.suppress(InterruptedError):
            readable, _, _ = select.select(list(fds), [], [], TICK)
            for fd in readable:
                slot = fds[fd]
                if os.read(fd, 1):
                    slot.ready = slot.ever_ready = True
                    slot.start_failures = 0
                self._close_ready(slot)

    def _close_ready(self, slot: _Slot) -> None:
        if slot.ready_fd is not None:
            os.close(slot.ready_fd)
            slot.ready_fd = None

    def _check(self, slot: _Slot) -> None:
        """Act on the exit of the slot's worker, if it exited."""
        if slot.popen is None or (code := slot.popen.poll()) is None:
            return
        if slot.ready_fd is not None and not slot.ready:
            self._wait_ready()  # a byte written just before it exited still counts
        self._close_ready(slot)
        pid, lived = slot.popen.pid, time.monotonic() - slot.started
        slot.popen = None
        number = slot.number + 1
        if slot.stopping:
            logger.info("worker process %d (pid %d) exited with %d", number, pid, code)
            # killed by the signal it was sent (it had no handler yet, or no more) is a stop
            if code not in (0, -signal.SIGTERM, -signal.SIGINT) and not self._giving_up:
                self._exit_code = 1
            if slot.done and not self._signals and not self._giving_up:
                self._start(slot)  # stopped for a reload
            return
        if code == 0:
            logger.info("worker process %d (pid %d) finished", number, pid)
            slot.done = True
            return
        if not slot.ready:
            self._startup_failed(slot, pid, code)
            return
        slot.quick_deaths = 0 if lived >= STABLE_AFTER else slot.quick_deaths + 1
        self._schedule_restart(slot, f"died unexpectedly ({_describe(code)})", pid)

    def _startup_failed(self, slot: _Slot, pid: int, code: int) -> None:
        number = slot.number + 1
        slot.start_failures += 1
        if self.watch:
            logger.error(
                "worker process %d (pid %d) failed to start (%s); waiting for a change",
                number,
                pid,
                _describe(code),
            )
            slot.done = slot.waiting = True
            return
        if not slot.ever_ready or slot.start_failures >= MAX_START_FAILURES:
            if slot.ever_ready:
                error(
                    f"worker process {number} failed to start "
                    f"{slot.start_failures} times in a row; giving up"
                )
            else:  # its own message says why
                logger.info("worker process %d (pid %d) failed to start", number, pid)
            self._exit_code = code if not slot.ever_ready and code > 0 else 1
            self._giving_up = True
            self._stop_all()
            return
        slot.quick_deaths += 1
        self._schedule_restart(slot, f"failed to start ({_describe(code)})", pid)

    def _schedule_restart(self, slot: _Slot, what: str, pid: int) -> None:
        first, longest = RESTART_BACKOFF
        pause = min(first * 2 ** max(slot.quick_deaths - 1, 0), longest)
        slot.restart_at = time.monotonic() + pause
        logger.warning(
            "worker process %d (pid %d) %s; restarting it in %.1f s",
            slot.number + 1,
            pid,
            what,
            pause,
        )

    def _restart_due(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.restart_at is not None and slot.restart_at <= now and not slot.done:
                self._start(slot)

    # ------------------------------------------------------------------ --reload
    def _start_watcher(self) -> threading.Thread:
        from watchfiles import PythonFilter, watch

        def loop() -> None:
            for changes in watch(
                *self.watch,
                watch_filter=PythonFilter(),
                stop_event=self._stop_watching,
                raise_interrupt=False,
            ):
                names = sorted({os.path.relpath(path) for _, path in changes})
                logger.info("changed: %s; restarting the worker processes", ", ".join(names))
                self._changed.set()

        thread = threading.Thread(target=loop, name="aioqueue-reload", daemon=True)
        thread.start()
        logger.info("watching %s for changes", ", ".join(str(p) for p in self.watch))
        return thread

    def _reload(self) -> None:
        """Stop every worker gracefully; each slot starts again once its worker exited."""
        if self._signals or self._giving_up:
            return
        for slot in self.slots:
            slot.done = True
            slot.restart_at = None
            if slot.popen is not None and slot.popen.poll() is None:
                slot.stopping = True
                slot.popen.send_signal(signal.SIGTERM)
            elif slot.popen is None:
                self._start(slot)


def _describe(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


# ---------------------------------------------------------------------- the worker's side
async def report_to_supervisor(ready: asyncio.Event, stop: Callable[[], None]) -> None:
    """In a supervised worker process: tell the supervisor once ``ready`` is set, then
    ``stop()`` the worker if the supervisor goes away. Returns at once when unsupervised."""
    fd, parent = os.environ.pop(SUPERVISOR_FD, None), os.environ.pop(SUPERVISOR_PID, None)
    if fd is None or parent is None:
        return
    try:
        await ready.wait()
        with contextlib.suppress(OSError):
            os.write(int(fd), b"1")
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.close(int(fd))
    while os.getppid() == int(parent):  # noqa: ASYNC110 - nothing to wait on but a poll
        await asyncio.sleep(PARENT_CHECK)
    logger.warning("the supervisor (pid %s) is gone; stopping", parent)
    stop()


# ---------------------------------------------------------------------- the command line
#: the ``worker`` options the supervisor handles itself (its workers do not get them)
_OWN = {"processes", "reload", "embedded", "health_port", "metrics_port"}


def supervise(
    worker_parser: Parser,
    args: argparse.Namespace,
    embedded_url: str | None,
    target: str,
) -> int:
    """Run ``python -m aioqueue worker`` as a supervisor of ``args.processes`` workers.

    Args:
        worker_parser: the ``worker`` command's parser, whose options are passed on.
        args: the parsed command line.
        embedded_url: the URL of the embedded server the supervisor started or found
            (``--embedded``), which the workers get as ``--url``.
        target: ``module:app``; with ``--reload``, its top-level package is watched.
    """
    base = worker_argv(worker_parser, args, _OWN)
    if embedded_url is not None:
        base[:0] = ["--url", embedded_url]

    def command(slot: int) -> list[str]:
        # options before ``base``: it ends with ``--`` and the positional module:app
        own = [] if args.health_port is None else ["--health-port", str(args.health_port + slot)]
        if args.metrics_port is not None:
            own += ["--metrics-port", str(args.metrics_port + slot)]
        return [sys.executable, "-m", "aioqueue", "worker", *own, *base]

    watch = [app_directory(target)] if args.reload else []
    return Supervisor(command, args.processes, watch).run()


def worker_argv(parser: Parser, args: argparse.Namespace, skip: set[str]) -> list[str]:
    """The options in ``args`` of ``parser``'s, but those in ``skip``, as a command line."""
    options: list[str] = []
    positional: list[str] = []
    for action in parser.options:
        if action.dest in skip or action.dest in ("help", "version"):
            continue
        value = getattr(args, action.dest, None)
        if not action.option_strings:
            positional.append(str(value))
        elif value is None or value is False or value == action.default:
            continue
        elif action.nargs == 0:  # a flag
            options.append(action.option_strings[-1])
        elif isinstance(value, list):
            for item in value:
                options += [action.option_strings[-1], str(item)]
        else:
            options += [action.option_strings[-1], str(value)]
    return [*options, "--", *positional]


def app_directory(target: str) -> Path:
    """The directory ``--reload`` watches for ``module:app``: its top-level package's, or
    the module's own directory (the App was imported already)."""
    module = target.partition(":")[0] if ":" in target else target.rpartition(".")[0]
    top = sys.modules[module.split(".")[0]]
    return Path(top.__file__ or ".").resolve().parent


def stop_on_signals(worker: Worker) -> None:
    """In a worker process: SIGTERM or SIGINT stops the worker (its grace period applies); a
    second one forces (logged as the command line's)."""
    signals = 0
    logger = logging.getLogger("aioqueue.cli")

    def on_signal(signame: str) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            logger.info("%s: stopping (again to force)", signame)
            worker.stop()
        else:
            logger.warning("%s again: stopping now", signame)
            worker.stop(force=True)

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig.name)
