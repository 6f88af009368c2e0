"""The App the chaos soak runs in real worker processes::

    python -m aioqueue worker tests.chaos.chaosapp:app --url URL ...

Configured by environment variables, read at import:

- ``AIOQUEUE_REDIS_URL``: the server (the CLI's ``--url`` overrides it);
- ``CHAOS_PREFIX``: the key prefix of the soak run;
- ``CHAOS_LEASE``, ``CHAOS_RESULT_TTL``, ``CHAOS_DEAD_TTL``: seconds;
- ``CHAOS_CLIENT_NAME``: the client name of this worker's connections, which the soak picks
  its ``CLIENT KILL`` victims by.

Workflows (``register_workflows``; docs/workflows.md) run on the queues ``WF_QUEUES``: their
tasks record, under ``<prefix>:fx:wf*`` (``WfKeys``), each run's start, each execution of a
durable step's function and each time a step returned (its result recorded by then), the
moment a parent's wait for its children returned, and what each sink's callback saw.

Every task body records, under ``<prefix>:fx:*``, its start and (as its very last step, the
"side effect") its end, each as a hash field ``<job id>|<nonce>`` whose value is
``<the worker's pid>:<wall-clock ms of the run's start>`` (the soak places runs beside its
server outages by that time). The nonce is drawn once per run, so a write that the client
sends again after a lost reply (a killed connection) cannot count twice: a plain ``HINCRBY``
could, and would report a duplicate run that never happened. These writes go through a client
of their own, which retries through connection kills and the server restart: the bookkeeping is
the measuring instrument, not the thing under test.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any, cast

import redis.exceptions as rexc
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from aioqueue import App, Backoff, Task, current_job

PREFIX = os.environ.get("CHAOS_PREFIX", "chaos")
POISON_EXIT = 86  # the exit code of a worker killed by a poison job

app = App(
    prefix=PREFIX,
    lease=float(os.environ.get("CHAOS_LEASE", "3")),
    result_ttl=float(os.environ.get("CHAOS_RESULT_TTL", "60")),
    dead_ttl=float(os.environ.get("CHAOS_DEAD_TTL", "60")),
    max_attempts=25,  # a job may meet many kills; only poison and doomed jobs should die
    backoff=Backoff(base=0.05, factor=2.0, max=0.5, jitter=0.5),
    redis_options=(
        {"client_name": os.environ["CHAOS_CLIENT_NAME"]}
        if os.environ.get("CHAOS_CLIENT_NAME")
        else None
    ),
)


def started_key(prefix: str) -> str:
    """HASH ``<job id>|<nonce>`` -> pid: one field per started run of a job body."""
    return f"{prefix}:fx:started"


def done_key(prefix: str) -> str:
    """HASH ``<job id>|<nonce>`` -> pid: one field per run that reached its side effect."""
    return f"{prefix}:fx:done"


_fx: Redis | None = None


def _bookkeeper() -> Redis:
    global _fx
    if _fx is None and app.url.startswith("redis+cluster://"):  # (the soak's --cluster)
        host, _, port = app.url.partition("://")[2].split(",")[0].rpartition(":")
        cluster = RedisCluster(
            host=host,
            port=int(port),
            client_name="chaos-fx",
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.02), 60),
            retry_on_error=[rexc.ConnectionError, rexc.TimeoutError],
            socket_connect_timeout=2,
        )
        _fx = cast(Redis, cluster)
    if _fx is None:
        _fx = Redis.from_url(
            app.url,
            client_name="chaos-fx",
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.02), 60),
            retry_on_error=[rexc.ConnectionError, rexc.TimeoutError],
            socket_connect_timeout=2,
        )
    return _fx


async def _record(key: str, field: str, started_ms: int) -> None:
    """HSET ``field`` to ``<pid>:<started_ms>`` under ``key`` (see ``_write``)."""
    await _write(key, field, f"{os.getpid()}:{started_ms}")


async def _write(key: str, field: str, value: str) -> None:
    # idempotent (HSET of a unique field), so a resend after a lost reply is harmless; sent
    # again on any error: redis-py's cluster client can fail a command with an internal
    # error (a connection closed under it) while a failover goes on, and the soak counts
    # the job's side effects, not the bookkeeper's
    for attempt in range(40):
        try:
            await _bookkeeper().hset(key, field, value)
            return
        except Exception:
            if attempt == 39:
                raise
            await asyncio.sleep(0.05)


async def _body(ms: int) -> tuple[str, int]:
    job = current_job()
    field = f"{job.id}|{uuid.uuid4().hex[:10]}"
    started_ms = time.time_ns() // 1_000_000
    await _record(started_key(PREFIX), field, started_ms)
    if ms > 0:
        await asyncio.sleep(ms / 1000)
    return field, started_ms


@app.task
async def work(i: int, ms: int = 0) -> int:
    """Run for ``ms`` milliseconds, then record the side effect."""
    field, started_ms = await _body(ms)
    await _record(done_key(PREFIX), field, started_ms)
    return i


@app.task
async def flaky(i: int, ms: int = 0) -> int:
    """Fail the first attempt (before the side effect), succeed on the next."""
    field, started_ms = await _body(ms)
    if current_job().attempt == 1:
        raise RuntimeError(f"flaky job {i} fails its first attempt")
    await _record(done_key(PREFIX), field, started_ms)
    return i


@app.task(max_attempts=2)
async def doomed(i: int) -> None:
    """Always raise: dead-lettered after two attempts, with the error."""
    await _body(0)
    raise ValueError(f"doomed job {i} always fails")


@app.task(max_attempts=3)
async def poison(i: int) -> None:
    """Kill the worker process running it: dead-lettered (LeaseExpired) after three."""
    await _body(0)
    os._exit(POISON_EXIT)


# ---------------------------------------------------------------------- workflows (issue 27)
#: the queues of the soak's workflows: a workflow's record and most steps on the first, some
#: fan-out steps on the second (on a cluster, another slot: the outbox carries the edges)
WF_QUEUES = ("wf", "wf2")
#: the result retention of workflow jobs (seconds; wfsoak.RESULT_TTL)
WF_RESULT_TTL = 20.0


@dataclass(frozen=True, slots=True)
class WfKeys:
    """Where the workflow tasks of a run (by its key prefix) record what they did. Each is a
    HASH whose fields end in ``|<nonce>`` (one per run or execution: a write resent after a
    lost reply cannot count twice) and whose values are ``<pid>:<wall-clock ms>``."""

    prefix: str

    @property
    def run(self) -> str:
        """``<job id>|<nonce>``: a run of a workflow task's body began."""
        return f"{self.prefix}:fx:wfrun"

    @property
    def execd(self) -> str:
        """``<job id>|<step>|<nonce>``: a durable step's function ran (began)."""
        return f"{self.prefix}:fx:wfexec"

    @property
    def recorded(self) -> str:
        """``<job id>|<step>|<nonce>``: ``ctx.step`` returned: its result was recorded."""
        return f"{self.prefix}:fx:wfrec"

    @property
    def passed(self) -> str:
        """``<job id>|<nonce>``: a parent's ``wait_for_children`` returned its results."""
        return f"{self.prefix}:fx:wfpass"

    @property
    def sink(self) -> str:
        """``<job id>|<results seen>|<nonce>``: a sink's callback returned."""
        return f"{self.prefix}:fx:wfsink"

    def all(self) -> tuple[str, ...]:
        return (self.run, self.execd, self.recorded, self.passed, self.sink)


