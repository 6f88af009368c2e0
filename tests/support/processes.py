"""Real worker processes, and what the tasks of ``tests.workerapp`` recorded.

- ``WorkerProcesses``: real ``python -m aioqueue worker tests.workerapp:app`` processes (or
  another test app configured by the same environment), each with its own log file and client
  name; whatever is still running is killed at teardown;
- ``run_records``, ``side_effects``: the job starts and finished bodies the tasks recorded.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from redis.asyncio import Redis

from ..workerapp import done_key, runs_key, starts_key
from .prewarmed import spawn_aioqueue
from .server import blocked_in, text
from .waiting import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One start of a job body in a worker process (from ``tests.workerapp``)."""

    id: str
    attempt: int
    pid: int
    tag: str
    ms: int


async def run_records(redis: Redis, prefix: str) -> list[RunRecord]:
    """Every job start recorded by the tasks of ``tests.workerapp``, in order."""
    raw = await redis.lrange(runs_key(prefix), 0, -1)
    return [RunRecord(**json.loads(r)) for r in raw]


async def side_effects(redis: Redis, prefix: str) -> tuple[dict[str, int], dict[str, int]]:
    """(starts, finished bodies) per job id, as recorded by the tasks of ``tests.workerapp``."""
    starts = await redis.hgetall(starts_key(prefix))
    done = await redis.hgetall(done_key(prefix))
    return (
        {text(k): int(v) for k, v in starts.items()},
        {text(k): int(v) for k, v in done.items()},
    )


class Process(Protocol):
    """What the tests use of a process: ``subprocess.Popen``'s, or a prewarmed fork's."""

    @property
    def pid(self) -> int: ...
    @property
    def returncode(self) -> int | Any: ...
    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def kill(self) -> None: ...


@dataclass(slots=True)
class WorkerProcess:
    """One worker process (forked from a prewarmed process: tests/support/prewarmed.py), its
    client name and its log file."""

    popen: Process
    name: str
    log: Path
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def signal(self, sig: signal.Signals = signal.SIGTERM) -> None:
        self.popen.send_signal(sig)

    async def wait_exit(self, timeout: float) -> int:
        """Wait (bounded) for the process to exit; return its exit code."""
        await wait_until(
            lambda: self.popen.poll() is not None,
            timeout=timeout,
            interval=0.01,
            what=f"worker {self.name} (pid {self.pid}) to exit; log:\n{self.log_text()[-3000:]}",
        )
        code = self.popen.returncode
        assert code is not None
        return code

    async def wait_log(self, text: str, timeout: float = 10.0) -> None:
        """Wait (bounded) until the worker's log contains ``text``."""
        await wait_until(
            lambda: text in self.log_text(),
            timeout=timeout,
            what=f"{text!r} in the log of worker {self.name}:\n{self.log_text()[-3000:]}",
        )


class WorkerProcesses:
    """Starts worker processes of ``app`` (``tests.workerapp`` by default, or another test app
    configured by the same environment variables); ``close()`` kills any still running."""

    def __init__(
        self,
        log_dir: Path,
        url: str,
        prefix: str,
        lease: float = 30.0,
        app: str = "tests.workerapp:app",
    ) -> None:
        self.log_dir = log_dir
        self.url = url
        self.prefix = prefix
        self.lease = lease
        self.app = app
        self.procs: list[WorkerProcess] = []

    def start(
        self,
        *,
        lease: float | None = None,
        concurrency: int = 4,
        grace: float = 10.0,
        extra: tuple[str, ...] = (),
    ) -> WorkerProcess:
        """Start a worker process (lease: the App's, in seconds; default the one given here)."""
        n = len(self.procs) + 1
        name = f"{self.prefix}-w{n}"
        log = self.log_dir / f"worker{n}.log"
        env = dict(os.environ)
        env.update(
            AIOQUEUE_REDIS_URL=self.url,
            AIOQUEUE_TEST_PREFIX=self.prefix,
            AIOQUEUE_TEST_LEASE=str(self.lease if lease is None else lease),
            AIOQUEUE_TEST_NAME=name,
        )
        args = ["worker", self.app]
        args += ["--url", self.url, "--concurrency", str(concurrency), "--grace", str(grace)]
        args += ["--log-level", "INFO", *extra]
        popen = spawn_aioqueue(args, cwd=REPO_ROOT, env=env, log=log)
        proc = WorkerProcess(popen, name, log)
        self.procs.append(proc)
        return proc

    async def wait_idle(self, redis: Redis, *procs: WorkerProcess, timeout: float = 15.0) -> None:
        """Wait until each worker is up and blocked on the server waiting for work."""
        for proc in procs:

            async def idle(p: WorkerProcess = proc) -> bool:
                assert p.popen.poll() is None, f"worker {p.name} exited:\n{p.log_text()}"
                return await blocked_in(redis, p.name)

            await wait_until(idle, timeout=timeout, what=f"worker {proc.name} to block idle")

    def kill(self, proc: WorkerProcess) -> None:
        """SIGKILL: no shutdown, no acks, no release."""
        proc.popen.kill()
        proc.popen.wait(10)

    def by_pid(self, pid: int) -> WorkerProcess:
        return next(p for p in self.procs if p.pid == pid)

    def close(self) -> None:
        """Kill every worker still running (SIGKILL) and reap them all."""
        for proc in self.procs:
            if proc.popen.poll() is None:
                proc.popen.kill()
            proc.popen.wait(10)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} (pid {p.pid}):\n{p.log_text()}" for p in self.procs)


@contextlib.contextmanager
def worker_processes(
    log_dir: Path, url: str, prefix: str, **options: Any
) -> Iterator[WorkerProcesses]:
    """``WorkerProcesses`` for a fixture: killed at the end, their logs printed (shown when
    the test failed). ``options``: ``lease``, ``app``."""
    procs = WorkerProcesses(log_dir, url, prefix, **options)
    try:
        yield procs
    finally:
        procs.close()
        print(procs.logs())
