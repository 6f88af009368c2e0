"""Coalesced enqueues (_coalesce.py): single-job enqueues that arrive while one is in flight
share one enqueue.lua call, without weakening what ``await enqueue(...)`` promises: when it
returns the job is stored, each caller gets its own result or its own error, and cancelling
a caller neither loses nor duplicates another caller's job."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from functools import partial
from typing import Any

import pytest
from redis.asyncio import Redis

from aioqueue import App, Job, PayloadTooLarge, SerializationError, ServerUnavailable
from aioqueue._model.exceptions import ServerRefused
from aioqueue._model.record import JobRecord
from aioqueue._queue.coalesce import MAX_JOBS, Coalescer
from aioqueue._queue.queue import Queue
from aioqueue._store.embedded import EmbeddedServer
from aioqueue._store.scripts import QueueScripts

from .support.apps import open_app
from .support.server import text
from .support.waiting import wait_until


class CountingScripts(QueueScripts):
    """The real scripts of one queue, recording the jobs of each enqueue call; the first
    call can be held until ``release`` is set, and a job id in ``refuse`` makes a call
    that carries it fail the way an error reply does."""

    def __init__(self, queue: Queue, hold: bool = False, hold_at: int = 1) -> None:
        super().__init__(queue.app.redis, queue._keys)
        self.hold_at = hold_at
        self.batches: list[list[str]] = []
        self.held = asyncio.Event()
        self.go = asyncio.Event()
        if not hold:
            self.go.set()
        self.refuse: set[str] = set()
        queue._scripts_obj = self

    async def enqueue_codes(self, jobs: Sequence[JobRecord]) -> list[Any]:
        self.batches.append([j.id for j in jobs])
        if len(self.batches) == self.hold_at:
            self.held.set()
            await self.go.wait()
        if self.refuse & {j.id for j in jobs}:
            raise ServerRefused("refused (a job of this call)")
        return await super().enqueue_codes(jobs)


async def stored_ids(redis: Redis, queue: Queue) -> list[str]:
    """The ids in the queue's plain FIFO lane, in order (duplicates kept)."""
    return [text(x) for x in await redis.lrange(queue._keys.ready, 0, -1)]


def pending(queue: Queue) -> int:
    return len(queue.coalescer._pending)


async def test_concurrent_enqueues_share_one_call_and_each_caller_gets_its_own_job(
    app: App, redis: Redis
) -> None:
    q = app.queue("co")
    scripts = CountingScripts(q, hold=True)
    first = asyncio.create_task(q.enqueue("t", args=[0], job_id="j0"))
    await asyncio.wait_for(scripts.held.wait(), 10)
    rest = [asyncio.create_task(q.enqueue("t", args=[i], job_id=f"j{i}")) for i in range(1, 100)]
    await wait_until(lambda: pending(q) == 99, what="99 enqueues waiting for the call in flight")
    scripts.go.set()
    jobs = [await first, *await asyncio.gather(*rest)]

    assert [j.id for j in jobs] == [f"j{i}" for i in range(100)]
    # (in the order the callers reached the coalescer: enqueue by name reads the task table
    # first, so concurrent callers arrive in any order)
    assert [sorted(b) for b in scripts.batches] == [["j0"], sorted(f"j{i}" for i in range(1, 100))]
    assert sorted(await stored_ids(redis, q)) == sorted(f"j{i}" for i in range(100))
    for i in (0, 1, 57, 99):  # each job holds its own caller's arguments
        info = await q.job_info(f"j{i}")
        assert info.args == (i,)
    assert (await q.stats())["enqueued"] == 100


async def test_a_lone_enqueue_is_sent_at_once_by_its_caller(app: App) -> None:
    q = app.queue("co")
    scripts = CountingScripts(q)
    for i in range(3):
        await q.enqueue("t", job_id=f"j{i}")
    assert scripts.batches == [["j0"], ["j1"], ["j2"]]
    assert q.coalescer._task is None  # no task: the caller sent it itself


