"""Workers against a misbehaving server: idle connections closed by the server, connections
killed under load, the server restarted (AOF) under idle and busy workers.

Each test has a private server (``fresh_server``) it can reconfigure and restart. What must
hold: no job lost, none completed twice in the store, bodies re-run only where a connection
died under them, and workers back at work within a bounded time. The tests' raw admin
client retries a command on a connection the server closed; every App is as users get it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from redis.asyncio import Redis

from aioqueue import App, Backoff, EmbeddedServer, Worker, current_job

from .support.invariants import check_records
from .support.processes import WorkerProcesses, side_effects
from .support.server import clients_named, retrying, server_ms
from .support.waiting import wait_until


def unique(label: str = "t") -> str:
    return f"{label}{uuid4().hex[:12]}"


@contextlib.asynccontextmanager
async def named_app(url: str, **options: Any) -> AsyncIterator[tuple[App, str]]:
    """An open App (unique prefix) whose connections carry a unique client name."""
    name = unique("c")
    async with App(url, prefix=unique(), redis_options={"client_name": name}, **options) as app:
        yield app, name


@pytest.fixture
async def admin(fresh_server: EmbeddedServer) -> AsyncIterator[Redis]:
    client = Redis.from_url(fresh_server.url, **retrying())
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def prefix() -> str:
    return unique()


@pytest.fixture
def workers(tmp_path: Path, fresh_server: EmbeddedServer, prefix: str) -> Iterator[WorkerProcesses]:
    procs = WorkerProcesses(tmp_path, fresh_server.url, prefix)
    try:
        yield procs
    finally:
        procs.close()
        print(procs.logs())  # shown when the test failed


async def stats(admin: Redis, app: App) -> dict[str, int]:
    raw: dict[Any, Any] = await admin.hgetall(app.queue()._keys.stats)
    return {k.decode(): int(v) for k, v in raw.items()}


@contextlib.asynccontextmanager
async def producer_for(app: App) -> AsyncIterator[App]:
    """Another App on the same server and prefix, for the test's own enqueues."""
    async with App(app.url, prefix=app.prefix) as producer:
        yield producer


# ---------------------------------------------------------------------- (1) idle timeout
async def test_server_closing_idle_connections_does_not_stall_the_worker(
    fresh_server: EmbeddedServer, admin: Redis
) -> None:
    async with named_app(fresh_server.url) as (app, name), producer_for(app) as producer:
        started: dict[str, float] = {}

        @app.task
        async def work(i: int) -> int:
            job = current_job()
            started[job.id] = time.perf_counter()
            await asyncio.sleep(0.01)
            await job.app.redis.incr(f"{job.app.prefix}:touched")  # a pooled connection
            return i

        async with Worker(app, concurrency=10, grace=2):
            # a burst leaves several connections in the worker's pool, idle afterwards
            burst = await work.enqueue_many([{"i": i} for i in range(30)])
            assert [await j.result(timeout=30) for j in burst] == list(range(30))
            await admin.config_set("timeout", 1)

            async def only_busy_left() -> bool:
                # blocked (the idle worker's wait) and pub/sub connections are never timed out
                conns = await clients_named(admin, name)
                return all("b" in c["flags"] or "P" in c["flags"] for c in conns)

            latencies = []
            for i in range(3):
                await wait_until(only_busy_left, timeout=30, what="the server to drop idle ones")
                t0 = time.perf_counter()
                job = await producer.queue().enqueue("work", args=[100 + i])
                # a backstop: the pickup's bound is the latency asserted below
                assert await job.result(timeout=30) == 100 + i
                latencies.append(round((started[job.id] - t0) * 1000, 1))
        print(f"\npickup after the server closed idle connections, ms: {latencies}")
        assert all(ms < 500 for ms in latencies), latencies
        counters = await stats(admin, app)
        assert counters["completed"] == 33
        # no job failed for meeting a connection the server had closed
        assert counters.get("failed", 0) == counters.get("retried", 0) == 0
        assert int(await admin.get(f"{app.prefix}:touched") or 0) == 33


async def test_enqueue_after_the_server_closed_idle_connections(
    fresh_server: EmbeddedServer, admin: Redis
) -> None:
    async with named_app(fresh_server.url) as (app, name):
        await app.queue().enqueue("anything")
        await admin.config_set("timeout", 1)
        await wait_until(
            lambda: _none(clients_named(admin, name)), timeout=30, what="idle ones to close"
        )
        await app.queue().enqueue("anything")  # on a connection the server closed
        assert (await stats(admin, app))["enqueued"] == 2


async def _none(value: Any) -> bool:
    return not await value


