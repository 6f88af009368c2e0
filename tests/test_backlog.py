"""The backlog's exact count (issue 28 point 4, issue 29 point 3; docs/flow-control.md
#backpressure): every script that moves a job into or out of the counted states (queued in any
lane or waiting aside on a limiter, scheduled) keeps ``<base>backlog`` (per task), so
``max_queued`` bounds the queue in total. Each step of a sweep through every path compares
``Queue.backlog()`` with a count made by reading every job record directly. A real server."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from redis.asyncio import Redis

from aioqueue import App, Queue, QueueFull, Worker, current_job

from .support.server import text
from .support.waiting import wait_until


async def truth(redis: Redis, q: Queue) -> dict[str, int]:
    """The backlog read from the records themselves: jobs queued or scheduled, per task."""
    out: dict[str, int] = {}
    async for key in redis.scan_iter(match=q._keys.base + "job:*", count=1000):
        s, t = await redis.hmget(key, "s", "t")
        if s in (b"queued", b"scheduled"):
            name = text(t) if t else ""
            out[name] = out.get(name, 0) + 1
    return out


async def exact(redis: Redis, q: Queue, step: str) -> None:
    got, want = await q.backlog(), await truth(redis, q)
    assert got == want, f"after {step}: counted {got}, records say {want}"


def declare(app: App) -> None:
    app.limiter("one", concurrency=1)

    @app.task(name="lim", limits=["one"])
    async def lim() -> None: ...

    @app.task(name="a")
    async def a(x: int = 0) -> None: ...


@pytest.mark.cluster
async def test_every_path_keeps_the_count_exact(app: App, redis: Redis) -> None:
    declare(app)
    q = app.queue()
    a = app.tasks["a"]
    await exact(redis, q, "nothing")
    # enqueue: single, grouped, priorities, delayed, many, unique, an idempotent retry
    first = await q.enqueue("a", job_id="first")
    await q.enqueue("a", job_id="first")
    await q.enqueue("b", group="g1")
    await q.enqueue("b", group="g2", priority=3)
    await q.enqueue("c", priority=-2)
    later = await q.enqueue("c", delay=3600)
    await a.enqueue_many([{"x": i} for i in range(5)])
    await q.enqueue("u", unique=True, unique_key="k")
    await q.enqueue("u", unique=True, unique_key="k")  # the lock's holder: nothing new
    await exact(redis, q, "enqueue")
    # claims (every lane), a retry with backoff, a dead letter and its requeue
    got = await q.reserve(4)
    await exact(redis, q, "reserve")
    await q.fail(got[0], "again", retry=True, delay=3600)
    await q.fail(got[1], "for good", retry=False)
    await exact(redis, q, "fail")
    assert await q.requeue([got[1].id]) == 1
    await exact(redis, q, "requeue")
    await q.release(got[2])
    await q.complete(got[3])
    await exact(redis, q, "release, complete")
    # cancel (queued and scheduled), promote, change, purge
    await q.cancel([first.id, later.id])
    await exact(redis, q, "cancel")
    await q.promote(all=True)
    await exact(redis, q, "promote")
    queued = (await q.jobs("queued", limit=2)).items
    await q.change_job(queued[0].id, delay=60)
    await q.change_job(queued[1].id, priority=7)
    await exact(redis, q, "change")
    await q.purge(job_ids=[queued[0].id])
    await exact(redis, q, "purge")
    # a lease that runs out, recovered by reap
    short = await q.reserve(1, lease=0.05)
    await exact(redis, q, "short lease")
    deadline = time.monotonic() + 30
    while (await q.job_info(short[0].id)).state.value == "active":
        assert time.monotonic() < deadline, "the lease was never recovered"
        await q.reap()
        await asyncio.sleep(0.05)
    await exact(redis, q, "reap")
    # dependencies: waiting is not counted; released, it is
    dep = await a.enqueue(x=1)
    waiter = await a.options(depends_on=[dep]).enqueue(x=2)
    await exact(redis, q, "a dependent waits")
    assert (await q.job_info(waiter.id)).state.value == "waiting"
    while True:
        (r,) = await q.reserve(1)
        if r.id == dep.id:
            break
        await q.complete(r)
    await q.complete(r)
    assert (await q.job_info(waiter.id)).state.value == "queued"
    await exact(redis, q, "a dependent released")
    # drain, then limits: a job waiting aside is counted, and woken it still is
    for r in await q.reserve(1000):
        await q.complete(r)
    await exact(redis, q, "drained")
    one = await app.tasks["lim"].enqueue()
    two = await app.tasks["lim"].enqueue()
    (held,) = await q.reserve(10)
    assert held.id == one.id
    await exact(redis, q, "a job waits aside on its limit")
    assert sum((await q.backlog()).values()) == 1
    await q.complete(held)
    await exact(redis, q, "the limit frees")
    (r,) = await q.reserve(10)
    assert r.id == two.id
    await q.complete(r)
    await exact(redis, q, "all done")
    assert await q.backlog() == {}


async def test_planted_jobs_never_drive_the_count_below_zero(app: App, redis: Redis) -> None:
    q = app.queue()
    k = q._keys
    await q.enqueue("a", job_id="real")
    # a record written behind the scripts' back (never counted), in the plain lane: its
    # claim takes it out of a count that never had it, which stays at 0, never below
    await redis.hset(k.job("planted"), mapping={"s": "queued", "t": "x", "a": "0", "m": "1"})
    await redis.rpush(k.ready, "planted")
    for r in await q.reserve(10):
        await q.complete(r)
    assert (await q.job_info("planted")).state.value != "queued"
    assert await q.backlog() == {}
    await q.enqueue("x")
    assert await q.backlog() == {"x": 1}


async def test_a_hundred_tasks_then_the_rest_together(app: App, redis: Redis) -> None:
    q = app.queue()
    for i in range(105):
        await q.enqueue(f"t{i:03}")
    counts = await q.backlog()
    assert len(counts) == 101
    assert counts["*"] == 5
    assert sum(counts.values()) == 105
    # a task counted among the rest leaves from the rest, never below 0
    got = await q.reserve(1000)
    for r in got:
        await q.complete(r)
    assert await q.backlog() == {}


async def test_max_queued_bounds_a_backlog_spread_over_a_thousand_groups(app: App) -> None:
    q = app.queue()
    await q.set_max_queued(1000)
    # 999 groups of one job each, and one ungrouped
    await q.enqueue("t")
    for i in range(0, 999, 100):
        await asyncio.gather(*(q.enqueue("t", group=f"g{j}") for j in range(i, min(i + 100, 999))))
    assert sum((await q.backlog()).values()) == 1000
    for group in ("g0", "new", None):
        with pytest.raises(QueueFull) as caught:
            await q.enqueue("t", group=group)
        assert (caught.value.waiting, caught.value.limit) == (1000, 1000)
    # one taken (whichever lane): room for exactly one
    (r,) = await q.reserve(1)
    await q.enqueue("t", group="new")
    with pytest.raises(QueueFull):
        await q.enqueue("t", group="other")
    await q.complete(r)


async def test_jobs_waiting_aside_on_a_limiter_count(app: App) -> None:
    declare(app)
    q = app.queue()
    await q.set_max_queued(2)
    await app.tasks["lim"].enqueue()
    await app.tasks["lim"].enqueue()
    (held,) = await q.reserve(10)  # the other waits aside: out of every lane, still counted
    assert (await q.counts())["queued"] <= 1
    await app.tasks["a"].enqueue()
    with pytest.raises(QueueFull) as caught:
        await app.tasks["a"].enqueue()
    assert caught.value.waiting == 2
    await q.complete(held)


async def test_a_waiting_producer_is_released_when_a_job_is_taken(app: App) -> None:
    q = app.queue()
    await q.set_max_queued(3, wait=60)
    for g in ("x", "y", "z"):
        await q.enqueue("t", group=g)
    producer = asyncio.create_task(q.enqueue("t", group="w", job_id="late"))
    # it is refused and backs off: the refusals are counted while it waits
    refused = 0
    deadline = time.monotonic() + 30
    while refused == 0:
        assert time.monotonic() < deadline, "the producer was never refused"
        refused = (await q.stats()).get("refused", 0)
        await asyncio.sleep(0.01)
    assert not producer.done()
    (r,) = await q.reserve(1)  # room, in another group's lane
    job = await asyncio.wait_for(producer, timeout=30)
    assert job.id == "late"
    assert sum((await q.backlog()).values()) == 3
    await q.complete(r)


@pytest.mark.cluster
async def test_a_batch_and_a_dependency_across_queues_keep_both_counts_exact(
    app: App, redis: Redis
) -> None:
    """Outcomes that cross queues (another Cluster slot: the outbox) release a batch's
    callback and a dependent on the home queue: each queue's count stays its records'."""

    @app.task
    async def work(n: int) -> int:
        return n

    @app.task
    async def collect() -> None: ...

    home, other = app.queue(), app.queue("other")

    async def both(step: str) -> None:
        await exact(redis, home, step)
        await exact(redis, other, step)

    batch = await app.batch(
        [work.options(queue="other").call(i) for i in range(3)], on_complete=collect.call()
    )
    assert batch.callback is not None
    first = await work.options(queue="other").enqueue(9)
    dependent = await work.options(depends_on=[first]).enqueue(10)
    await both("a batch and a dependency across queues")
    assert sum((await home.backlog()).values()) == 0  # the callback and the dependent wait
    assert sum((await other.backlog()).values()) == 4
    for r in await other.reserve(10):
        await other.complete(r, r.args[0])
    await both("their outcomes forwarded")
    assert await batch.callback.state() == "queued"
    assert await dependent.state() == "queued"
    assert await home.backlog() == {"collect": 1, "work": 1}
    for r in await home.reserve(10):
        await home.complete(r)
    await both("all done")


async def test_a_workers_paths_keep_the_count_exact(app: App, redis: Redis) -> None:
    """The paths a running worker takes: jobs handed to a parked worker by enqueue, a durable
    wait parked (scheduled) and woken by a signal, a job past its expiry, a debounced
    (replaced) job, a batch cancelled, a retry with backoff."""
    q = app.queue()
    went: list[str] = []

    @app.task
    async def waiter() -> str:
        went.append("parked")
        return str(await current_job().wait_for_event("go", timeout=600))

    @app.task(max_attempts=2)
    async def flaky(n: int) -> int:
        if not went.count(f"flaky{n}"):
            went.append(f"flaky{n}")
            raise RuntimeError("the first attempt fails")
        return n

    @app.task
    async def work(n: int) -> int:
        return n

    debounced = work.options(unique_key="d", on_conflict="debounce", delay=3600)
    await debounced.enqueue(1)
    await debounced.enqueue(2)  # replaces the first: still one job
    await exact(redis, q, "debounced")
    await work.options(expires=0.01).enqueue(3)
    batch: Any = await app.batch([work.options(delay=3600).call(i) for i in range(3)])
    await batch.cancel()
    await exact(redis, q, "a batch cancelled")
    async with Worker(app, concurrency=4, idle_block=0.1):
        parked = await waiter.enqueue()
        await wait_until(lambda: "parked" in went, timeout=30, what="the wait")

        async def waits() -> bool:
            return await parked.state() == "scheduled"

        await wait_until(waits, timeout=30, what="the job parked")
        await exact(redis, q, "a durable wait parked")
        handed = [await flaky.enqueue(i) for i in range(3)]  # handed to the parked worker
        assert [await j.result(timeout=30) for j in handed] == [0, 1, 2]
        await exact(redis, q, "retries done")
        assert await app.signal("go", "now") == 1
        assert await parked.result(timeout=30) == "now"
        await exact(redis, q, "woken")
    assert await q.backlog() == {"work": 1}  # the debounced job, still delayed


async def test_a_claim_records_its_tasks_longest_wait_from_the_earliest_creation(
    app: App, redis: Redis
) -> None:
    """The claim writes each task's longest wait (ms from creation, or from due for a delayed
    job) to ``<base>twait`` for the trends. It reads the creation times as text and converts
    only a new earliest, so: an older time of fewer digits still counts as the earliest, a
    garbage time counts as no wait (as a conversion of each would), a delayed job counts
    from when it was due."""
    from .support.server import server_ms

    q = app.queue()
    k = q._keys
    await q.pause()
    fresh, garbage, oldest, older = [await q.enqueue("w") for _ in range(4)]
    now = await server_ms(redis)
    await redis.hset(k.job(fresh.id), "ct", str(now - 5_000))
    await redis.hset(k.job(garbage.id), "ct", "not a time")
    await redis.hset(k.job(oldest.id), "ct", "999")  # fewer digits: older than any other
    await redis.hset(k.job(older.id), "ct", str(now - 60_000))
    await q.resume()
    got = await q.reserve(4)
    assert sorted(r.id for r in got) == sorted(j.id for j in (fresh, garbage, oldest, older))
    wait = await redis.zscore(k.base + "twait", "w")
    assert wait is not None
    assert now - 999 <= wait <= now - 999 + 60_000  # from 999, within a minute of the read
    # only garbage: no wait (0), recorded for the task all the same
    await redis.delete(k.base + "twait")
    alone = await q.enqueue("g")
    await redis.hset(k.job(alone.id), "ct", "x")
    [r] = await q.reserve(1)
    assert r.id == alone.id
    assert await redis.zscore(k.base + "twait", "g") == 0