async def test_many_concurrent_enqueues_all_stored_distinct(app: App, redis: Redis) -> None:
    q = app.queue("co")

    @app.task(queue="co")
    async def work(n: int) -> int:
        return n

    jobs = await asyncio.gather(*(work.enqueue(i) for i in range(3 * MAX_JOBS)))
    ids = [j.id for j in jobs]
    assert len(set(ids)) == len(ids)
    assert sorted(await stored_ids(redis, q)) == sorted(ids)
    for i in (0, MAX_JOBS, 3 * MAX_JOBS - 1):
        assert (await q.job_info(ids[i])).args == (i,)


async def test_errors_reach_only_their_own_callers(app: App, redis: Redis) -> None:
    q = app.queue("co")
    scripts = CountingScripts(q, hold=True)
    scripts.refuse = {"bad"}
    first = asyncio.create_task(q.enqueue("t", job_id="first"))
    await asyncio.wait_for(scripts.held.wait(), 10)
    calls = {
        "good1": q.enqueue("t", job_id="good1"),
        "bad": q.enqueue("t", job_id="bad"),  # the server refuses the call that carries it
        "toolarge": q.enqueue("t", args=["x" * (app.max_payload_bytes + 1)]),
        "notjson": q.enqueue("t", args=[object()]),
        "u1": q.enqueue("t", job_id="u1", unique=True, unique_key="k"),
        "u2": q.enqueue("t", job_id="u2", unique=True, unique_key="k"),  # u1 holds the lock
        "good2": q.enqueue("t", job_id="good2", delay=3600),
    }
    tasks = {name: asyncio.create_task(c) for name, c in calls.items()}
    await wait_until(lambda: pending(q) == 5, what="the valid enqueues waiting")
    scripts.go.set()
    outcomes = await asyncio.gather(*tasks.values(), return_exceptions=True)
    results = dict(zip(tasks, outcomes, strict=True))
    await first

    assert isinstance(results["bad"], ServerRefused)
    assert isinstance(results["toolarge"], PayloadTooLarge)
    assert isinstance(results["notjson"], SerializationError)
    for name in ("good1", "good2"):
        job = results[name]
        assert isinstance(job, Job)
        assert job.id == name
    # u1 and u2 share a unique key: whichever reached the coalescer first (enqueue by name
    # reads the task table first, so either may) holds it, and the other gets that job back
    u1, u2 = results["u1"], results["u2"]
    assert isinstance(u1, Job)
    assert isinstance(u2, Job)
    assert u1.id == u2.id
    assert u1.id in ("u1", "u2")
    assert await redis.exists(q._keys.job("u2" if u1.id == "u1" else "u1")) == 0
    assert await redis.exists(q._keys.job("bad")) == 0
    assert sorted(await stored_ids(redis, q)) == sorted(["first", "good1", u1.id])
    assert (await q.job_info("good2")).state.value == "scheduled"
    # the refused call was retried job by job: only "bad" failed
    assert len(scripts.batches[1]) == 5
    assert ["bad"] in scripts.batches


def idle(c: Coalescer) -> bool:
    return c._task is None and not c._busy


async def test_cancelled_callers_never_lose_or_duplicate_jobs(app: App, redis: Redis) -> None:
    rng = random.Random(17)
    for round_ in range(8):
        q = app.queue(f"cancel{round_}")
        ids = [f"r{round_}-{i}" for i in range(120)]
        tasks = [asyncio.create_task(q.enqueue("t", args=[i], job_id=j)) for i, j in enumerate(ids)]
        victims = set(rng.sample(range(len(ids)), 40))
        for i in sorted(victims, key=lambda _: rng.random()):
            for _ in range(rng.randrange(4)):  # a random point: queued, sent or in flight
                await asyncio.sleep(0)
            tasks[i].cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        # the shared call of cancelled callers may still be in flight: count once it is done
        await wait_until(partial(idle, q.coalescer), what="the shared calls done")
        stored = await stored_ids(redis, q)
        assert len(stored) == len(set(stored)), "a job was stored twice"
        finished = {ids[i] for i, o in enumerate(outcomes) if isinstance(o, Job)}
        assert finished <= set(stored), "a job whose enqueue returned is not stored"
        for i, outcome in enumerate(outcomes):
            if i not in victims:
                assert isinstance(outcome, Job)
                assert outcome.id == ids[i]
        # a job that waited for a shared call is stored even if its caller was cancelled
        assert len(stored) >= len(ids) - len(victims)
        assert (await q.stats())["enqueued"] == len(stored)