@dataclass(frozen=True, slots=True)
class WfTasks:
    """The workflow tasks, registered on an App (the workers' and the soak's producer)."""

    start: Task[[int, float], int]
    node: Task[[int, int, int], int]
    waiter: Task[[int, str], Any]
    parent: Task[[int, int], int]
    child: Task[[int], int]
    sink: Task[[int], int]


def _nonce() -> str:
    return uuid.uuid4().hex[:10]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def register_workflows(app: App) -> WfTasks:
    """Register the soak's workflow tasks on ``app`` (prefix ``app.prefix``)."""
    keys = WfKeys(app.prefix)

    async def begin() -> None:
        await _record(keys.run, f"{current_job().id}|{_nonce()}", _now_ms())

    async def effect(name: str, value: Any, ms: int) -> Any:
        """A durable step's function, ``ms`` long: its execution is what must happen once (a
        worker killed during it leaves the step unrecorded: it runs again)."""
        await _record(keys.execd, f"{current_job().id}|{name}|{_nonce()}", _now_ms())
        if ms:
            await asyncio.sleep(ms / 1000)
        return value

    async def step(name: str, value: Any, ms: int = 0) -> Any:
        ctx = current_job()
        out = await ctx.step(name, effect, name, value, ms)
        await _record(keys.recorded, f"{ctx.id}|{name}|{_nonce()}", _now_ms())
        return out

    @app.task(name="wf_start", queue=WF_QUEUES[0])
    async def start(k: int, sleep_s: float) -> int:
        """The first step: a durable step, a durable sleep (parked), another step."""
        await begin()
        await step("plan", k)
        await current_job().sleep(sleep_s)
        return int(await step("go", k))

    @app.task(name="wf_node", queue=WF_QUEUES[0])
    async def node(k: int, i: int, ms: int) -> int:
        """A fan-out step: two durable steps, the first ``ms / 2`` long, then ``ms / 2`` of
        work between them (so that the soak's kills land in a step and between steps)."""
        await begin()
        a = await step("a", i, ms // 2)
        if ms:
            await asyncio.sleep(ms / 2000)
        return int(a) + int(await step("b", 10 * i))

    @app.task(name="wf_waiter", queue=WF_QUEUES[0])
    async def waiter(k: int, event: str) -> Any:
        """A step, a wait for the soak's signal ``event`` (parked), a step with its payload."""
        await begin()
        await step("before", k)
        payload = await current_job().wait_for_event(event, timeout=3600)
        return await step("after", payload)

    @app.task(name="wf_child", queue=WF_QUEUES[0])
    async def child(i: int) -> int:
        await begin()
        return int(await step("c", i))

    @app.task(name="wf_parent", queue=WF_QUEUES[0])
    async def parent(k: int, n: int) -> int:
        """Spawns ``n`` children (ids derived from its own) and waits for them, parked."""
        await begin()
        job = current_job()
        children = [
            await child.options(job_id=f"{job.id}.c{i}", result_ttl=WF_RESULT_TTL).enqueue(i)
            for i in range(n)
        ]
        results = await job.wait_for_children(children)
        await _record(keys.passed, f"{job.id}|{_nonce()}", _now_ms())
        return sum(results.values())

    @app.task(name="wf_sink", queue=WF_QUEUES[0])
    async def sink(k: int) -> int:
        """The fan-in: its callback (a durable step) gets every result it waited for."""
        await begin()
        job = current_job()
        results = await job.dependency_results()
        n = int(await step("callback", len(results)))
        await _record(keys.sink, f"{job.id}|{n}|{_nonce()}", _now_ms())
        return n

    return WfTasks(start, node, waiter, parent, child, sink)


wf_tasks = register_workflows(app)
