"""Sharded queues (``app.queue(name, shards=K)``): jobs spread over the shards (round-robin,
or by group, job id or unique key), workers and the pull API take from every shard fairly,
reads sum the shards, nothing is lost."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest
from redis.asyncio import Redis

from aioqueue import (
    App,
    ConfigurationError,
    JobNotFound,
    JobState,
    Reservation,
    Worker,
    current_job,
)
from aioqueue._queue.sharded import ShardedQueue, shard_index, shard_name

from .shardapp import ran_key
from .support.processes import WorkerProcesses
from .support.waiting import wait_until


def declare(app: App, k: int = 3) -> ShardedQueue:
    return app.queue("hot", shards=k)


async def spread_of(sq: ShardedQueue) -> list[int]:
    return [c["queued"] + c["scheduled"] for c in await sq.shard_counts()]


def test_declaring_a_sharded_queue(app: App) -> None:
    sq = declare(app)
    assert [q.name for q in sq.queues] == ["hot:s0", "hot:s1", "hot:s2"]
    assert app.queue("hot", shards=3) is sq
    with pytest.raises(ConfigurationError, match="sharded"):
        app.queue("hot")  # the unsharded keys would be another queue altogether
    with pytest.raises(ConfigurationError, match="shards=3"):
        app.queue("hot", shards=4)
    app.queue("plain")
    with pytest.raises(ConfigurationError, match="unsharded"):
        app.queue("plain", shards=2)
    with pytest.raises(ConfigurationError):
        app.queue("zero", shards=0)
    assert shard_name("hot", 2) == "hot:s2"
    assert app.queues.consumed("hot") == ["hot:s0", "hot:s1", "hot:s2"]
    assert app.queues.consumed("plain") == ["plain"]
    with pytest.raises(ConfigurationError, match="twice"):
        Worker(app, queues=["hot", "hot:s1"])  # a shard of a queue listed as well


async def test_jobs_spread_round_robin(app: App) -> None:
    sq = declare(app)

    @app.task(queue="hot")
    async def work(i: int) -> int:
        return i

    for i in range(30):
        await work.enqueue(i)
    assert await spread_of(sq) == [10, 10, 10]
    await work.enqueue_many([{"i": i} for i in range(30)])
    assert await spread_of(sq) == [20, 20, 20]
    jobs = await work.enqueue_many([{"i": i} for i in range(7)])
    assert len({j.id for j in jobs}) == 7
    assert sum(await spread_of(sq)) == 67
    await sq.enqueue("work", [1])  # by name too
    assert (await sq.counts())["queued"] == 68


async def test_a_group_stays_on_its_shard(app: App) -> None:
    sq = declare(app)

    @app.task(queue="hot")
    async def work(i: int) -> int:
        return i

    for g in ("tenant-a", "tenant-b", "tenant-c", "tenant-d"):
        await work.options(group=g).enqueue_many([{"i": i} for i in range(5)])
        await work.options(group=g).enqueue(99)
        home = sq.queues[shard_index(g, 3)]
        assert (await home.group_counts())[g] == 6
        assert sum([(await q.group_counts()).get(g, 0) for q in sq.queues]) == 6
    assert (await sq.group_counts())["tenant-a"] == 6
    # a group's limit is set where the group lives, so it holds across every worker
    await sq.set_group_limit("tenant-a", 1)
    home = sq.queues[shard_index("tenant-a", 3)]
    names = {q.name: await q.groups() for q in sq.queues}
    limited = [g for g in names[home.name] if g.name == "tenant-a"]
    assert limited
    assert limited[0].limit == 1


async def test_ids_and_unique_keys_stay_global(app: App) -> None:
    sq = declare(app)

    @app.task(queue="hot")
    async def work(i: int) -> int:
        return i

    a = await work.options(job_id="order-1").enqueue(1)
    b = await work.options(job_id="order-1").enqueue(1)  # same id: the same shard, stored once
    assert a.queue == b.queue == shard_name("hot", shard_index("order-1", 3))
    u1 = await work.options(unique_key="k").enqueue(2)
    u2 = await work.options(unique_key="k").enqueue(3)
    assert u1.id == u2.id  # the lock is on one shard, whatever the round-robin says
    d1 = await work.options(unique=True).enqueue(7)
    d2 = await work.options(unique=True).enqueue(7)  # a key derived from the arguments
    assert d1.id == d2.id
    many = await work.options(unique=True).enqueue_many([((7,), {}), ((8,), {}), ((9,), {})])
    assert many[0].id == d1.id
    assert (await sq.counts())["queued"] == 5
    assert (await sq.locate("order-1")).id == "order-1"
    found = await sq.locate(u1.id)
    assert found.queue == u1.queue
    with pytest.raises(JobNotFound):
        await sq.locate("nope")


async def test_workers_take_from_every_shard_fairly_and_lose_nothing(app: App) -> None:
    sq = declare(app)
    order: list[str] = []

    @app.task(queue="hot")
    async def work(i: int) -> int:
        order.append(current_job().queue)
        return i

    jobs = await work.enqueue_many([{"i": i} for i in range(90)])
    assert await spread_of(sq) == [30, 30, 30]
    await Worker(app, queues=["hot"], concurrency=2, burst=True).run()
    assert len(order) == 90
    assert Counter(order) == {"hot:s0": 30, "hot:s1": 30, "hot:s2": 30}
    # fair: in the first half of the run each shard had a fair part of the turns, so none
    # was starved while another drained
    first = Counter(order[:45])
    assert len(first) == 3
    assert min(first.values()) >= 8, first
    assert sorted([await j.result(timeout=10) for j in jobs]) == list(range(90))
    counts = await sq.counts()
    assert (counts["queued"], counts["active"], counts["scheduled"]) == (0, 0, 0)
    assert (await sq.stats())["completed"] == 90
    done = await sq.jobs("completed", limit=1000)
    assert len(done) == 90
    assert {s.id for s in done} == {j.id for j in jobs}


async def test_the_pull_api_reserves_across_shards(app: App) -> None:
    sq = declare(app)
    for i in range(6):
        await sq.enqueue("noop", [i])
    got = await sq.reserve(6)
    assert len(got) == 6
    assert Counter(r.queue for r in got) == {"hot:s0": 2, "hot:s1": 2, "hot:s2": 2}
    for r in got[:3]:
        await sq.complete(r, "ok")
    await sq.release(got[3])
    await sq.fail(got[4], "boom", retry=False)
    await sq.extend(got[5], lease=30)
    counts = await sq.counts()
    assert (counts["queued"], counts["active"], counts["failed"]) == (1, 1, 1)
    assert await sq.reserve(5) != []  # the released one
    assert await sq.reserve(1) == []
    # a job enqueued on any shard while a consumer waits is found
    for target in sq.queues:
        reserved: list[Reservation] = []

        async def consume(into: list[Reservation] = reserved) -> None:
            into.extend(await sq.reserve(1, wait=30))

        task = asyncio.create_task(consume())
        await target.enqueue("noop")
        await wait_until(task.done, timeout=30, what="the reservation")
        await task
        assert reserved[0].queue == target.name


async def test_pause_and_resume_every_shard(app: App) -> None:
    sq = declare(app, 2)
    await sq.pause()
    assert all([await q.is_paused() for q in sq.queues])
    await sq.enqueue("noop")
    assert await sq.reserve(1) == []
    await sq.resume()
    assert len(await sq.reserve(1)) == 1
    assert not any([await q.is_paused() for q in sq.queues])
    assert JobState.QUEUED.value == "queued"


@pytest.mark.slow
async def test_worker_processes_drain_every_shard_and_a_killed_one_loses_nothing(
    tmp_path: Path, redis_url: str, redis: Redis, prefix: str
) -> None:
    """``python -m aioqueue worker tests.shardapp:app --queue hot`` takes from every shard;
    a worker SIGKILLed mid-run loses nothing: its jobs come back to their shards."""
    procs = WorkerProcesses(tmp_path, redis_url, prefix, lease=2.0, app="tests.shardapp:app")
    try:
        async with App(redis_url, prefix=prefix) as producer:
            sq = producer.queue("hot", shards=3)

            @producer.task(queue="hot")
            async def mark(i: int) -> int:
                return i

            jobs = await mark.enqueue_many([{"i": i} for i in range(300)])
            assert await spread_of(sq) == [100, 100, 100]
            first = procs.start(concurrency=4, extra=("--queue", "hot"))

            async def some_ran() -> bool:
                return int(await redis.hlen(ran_key(prefix))) >= 20

            await wait_until(some_ran, timeout=60, what="the first worker to run jobs")
            procs.kill(first)
            procs.start(concurrency=8, extra=("--queue", "hot"))

            async def all_done() -> bool:
                return (await sq.stats()).get("completed", 0) >= 300

            await wait_until(all_done, timeout=90, interval=0.2, what="every job completed")
            assert sorted([await j.result(timeout=10) for j in jobs]) == list(range(300))
            counts = await sq.counts()
            assert (counts["queued"], counts["active"], counts["failed"]) == (0, 0, 0)
            assert int(await redis.hlen(ran_key(prefix))) == 300
    finally:
        procs.close()
        print(procs.logs())


async def test_the_blocking_producer_sends_to_the_shards(app: App) -> None:
    sq = declare(app)

    @app.task(queue="hot")
    async def work(i: int) -> int:
        return i

    def produce() -> list[str]:
        with app.sync() as sync:
            one = [sync.enqueue(work, i).queue for i in range(6)]
            group = sync.enqueue(work.options(group="tenant-a"), 1).queue
            many = sync.enqueue_many(work, [{"i": i} for i in range(3)])
            by_name = sync.enqueue_by_name("hot", "work", [1]).queue
            return [*one, group, *(j.queue for j in many), by_name]

    queues = await asyncio.to_thread(produce)
    assert set(queues) <= {q.name for q in sq.queues}  # never the unsharded "hot"
    assert Counter(queues[:6]) == {"hot:s0": 2, "hot:s1": 2, "hot:s2": 2}
    assert queues[6] == shard_name("hot", shard_index("tenant-a", 3))
    assert sum(await spread_of(sq)) == 11
