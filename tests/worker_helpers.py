"""Helpers for the worker tests.

- ``WorkerProcesses``: real ``python -m aioqueue worker tests.workerapp:app`` processes, each
  with its own log file and client name; whatever is still running is killed at teardown;
- ``instrument`` / ``Gate``: hold a worker at one await point of the job path (before or after
  a script really runs on the server), so a test can cancel it exactly there;
- ``check_queue``: every job of a queue in exactly one state, in agreement with the lanes;
- ``server_ms``, ``blocked_in``, ``run_records``, ``side_effects``: what the server and the
  tasks of ``tests.workerapp`` saw;
- ``retrying``: redis-py options for the tests' own raw clients in fault tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from aioqueue import App, Worker
from aioqueue._keys import QueueKeys
from aioqueue._scripts import QueueScripts

from .helpers import wait_until
from .store_checks import blocked_in as blocked_in  # re-exported for the worker tests
from .workerapp import done_key, runs_key, starts_key

REPO_ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------- the server's view
def retrying() -> dict[str, Any]:
    """redis-py options for the tests' own raw clients in fault tests (Apps retry by
    themselves): retry a command on a fresh connection after the server closed one."""
    return {"retry": Retry(NoBackoff(), 2), "retry_on_error": [rexc.ConnectionError]}


async def server_ms(redis: Redis) -> int:
    """The server's clock in epoch milliseconds (the clock scripts judge leases by)."""
    sec, usec = await redis.time()
    return int(sec) * 1000 + int(usec) // 1000


async def connections_named(redis: Redis, name: str) -> list[dict[str, str]]:
    """The server's view (``CLIENT LIST``) of the connections called ``name``."""
    return [c for c in await redis.client_list() if c.get("name") == name]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class JobRecord:
    """The stored state of one job, as ``check_queue`` found it."""

    state: str
    attempts: int
    lease_deadline_ms: int | None  # active jobs: when their lease runs out


async def check_queue(redis: Redis, keys: QueueKeys) -> dict[str, JobRecord]:
    """Assert that every job of a quiescent queue is in exactly one state, and return them.

    A queued job is in exactly one lane (``ready``/``prio`` without a group, its group's lane
    otherwise), a scheduled one in ``scheduled``, an active one in ``active`` with a lease
    token and a lease deadline (so maintenance hands it back if nobody renews it), a
    failed one in ``dead``, a completed one in none of them; no lane names a job that is not in
    its state.
    """
    lanes: dict[str, list[str]] = {
        "ready": [_text(m) for m in await redis.lrange(keys.ready, 0, -1)]
    }
    scores: dict[str, dict[str, float]] = {}
    for name in ("prio", "scheduled", "active", "dead"):
        pairs = await redis.zrange(getattr(keys, name), 0, -1, withscores=True)
        scores[name] = {_text(p[0]): float(p[1]) for p in pairs}
        lanes[name] = list(scores[name])
    prefix = keys.base + "job:"
    ids = [_text(k)[len(prefix) :] async for k in redis.scan_iter(match=prefix + "*", count=1000)]
    records: dict[str, JobRecord] = {}
    where: dict[str, list[str]] = {}
    for name, members in lanes.items():
        for job_id in members:
            where.setdefault(job_id, []).append(name)
    for job_id in ids:
        raw: list[Any] = await redis.hmget(keys.job(job_id), ["s", "a", "l", "pr", "g"])
        if raw[0] is None:
            continue  # expired between SCAN and HMGET
        state, attempts, lease, pr, group = [None if v is None else _text(v) for v in raw]
        assert state is not None
        found = where.pop(job_id, [])
        deadline = None
        if state == "queued":
            if group:
                in_lane = await redis.zscore(keys.base + "g:" + group, job_id) is not None
                assert in_lane, f"queued job {job_id} is not in the lane of group {group}"
                assert not found, f"queued job {job_id} of group {group} is also in {found}"
            else:
                home = "ready" if int(pr or 0) == 0 else "prio"
                assert found == [home], f"queued job {job_id} (priority {pr}) is in {found}"
        elif state == "scheduled":
            assert found == ["scheduled"], f"scheduled job {job_id} is in {found}"
        elif state == "active":
            assert found == ["active"], f"active job {job_id} is in {found}"
            deadline = int(scores["active"][job_id])
        elif state == "failed":
            assert found == ["dead"], f"failed job {job_id} is in {found}"
        else:
            assert state in ("completed", "cancelled"), f"job {job_id}: unknown state {state}"
            assert not found, f"{state} job {job_id} is still in {found}"
        if state == "active":
            assert lease is not None, f"active job {job_id} holds no lease token"
        records[job_id] = JobRecord(state, int(attempts or 0), deadline)
    # what is left names jobs without a record: only expired dead letters may do that
    for job_id, names in where.items():
        assert names == ["dead"], f"{names} hold job {job_id}, which has no record"
    return records