# ---------------------------------------------------------------------- (2) killed connections
async def test_killed_connections_lose_no_job_and_complete_none_twice(
    fresh_server: EmbeddedServer, admin: Redis
) -> None:
    n = 300
    options: dict[str, Any] = {"lease": 1.0, "max_attempts": 20}
    options["backoff"] = Backoff(base=0.02, max=0.2, jitter=0.0)
    async with named_app(fresh_server.url, **options) as (app, _):
        finished: Counter[str] = Counter()

        @app.task
        async def work(i: int) -> int:
            await asyncio.sleep(0.01)
            finished[current_job().id] += 1
            return i

        jobs = await work.enqueue_many([{"i": i} for i in range(n)])
        kills = 0
        t0 = time.monotonic()
        async with Worker(app, concurrency=10, grace=5):

            async def kill_until_done() -> bool:
                nonlocal kills
                if (await stats(admin, app)).get("completed", 0) >= n:
                    return True
                if kills < 40:
                    await admin.client_kill_filter(_type="normal")  # all but this one
                    kills += 1
                return False

            await wait_until(kill_until_done, timeout=40, interval=0.05, what="all jobs done")
        elapsed = time.monotonic() - t0
        duplicates = sum(finished.values()) - n
        counters = await stats(admin, app)
        print(
            f"\n{n} jobs under {kills} CLIENT KILLs: {elapsed:.2f} s, {duplicates} bodies run "
            f"twice, {counters.get('expired', 0)} leases expired, "
            f"{counters.get('retried', 0)} retries"
        )
        assert set(finished) == {j.id for j in jobs}
        assert duplicates <= kills
        assert counters["completed"] == n  # each completed exactly once in the store
        records = await check_records(admin, app.queue()._keys)
        assert Counter(r.state for r in records.values()) == {"completed": n}


# ---------------------------------------------------------------------- (3) server restart
async def test_restart_while_workers_block_idle(
    fresh_server: EmbeddedServer, admin: Redis, workers: WorkerProcesses, prefix: str
) -> None:
    procs = [workers.start(), workers.start()]
    await workers.wait_idle(admin, *procs)
    async with App(fresh_server.url, prefix=prefix) as producer:
        await asyncio.to_thread(fresh_server.restart)
        restarted_ms = await server_ms(admin)
        # back blocked on the new server within a bounded time (no wait hangs on the old
        # connection), then a job runs at once
        await workers.wait_idle(admin, *procs, timeout=10)
        back_ms = await server_ms(admin)
        t0 = time.perf_counter()
        job = await producer.queue().enqueue(
            "record", kwargs={"tag": "after restart"}, max_attempts=20
        )
        assert await job.result(timeout=5) in {p.pid for p in procs}
        done_s = time.perf_counter() - t0
        print(
            f"\nidle workers blocked again {back_ms - restarted_ms} ms after the restart; "
            f"the next job done {done_s * 1000:.0f} ms after its enqueue"
        )
        assert back_ms - restarted_ms < 5000
        assert done_s < 2
        assert all(p.popen.poll() is None for p in procs)


async def test_restart_while_workers_run_jobs(
    fresh_server: EmbeddedServer, admin: Redis, workers: WorkerProcesses, prefix: str
) -> None:
    n = 200
    # a claim whose reply the restart cut off, or a failure that could not be recorded, leaves
    # its job leased to nobody until the lease runs out: keep that short. Jobs whose own Redis
    # calls meet the restart fail, spending attempts: allow plenty
    lease = 2.0
    procs = [workers.start(concurrency=10, lease=lease), workers.start(concurrency=10, lease=lease)]
    await workers.wait_idle(admin, *procs)
    async with App(fresh_server.url, prefix=prefix) as producer:
        jobs = [
            await producer.queue().enqueue(
                "record", kwargs={"tag": str(i), "duration": 0.02}, max_attempts=20
            )
            for i in range(n)
        ]

        async def done_count() -> int:
            return len((await side_effects(admin, prefix))[1])

        for target in (n // 4, n // 2):  # two restarts, each in the middle of the stream
            await wait_until(lambda t=target: _at_least(done_count(), t), timeout=20)  # type: ignore[misc]
            await asyncio.to_thread(fresh_server.restart)

        async def all_completed() -> bool:
            return (await stats(admin, producer)).get("completed", 0) >= n

        await wait_until(all_completed, timeout=30, what="every job to complete")
        starts, done = await side_effects(admin, prefix)
        counters = await stats(admin, producer)
        duplicates = sum(done.values()) - n
        print(
            f"\n{n} jobs, 2 restarts: {sum(starts.values()) - n} extra starts, {duplicates} "
            f"bodies finished twice, {counters.get('retried', 0)} retries, "
            f"{counters.get('expired', 0)} leases expired"
        )
        assert set(done) == {j.id for j in jobs}  # none lost
        assert counters["completed"] == n  # none completed twice in the store
        # a body re-runs only if its own side effect met the restart
        assert duplicates <= 2 * 20
        records = await check_records(admin, producer.queue()._keys)
        assert Counter(r.state for r in records.values()) == {"completed": n}
        assert all(p.popen.poll() is None for p in procs)


async def _at_least(value: Any, n: int) -> bool:
    return bool(await value >= n)