async def test_a_waiting_caller_cancelled_still_gets_its_job_stored(app: App, redis: Redis) -> None:
    q = app.queue("co")
    scripts = CountingScripts(q, hold=True)
    first = asyncio.create_task(q.enqueue("t", job_id="first"))
    await asyncio.wait_for(scripts.held.wait(), 10)
    waiting = asyncio.create_task(q.enqueue("t", job_id="waiting"))
    other = asyncio.create_task(q.enqueue("t", job_id="other"))
    await wait_until(lambda: pending(q) == 2, what="two enqueues waiting")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    scripts.go.set()
    assert (await first).id == "first"
    assert (await other).id == "other"
    await wait_until(lambda: q.coalescer._task is None, what="the shared call done")
    assert sorted(await stored_ids(redis, q)) == ["first", "other", "waiting"]


async def test_a_killed_connection_mid_batch_loses_no_returned_job(
    fresh_server: EmbeddedServer,
) -> None:
    admin = Redis.from_url(fresh_server.url)
    try:
        async with open_app(fresh_server.url) as app:
            q = app.queue("co")
            await q.enqueue("t", job_id="warm")
            me = int(await admin.client_id())
            done = asyncio.Event()

            async def killer() -> int:
                kills = 0
                while not done.is_set():
                    for c in await admin.client_list():
                        if int(c["id"]) != me:
                            await admin.client_kill_filter(_id=str(c["id"]))
                            kills += 1
                    await asyncio.sleep(0.002)
                return kills

            async def one(i: int) -> Job[Any] | ServerUnavailable:
                try:
                    return await q.enqueue("t", args=[i], job_id=f"k{i}")
                except ServerUnavailable as exc:
                    return exc

            kill_task = asyncio.create_task(killer())
            outcomes: list[Job[Any] | ServerUnavailable] = []
            for start in range(0, 2000, 200):
                outcomes += await asyncio.gather(*(one(i) for i in range(start, start + 200)))
            done.set()
            assert await kill_task > 0

            stored = await stored_ids(admin, q)
            assert len(stored) == len(set(stored)), "a job was stored twice"
            returned = {o.id for o in outcomes if isinstance(o, Job)}
            assert returned <= set(stored), "a job whose enqueue returned is not stored"
            assert returned, "no enqueue got through"
            # the coalescer is not stuck: the next enqueue goes through
            assert (await q.enqueue("t", job_id="after")).id == "after"
            assert not q.coalescer._busy
    finally:
        await admin.aclose()


async def test_a_coalescer_follows_its_queue_to_another_client(app: App) -> None:
    q = app.queue("co")
    c = q.coalescer
    assert isinstance(c, Coalescer)
    assert c.scripts is q._scripts
    assert q.coalescer is c  # cached while the client is the same


async def test_callers_of_a_cancelled_shared_call_are_not_left_waiting(app: App) -> None:
    """The task that sends a shared call is cancelled (the loop is closing): its callers'
    awaits end with CancelledError instead of waiting for ever."""
    q = app.queue("co")
    scripts = CountingScripts(q, hold=True)
    first = asyncio.create_task(q.enqueue("t", job_id="first"))  # the lone call, held
    await asyncio.wait_for(scripts.held.wait(), 10)
    waiting = [asyncio.create_task(q.enqueue("t", job_id=f"w{i}")) for i in range(3)]
    await wait_until(lambda: pending(q) == 3, what="the three enqueues behind it")
    # let the lone call go, and hold the next one: the call the three share
    release, scripts.go, scripts.held, scripts.hold_at = (
        scripts.go,
        asyncio.Event(),
        asyncio.Event(),
        2,
    )
    release.set()
    assert (await first).id == "first"
    await asyncio.wait_for(scripts.held.wait(), 10)  # the shared call, held
    assert scripts.batches[1] == ["w0", "w1", "w2"] or sorted(scripts.batches[1]) == [
        "w0",
        "w1",
        "w2",
    ]
    task = q.coalescer._task
    assert task is not None
    task.cancel()
    for w in waiting:
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(w, 10)
    assert not q.coalescer._busy
    assert (await q.enqueue("t", job_id="after")).id == "after"  # and the queue goes on
