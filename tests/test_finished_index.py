"""Listing completed and cancelled jobs: the two bounded indexes of finished jobs (ZSETs
``completed`` and ``cancelled``, id -> finish time) that the finishing scripts write, paged like
the other states, trimmed to their newest ``FINISHED_INDEX_MAX`` entries, skipping entries
whose record has expired, purged with their jobs, and shown by ``aioqueue jobs``."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from redis.asyncio import Redis

from aioqueue import App, JobState, Queue, Worker
from aioqueue._model.limits import FINISHED_INDEX_MAX

from .support.apps import unique_prefix
from .support.invariants import check_invariants
from .support.server import text
from .support.waiting import wait_until
from .test_cli_admin import ok_json


async def listing(q: Queue, state: str, limit: int = 7, **kw: Any) -> list[str]:
    """Every id of one listing, page by page, asserting none comes twice."""
    ids: list[str] = []
    cursor = None
    while True:
        page = await q.jobs(state, limit=limit, cursor=cursor, **kw)
        assert len(page.items) <= limit
        assert all(j.state.value == state for j in page.items)
        ids += [j.id for j in page.items]
        cursor = page.cursor
        if cursor is None:
            break
    assert len(ids) == len(set(ids)), "a job was listed twice"
    return ids


async def complete_all(q: Queue, redis: Redis) -> list[str]:
    """Complete every runnable job through the pull API, one at a time; their ids in the
    order a listing gives them (finish time, ties by id)."""
    done = set()
    while reserved := await q.reserve(1):
        await q.complete(reserved[0], "ok")
        done.add(reserved[0].id)
    order = [text(m) for m in await redis.zrange(q._keys.completed, 0, -1)]
    return [i for i in order if i in done]


async def test_completed_jobs_are_listed_page_by_page_each_once(app: App, redis: Redis) -> None:
    q = app.queue(app.default_queue)
    for i in range(25):
        await q.enqueue("a" if i % 2 else "b", (i,), group="x" if i % 3 else None)
    done = await complete_all(q, redis)
    ids = await listing(q, "completed")
    assert sorted(ids) == sorted(done)
    # oldest first by default (finish time, ties by id); newest first reverses it
    assert await listing(q, "completed", newest_first=True) == ids[::-1]
    assert len(await listing(q, "completed", task="a")) == 12
    assert len(await listing(q, "completed", group="x")) == 16
    page = await q.jobs("completed", limit=1)
    [item] = page.items
    assert item.state is JobState.COMPLETED
    assert item.finished_ms is not None
    assert await q.jobs("cancelled") == type(page)((), None)
    await check_invariants(redis, q._keys)


async def test_a_worker_completing_batches_indexes_every_job(app: App, redis: Redis) -> None:
    @app.task
    async def noop(i: int) -> int:
        return i

    await noop.enqueue_many([((i,), {}) for i in range(300)])
    q = app.queue(app.default_queue)
    async with Worker(app, concurrency=20):
        await wait_until(lambda: _completed(q, 300), timeout=60, what="the 300 jobs to complete")
    assert len(await listing(q, "completed", limit=100)) == 300
    assert await redis.zcard(q._keys.completed) == 300
    await check_invariants(redis, q._keys)


async def _completed(q: Queue, n: int) -> bool:
    return (await q.stats()).get("completed", 0) >= n


async def test_a_completed_job_whose_record_is_not_kept_is_not_indexed(
    app: App, redis: Redis
) -> None:
    q = app.queue(app.default_queue)
    kept = await q.enqueue("t", (1,))
    await q.enqueue("t", (2,), result_ttl=0)
    await complete_all(q, redis)
    assert [text(m) for m in await redis.zrange(q._keys.completed, 0, -1)] == [kept.id]


async def test_cancelled_jobs_are_listed_whatever_cancelled_them(redis_url: str) -> None:
    # a short lease: the worker hears of a cancellation at its next heartbeat (lease / 3)
    async with App(redis_url, prefix=unique_prefix(), lease=1.5) as app:
        q = app.queue(app.default_queue)
        # cancelled while queued, and while scheduled
        queued = await q.enqueue("t", (1,))
        scheduled = await q.enqueue("t", (2,), delay=600)
        assert await q.cancel_jobs([queued.id, scheduled.id]) == 2
        # expired before any run started: recorded cancelled when a claim meets it
        expired = await q.enqueue("t", (3,), expires=datetime(2000, 1, 1, tzinfo=UTC))
        assert await q.reserve(10) == []
        # cancelled while its holder was lost (its lease ran out): maintenance records it
        lost = await q.enqueue("t", (4,))
        [r] = await q.reserve(1, lease=0.2)
        await q.cancel_jobs([lost.id])  # flagged: its holder is to stop it
        await wait_until(
            lambda: _reaped_cancelled(q, lost.id), timeout=30, what="the lost job's cancel"
        )
        # cancelled while running: its worker stops it and records it (fail.lua)
        started = asyncio.Event()

        @app.task
        async def hang() -> None:
            started.set()
            await asyncio.sleep(60)

        running = await hang.enqueue()
        worker = Worker(app, concurrency=1)
        run = asyncio.create_task(worker.run())
        try:
            await asyncio.wait_for(started.wait(), 30)
            await q.cancel_jobs([running.id])
            await wait_until(
                lambda: _state_is(q, running.id, JobState.CANCELLED),
                timeout=30,
                what="the running job's cancel",
            )
        finally:
            worker.stop()
            await asyncio.wait_for(run, 30)
        ids = await listing(q, "cancelled", limit=2)
        want = {queued.id, scheduled.id, expired.id, lost.id, running.id}
        assert set(ids) == want
        assert set(await listing(q, "cancelled", task="hang")) == {running.id}
        assert await q.jobs("completed") == type(await q.jobs("completed"))((), None)
        del r


async def _reaped_cancelled(q: Queue, job_id: str) -> bool:
    await q.reap()
    return await _state_is(q, job_id, JobState.CANCELLED)


async def _state_is(q: Queue, job_id: str, state: JobState) -> bool:
    return (await q.job_info(job_id)).state is state


async def test_a_listing_skips_entries_whose_record_expired(app: App, redis: Redis) -> None:
    q = app.queue(app.default_queue)
    for i in range(5):
        await q.enqueue("t", (i,))
    done = await complete_all(q, redis)
    keys = q._keys
    # entries older than every real one whose records are gone, and one real record expired
    await redis.zadd(keys.completed, {f"gone-{i}": i for i in range(30)})
    await redis.delete(keys.job(done[0]))
    assert await listing(q, "completed", limit=3) == done[1:]
    # a page is filled from the live entries, not cut short by the stale ones before them
    page = await q.jobs("completed", limit=4)
    assert [j.id for j in page.items] == done[1:]


async def test_the_index_is_trimmed_to_its_newest_entries(app: App, redis: Redis) -> None:
    q = app.queue(app.default_queue)
    key = q._keys.completed
    extra = 50
    # fill the index past its bound with old fake entries (scores 1..), in a few commands
    fakes = [f"fake-{i:06d}" for i in range(FINISHED_INDEX_MAX + extra)]
    pipe = redis.pipeline(transaction=False)
    for i in range(0, len(fakes), 10_000):
        pipe.zadd(key, {m: n + 1 for n, m in enumerate(fakes[i : i + 10_000], start=i)})
    await pipe.execute()
    assert await redis.zcard(key) == FINISHED_INDEX_MAX + extra
    for i in range(3):
        await q.enqueue("t", (i,))
    done = await complete_all(q, redis)
    # one trim keeps the newest FINISHED_INDEX_MAX: the three real ones, not the oldest fakes
    assert await redis.zcard(key) == FINISHED_INDEX_MAX
    assert await redis.zscore(key, fakes[extra + 2]) is None
    assert await redis.zscore(key, fakes[extra + 3]) is not None
    newest = await redis.zrange(key, -3, -1)
    assert sorted(text(m) for m in newest) == sorted(done)
    page = await q.jobs("completed", limit=3, newest_first=True)
    assert [j.id for j in page.items] == done[::-1]


async def test_purging_finished_jobs_clears_them_from_their_index(app: App, redis: Redis) -> None:
    q = app.queue(app.default_queue)
    for i in range(6):
        await q.enqueue("t", (i,))
    done = await complete_all(q, redis)
    cancelled = [(await q.enqueue("t", (i,), delay=600)).id for i in range(4)]
    await q.cancel_jobs(cancelled)
    keys = q._keys
    # by id: the record and the index entry go
    assert await q.purge(job_ids=[done[0], cancelled[0]]) == 2
    assert await redis.zscore(keys.completed, done[0]) is None
    assert await redis.zscore(keys.cancelled, cancelled[0]) is None
    # by state, with a stale entry among them (dropped too)
    await redis.zadd(keys.completed, {"gone": 0})
    assert await q.purge("completed") == 5
    assert await redis.exists(keys.completed) == 0
    assert await redis.exists(keys.job(done[1])) == 0
    # the whole queue: the cancelled ones too
    removed = await q.purge_queue()
    assert removed["cancelled"] == 3
    assert removed["completed"] == 0
    assert await redis.exists(keys.cancelled) == 0
    assert await listing(q, "cancelled") == []
    await check_invariants(redis, keys)


async def test_the_invariant_checker_flags_an_index_entry_in_another_state(
    app: App, redis: Redis
) -> None:
    q = app.queue(app.default_queue)
    job = await q.enqueue("t", (1,))
    await complete_all(q, redis)
    await check_invariants(redis, q._keys)
    await redis.zadd(q._keys.cancelled, {job.id: 1})
    with pytest.raises(AssertionError, match="cancelled index"):
        await check_invariants(redis, q._keys)


async def test_cli_lists_completed_jobs(redis_url: str, app: App, redis: Redis) -> None:
    q = app.queue(app.default_queue)
    for i in range(3):
        await q.enqueue("t", (i,), group="acme")
    done = await complete_all(q, redis)
    page = ok_json(redis_url, app.prefix, "jobs", "completed", "--limit", "2")
    assert [j["id"] for j in page["items"]] == done[:2]
    item = page["items"][0]
    assert item["state"] == "completed"
    assert item["task"] == "t"
    assert item["group"] == "acme"
    assert isinstance(item["finished_ms"], int)
    assert page["cursor"]
    rest = ok_json(
        redis_url, app.prefix, "jobs", "completed", "--limit", "2", "--cursor", page["cursor"]
    )
    assert [j["id"] for j in rest["items"]] == done[2:]
    assert rest["cursor"] is None
    newest = ok_json(redis_url, app.prefix, "jobs", "completed", "--newest-first")
    assert [j["id"] for j in newest["items"]] == done[::-1]
    assert ok_json(redis_url, app.prefix, "jobs", "cancelled")["items"] == []


async def test_maintenance_drops_entries_whose_record_expired(app: App, redis: Redis) -> None:
    q = app.queue(app.default_queue)
    for i in range(20):
        await q.enqueue("t", (i,))
    done = await complete_all(q, redis)
    keys = q._keys
    # the oldest 15 records expire, and one among the kept ones
    for job_id in [*done[:15], done[18]]:
        await redis.delete(keys.job(job_id))
    await redis.zadd(keys.cancelled, {"gone": 1})
    await q.reap()
    left = [text(m) for m in await redis.zrange(keys.completed, 0, -1)]
    assert left == [*done[15:18], done[19]]
    assert await redis.exists(keys.cancelled) == 0
    # an index left with only expired entries goes entirely
    for job_id in left:
        await redis.delete(keys.job(job_id))
    await q.reap()
    assert await redis.exists(keys.completed) == 0
