"""Batches under worker crashes: real ``python -m aioqueue worker tests.batchapp:app``
processes, killed with SIGKILL while they hold sub-jobs. The callback is released exactly once
and every sub-job's outcome is counted exactly once, whoever finishes it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from aioqueue import App, Batch, BatchState, JobState
from aioqueue._store.loader import SCRIPTS

from .batchapp import BatchTasks, register
from .support.invariants import check_invariants
from .support.processes import WorkerProcesses
from .support.server import text
from .support.waiting import wait_until

REPO_ROOT = Path(__file__).resolve().parents[1]
LEASE = 1.0  # seconds: a dead worker's jobs come back about this long after it died


@pytest.fixture
def workers(tmp_path: Path, redis_url: str, prefix: str) -> Iterator[WorkerProcesses]:
    procs = WorkerProcesses(tmp_path, redis_url, prefix, lease=LEASE, app="tests.batchapp:app")
    try:
        yield procs
    finally:
        procs.close()
        print(procs.logs())  # shown when the test failed


@pytest.fixture
async def producer(redis_url: str, prefix: str) -> AsyncIterator[App]:
    async with App(redis_url, prefix=prefix, lease=LEASE) as app:
        # see test_batch.py's test_first_batch_on_a_server_that_does_not_know_the_batch_script
        for script in SCRIPTS.values():
            await app.redis.script_load(script.source)
        yield app


@pytest.fixture
def tasks(producer: App) -> BatchTasks:
    return register(producer)  # the same tasks as the worker processes run


async def counted(redis: Redis, batch: Batch[Any]) -> tuple[int, int, int, int]:
    """(done, failed, outcomes in :seen, results in :res) of a batch."""
    bk = batch.queue._keys.batch(batch.id)
    done, failed = await redis.hmget(bk, ["done", "failed"])
    return (
        int(done or 0),
        int(failed or 0),
        int(await redis.scard(bk + ":seen")),
        int(await redis.hlen(bk + ":res")),
    )


async def test_worker_killed_while_running_the_last_sub_job(
    workers: WorkerProcesses, producer: App, tasks: BatchTasks, redis: Redis
) -> None:
    t = tasks
    release = f"{producer.prefix}:t:release"
    batch = await producer.batch(
        [*(t.work.call(i) for i in range(4)), t.hold.call(4, release)],
        on_complete=t.collect.call(),
    )
    assert batch.callback is not None
    w1 = workers.start(concurrency=8, grace=2.0)

    async def last_one_running() -> bool:
        started = await redis.lrange(t.keys.started, 0, -1)
        return started == [b"4"] and await redis.llen(t.keys.runs) == 4

    await wait_until(last_one_running, timeout=20, what="four sub-jobs done, the last running")
    await wait_until(lambda: _done(batch, 4), timeout=10, what="four outcomes counted")
    workers.kill(w1)
    info = await batch.info()
    assert (info.done, info.state) == (4, BatchState.OPEN)
    assert await batch.callback.state() is JobState.WAITING
    await redis.set(release, 1)
    w2 = workers.start(
        concurrency=8, grace=2.0
    )  # takes the held sub-job once its lease has run out
    info = await batch.wait(timeout=30)
    assert await batch.callback.result(timeout=20) == {"ok": 5, "failed": 0}
    await workers.wait_idle(redis, w2)
    assert info.state is BatchState.COMPLETED
    assert await counted(redis, batch) == (5, 0, 5, 5)
    assert await redis.lrange(t.keys.started, 0, -1) == [b"4", b"4"]  # run again, once
    assert (await producer.queue().stats())["expired"] == 1  # handed back by its lease
    assert sorted(int(x) for x in await redis.lrange(t.keys.runs, 0, -1)) == [0, 1, 2, 3, 4]
    assert int(await redis.get(t.keys.cb_count) or 0) == 1
    (summary,) = [json.loads(s) for s in await redis.lrange(t.keys.cb_runs, 0, -1)]
    assert summary["values"] == [0, 10, 20, 30, 40]
    states = await check_invariants(redis, producer.queue()._keys)
    assert set(states.values()) == {"completed"}


async def _done(batch: Batch[Any], n: int) -> bool:
    return (await batch.info()).done == n


async def test_a_streamed_batch_survives_a_worker_killed_mid_way(
    workers: WorkerProcesses, producer: App, tasks: BatchTasks, redis: Redis
) -> None:
    t = tasks
    n, chunk = 1000, 100
    w1 = workers.start(concurrency=8, grace=2.0)
    w2 = workers.start(concurrency=8, grace=2.0)
    batch = await producer.batch(on_complete=t.collect.call())
    assert batch.callback is not None
    for start in range(0, n // 2, chunk):
        await batch.add_many(t.tracked.call(i, 0.02) for i in range(start, start + chunk))

    async def some_ran() -> bool:
        return int(await redis.llen(t.keys.runs)) >= 250

    await wait_until(some_ran, timeout=30, what="a quarter of the sub-jobs to run")
    workers.kill(w1)  # mid-way: w1 holds sub-jobs and acks in flight
    at_kill = await batch.info()
    assert at_kill.done < n // 2
    assert not at_kill.sealed
    for start in range(n // 2, n, chunk):
        await batch.add_many(t.tracked.call(i, 0.02) for i in range(start, start + chunk))
    assert (await batch.info()).total == n
    await batch.seal()
    info = await batch.wait(timeout=60)
    assert await batch.callback.result(timeout=30) == {"ok": n, "failed": 0}
    await workers.wait_idle(redis, w2)
    assert (info.total, info.done, info.failed, info.state) == (n, n, 0, BatchState.COMPLETED)
    assert await counted(redis, batch) == (n, 0, n, n)  # no sub-job counted twice
    assert int(await redis.get(t.keys.cb_count) or 0) == 1
    (summary,) = [json.loads(s) for s in await redis.lrange(t.keys.cb_runs, 0, -1)]
    assert summary["values"] == list(range(n))  # in the order they were added
    ran = [int(text(x)) for x in await redis.lrange(t.keys.runs, 0, -1)]
    assert set(ran) == set(range(n))
    # at least once: only what w1 held when it died may have run twice
    assert len(ran) - n <= 32, f"{len(ran) - n} sub-jobs ran twice"
    assert (await producer.queue().stats()).get("expired", 0) >= 1  # w1 died holding some
    states = await check_invariants(redis, producer.queue()._keys)
    assert set(states.values()) == {"completed"}