# ---------------------------------------------------------------------- instrumented scripts
class Gate:
    """Holds one script call of a worker until ``open()``.

    Args:
        after: hold the caller after the script ran on the server (its reply not yet
            delivered), rather than before it is sent.
        skip: let this many calls through before holding one.
        swallow: if the held caller is cancelled, run the script and return its reply as if
            nothing happened, as redis-py's send (``asyncio.wait_for``) does on Python 3.11
            when a cancellation lands just as the send completes.
    """

    def __init__(self, *, after: bool = False, skip: int = 0, swallow: bool = False) -> None:
        self.after = after
        self.skip = skip
        self.swallow = swallow
        self.used = False
        self.holder: str | None = None  # the script whose call is held
        self.entered = asyncio.Event()
        self.opened = asyncio.Event()

    def open(self) -> None:
        self.opened.set()


class InstrumentedScripts(QueueScripts):
    """The real scripts of one queue, counting calls and optionally holding one at a Gate."""

    def __init__(self, client: Redis, keys: QueueKeys) -> None:
        super().__init__(client, keys)
        self.gates: dict[str, Gate] = {}
        self.calls: Counter[str] = Counter()
        self.claimed: list[int] = []  # jobs leased per claim (or complete_claim) call

    async def _through(self, name: str, call: Callable[[], Awaitable[Any]]) -> Any:
        self.calls[name] += 1
        gate = self.gates.get(name)
        if gate is None or gate.used:
            return await call()
        if gate.skip > 0:
            gate.skip -= 1
            return await call()
        gate.used = True
        gate.holder = name
        if gate.after:
            result = await call()
            gate.entered.set()
            await gate.opened.wait()
            return result
        gate.entered.set()
        try:
            await gate.opened.wait()
        except asyncio.CancelledError:
            if not gate.swallow:
                raise
        return await call()

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        async def call() -> Any:
            res = await QueueScripts.claim(self, *args, **kwargs)
            self.claimed.append(len(res.jobs))
            return res

        return await self._through("claim", call)

    async def complete_claim(self, *args: Any, **kwargs: Any) -> Any:
        async def call() -> Any:
            res = await QueueScripts.complete_claim(self, *args, **kwargs)
            self.claimed.append(len(res[0].jobs))
            return res

        return await self._through("complete_claim", call)

    async def complete(self, *args: Any, **kwargs: Any) -> Any:
        return await self._through("complete", lambda: QueueScripts.complete(self, *args, **kwargs))

    async def fail(self, *args: Any, **kwargs: Any) -> Any:
        return await self._through("fail", lambda: QueueScripts.fail(self, *args, **kwargs))

    async def release(self, *args: Any, **kwargs: Any) -> Any:
        return await self._through("release", lambda: QueueScripts.release(self, *args, **kwargs))

    async def extend(self, *args: Any, **kwargs: Any) -> Any:
        return await self._through("extend", lambda: QueueScripts.extend(self, *args, **kwargs))

    async def reap(self, *args: Any, **kwargs: Any) -> Any:
        return await self._through("reap", lambda: QueueScripts.reap(self, *args, **kwargs))


def stopping(worker: Worker) -> bool:
    """Whether the worker has begun to shut down (its own flag; no public signal exists)."""
    return bool(worker._stopping)


def instrument(app: App, queue: str | None = None) -> InstrumentedScripts:
    """Make the queue's scripts (used by every Worker started afterwards) instrumented."""
    q = app.queue(queue)
    scripts = InstrumentedScripts(app.redis, q._keys)
    q._scripts_obj = scripts
    return scripts


# ---------------------------------------------------------------------- worker processes
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
        {_text(k): int(v) for k, v in starts.items()},
        {_text(k): int(v) for k, v in done.items()},
    )


@dataclass(slots=True)
class WorkerProcess:
    """One worker process: its Popen, its client name and its log file."""

    popen: subprocess.Popen[bytes]
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
        args = [sys.executable, "-m", "aioqueue", "worker", self.app]
        args += ["--url", self.url, "--concurrency", str(concurrency), "--grace", str(grace)]
        args += ["--log-level", "INFO", *extra]
        with log.open("wb") as out:
            popen = subprocess.Popen(
                args, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )
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
