"""The operator's API of ``Queue`` on a real server: paged listings of every indexed state, job
detail, throughput, groups, and the bulk actions (requeue, promote, purge, cancel), including
paging through 100,000 jobs while a worker takes them and purging one group while others run."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import pytest
from redis.asyncio import Redis

from aioqueue import (
    App,
    ConfigurationError,
    GroupInfo,
    JobDetail,
    JobNotFound,
    JobPage,
    JobState,
    Queue,
    Throughput,
    Worker,
)
from aioqueue._queue.lister import Lister
from aioqueue._store.scripts import QueueScripts

from .support.apps import drop_keys
from .support.invariants import check_invariants
from .support.server import text
from .support.waiting import wait_until


async def listing(
    q: Queue, state: str, limit: int = 7, **filters: Any
) -> tuple[list[str], list[JobPage]]:
    """Every id of one listing, page by page (asserting no id comes twice)."""
    ids: list[str] = []
    pages = []
    cursor = None
    while True:
        page = await q.jobs(state, limit=limit, cursor=cursor, **filters)
        pages.append(page)
        assert len(page.items) <= limit
        ids += [j.id for j in page.items]
        cursor = page.cursor
        if cursor is None:
            break
    assert len(ids) == len(set(ids)), "a job was listed twice"
    return ids, pages


async def dead_letters(app: App, n: int, task: str = "boom", group: str | None = None) -> list[str]:
    """``n`` dead letters of ``task`` made through the pull API (one attempt each)."""
    q = app.queue(app.default_queue)
    jobs = [await q.enqueue(task, (i,), group=group, max_attempts=1) for i in range(n)]
    while reserved := await q.reserve(1000):
        for r in reserved:
            await q.fail(r, RuntimeError(f"boom {r.args[0]}"), retry=False)
    return [j.id for j in jobs]


# ---------------------------------------------------------------------- listings
async def test_each_state_is_listed_page_by_page_once(app: App, redis: Redis) -> None:
    q = app.queue(app.default_queue)
    sched = [(await q.enqueue("t", (i,), delay=3600 + i)).id for i in range(20)]
    plain = [(await q.enqueue("t", (i,))).id for i in range(15)]
    prio = [(await q.enqueue("t", (i,), priority=5)).id for i in range(4)]
    grouped = [(await q.enqueue("t", (i,), group=f"g{i % 3}")).id for i in range(12)]
    assert (await listing(q, "scheduled"))[0] == sched  # by due time
    queued, _ = await listing(q, "queued")
    assert sorted(queued) == sorted(plain + prio + grouped)
    assert queued[: len(prio) + len(plain)] == prio + plain  # the default lane first, in order
    newest, _ = await listing(q, "scheduled", newest_first=True)
    assert newest == sched[::-1]
    assert (await listing(q, "queued", newest_first=True))[0] == queued[::-1]
    reserved = await q.reserve(3)
    active, _ = await listing(q, "active", limit=2)
    assert sorted(active) == sorted(r.id for r in reserved)
    page = await q.jobs("queued", group="g1", limit=100)
    assert {j.group for j in page.items} == {"g1"}
    assert len(page.items) == 4 - sum(
        1 for r in reserved if r.id in grouped and int(r.args[0]) % 3 == 1
    )
    for r in reserved:
        await q.fail(r, ValueError("bad input"), retry=False)
    dead = await q.jobs("failed", limit=10)
    assert {j.id for j in dead.items} == {r.id for r in reserved}
    assert dead.cursor is None
    assert {j.error.type for j in dead.items if j.error} == {"ValueError"}
    assert all(j.state is JobState.FAILED and j.task == "t" for j in dead.items)
    await check_invariants(redis, q._keys)


async def test_filters_by_task_and_group_and_refuses_unknown_states(app: App) -> None:
    q = app.queue(app.default_queue)
    for i in range(30):
        await q.enqueue("a" if i % 2 else "b", (i,), delay=60, group="x" if i % 3 else "y")
    a, _ = await listing(q, "scheduled", task="a")
    assert len(a) == 15
    ax, _ = await listing(q, "scheduled", task="a", group="x")
    assert len(ax) == 10
    waiting, _ = await listing(q, "waiting")  # every state is listed (waiting: since workflows)
    assert waiting == []
    with pytest.raises(ConfigurationError, match="unknown state"):
        await q.jobs("sleeping")
    with pytest.raises(ConfigurationError, match="invalid cursor"):
        await q.jobs("queued", cursor="not-a-cursor")


async def test_ties_in_score_are_paged_without_loss_or_repeats(app: App) -> None:
    q = app.queue(app.default_queue)
    at = time.time() + 3600  # one due time for all: every score ties
    ids = {(await q.enqueue("t", (i,), at=at)).id for i in range(40)}
    for limit in (1, 3, 40):
        got, _ = await listing(q, "scheduled", limit=limit)
        assert set(got) == ids
        back, _ = await listing(q, "scheduled", limit=limit, newest_first=True)
        assert back == got[::-1]


# ---------------------------------------------------------------------- detail
async def test_job_detail_shows_args_options_result_error_and_lease(app: App) -> None:
    q = app.queue(app.default_queue)
    job = await q.enqueue("t", (1, 2), {"k": "v"}, group="g", priority=3, timeout=5)
    [r] = await q.reserve(1)
    d = await q.job_detail(job.id)
    assert isinstance(d, JobDetail)
    assert d.info.state is JobState.ACTIVE
    assert d.lease_deadline_ms is not None
    assert d.info.args == (1, 2)
    assert d.info.kwargs == {"k": "v"}
    assert d.group == "g"
    assert d.info.priority == 3
    assert d.options == {"timeout": 5}
    await q.complete(r, {"ok": True})
    d = await q.job_detail(job.id)
    assert d.info.state is JobState.COMPLETED
    assert d.result == {"ok": True}
    assert d.info.finished_ms is not None
    assert d.lease_deadline_ms is None
    [dead] = await dead_letters(app, 1)
    d = await q.job_detail(dead)
    assert d.info.error is not None
    assert d.info.error.message == "boom 0"
    assert d.info.error.traceback is None or isinstance(d.info.error.traceback, str)
    with pytest.raises(JobNotFound):
        await q.job_detail("no-such-job")


# ---------------------------------------------------------------------- dead letters
async def test_requeue_by_id_and_by_filter_resets_attempts(app: App, redis: Redis) -> None:
    q = app.queue(app.default_queue)
    boom = await dead_letters(app, 5, "boom")
    bang = await dead_letters(app, 3, "bang", group="g")
    assert await q.requeue([boom[0], "no-such-job"]) == 1
    info = await q.job_info(boom[0])
    assert info.state is JobState.QUEUED
    assert info.attempts == 0
    assert info.error is None
    assert await q.requeue(task="bang") == 3
    assert {(await q.job_info(i)).state for i in bang} == {JobState.QUEUED}
    assert (await q.counts())["failed"] == 4
    with pytest.raises(ConfigurationError, match="all=True"):
        await q.requeue()
    assert await q.requeue(since=time.time() + 60) == 0
    assert await q.requeue(all=True) == 4
    assert (await q.counts()) == {"scheduled": 0, "queued": 8, "active": 0, "failed": 0}
    assert (await q.stats())["requeued"] == 8
    await check_invariants(redis, q._keys)


# 10,000 jobs dead-lettered, then run by a worker: on a busy machine, under coverage, that can
# take minutes (the backstops below are for a hang; nothing here asserts a duration)
@pytest.mark.no_cover  # a test of scale: coverage paused (tests/conftest.py, "Coverage")
@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_requeue_all_of_10000_dead_letters_then_a_fixed_worker_completes_them(
    app: App, redis: Redis
) -> None:
    q = app.queue(app.default_queue)

    @app.task(max_attempts=1)
    async def flaky(i: int) -> int:
        return i

    await flaky.enqueue_many([((i,), {}) for i in range(10_000)])
    # each fails its only attempt (through the pull API: a worker's failing runs, traceback
    # and all, are tested on their own)
    while got := await q.reserve(1000):
        assert not any(await asyncio.gather(*(q.fail(r, "not yet") for r in got)))
    assert (await q.counts())["failed"] == 10_000
    assert (await q.throughput(5)).failed == 10_000
    t0 = time.monotonic()
    assert await q.requeue(all=True) == 10_000
    took = time.monotonic() - t0
    assert (await q.counts())["queued"] == 10_000
    await check_invariants(redis, q._keys)
    await asyncio.wait_for(Worker(app, concurrency=50, burst=True).run(), 280)  # fixed now
    counts = await q.counts()
    assert counts == {"scheduled": 0, "queued": 0, "active": 0, "failed": 0}
    assert (await q.throughput(5)).completed == 10_000
    print(f"requeue of 10,000 dead letters: {took:.2f} s")
    await drop_keys(redis, app.prefix)


async def test_purge_dead_letters_by_filter_and_ids(app: App, redis: Redis) -> None:
    q = app.queue(app.default_queue)
    boom = await dead_letters(app, 4, "boom")
    await dead_letters(app, 3, "bang")
    assert await q.purge("failed", task="bang") == 3
    assert await q.purge(job_ids=[boom[0]]) == 1
    with pytest.raises(JobNotFound):
        await q.job_info(boom[0])
    assert await q.purge("failed") == 3
    assert (await q.counts())["failed"] == 0
    with pytest.raises(ConfigurationError, match="cancel"):
        await q.purge("active")
    await check_invariants(redis, q._keys)


# ---------------------------------------------------------------------- scheduled, cancel
async def test_promote_and_cancel_by_filter(app: App, redis: Redis) -> None:
    q = app.queue(app.default_queue)
    ids = [(await q.enqueue("a" if i < 5 else "b", (i,), delay=3600)).id for i in range(10)]
    assert await q.promote([ids[0]]) == 1
    assert (await q.job_info(ids[0])).state is JobState.QUEUED
    assert await q.promote(task="a") == 4
    assert (await q.counts())["scheduled"] == 5
    [r] = await q.reserve(1)
    assert await q.cancel(task="b") == 5
    assert await q.cancel(task="a") == 5  # four queued, one running asked to stop
    assert (await q.job_info(r.id)).state is JobState.ACTIVE
    d = await q.job_detail(r.id)
    assert d.cancel_requested
    assert (await q.counts()) == {"scheduled": 0, "queued": 0, "active": 1, "failed": 0}
    await check_invariants(redis, q._keys)


# ---------------------------------------------------------------------- purge
async def test_purge_queue_counts_what_it_removed_and_leaves_running_jobs(
    app: App, redis: Redis
) -> None:
    q = app.queue(app.default_queue)

    @app.task(name="t")
    async def t(i: int) -> None:
        return None

    await dead_letters(app, 2)
    await t.enqueue_many([((i,), {}) for i in range(1500)])  # more than one chunk
    for i in range(7):
        await q.enqueue("t", (i,), priority=2)
        await q.enqueue("t", (i,), group=f"g{i % 2}")
        await q.enqueue("t", (i,), delay=600)
    [running] = await q.reserve(1)
    removed = await q.purge_queue()
    assert removed == {
        "queued": 1500 + 7 + 7 - 1,
        "scheduled": 7,
        "failed": 2,
        "completed": 0,
        "cancelled": 0,
    }
    assert (await q.counts()) == {"scheduled": 0, "queued": 0, "active": 1, "failed": 0}
    await q.complete(running, 1)
    await check_invariants(redis, q._keys)


async def test_purge_plain_lane_in_chunks(app: App, redis: Redis) -> None:
    @app.task
    async def t(i: int) -> None:
        return None

    await t.enqueue_many([((i,), {}) for i in range(2500)])
    q = app.queue(app.default_queue)
    assert await q.purge("queued") == 2500
    assert (await q.counts())["queued"] == 0
    assert await check_invariants(redis, q._keys) == {}


async def test_purging_one_group_leaves_the_others_running(app: App, redis: Redis) -> None:
    q = app.queue(app.default_queue)
    done: dict[str, int] = {}

    @app.task
    async def work(g: str, i: int) -> None:
        done[g] = done.get(g, 0) + 1
        await asyncio.sleep(0.001)

    for g in ("a", "b", "c"):
        await work.options(group=g).enqueue_many([((g, i), {}) for i in range(400)])
    await q.set_group_limit("b", 2)
    async with Worker(app, concurrency=6, grace=5):
        await wait_until(lambda: done.get("a", 0) > 0, 30, what="group a to start")
        purged = await q.purge("queued", group="a")
        assert purged > 0
        await wait_until(
            lambda: done.get("b", 0) == 400 and done.get("c", 0) == 400,
            120,
            what="groups b and c to finish",
        )
    assert done["a"] + purged == 400  # every job of a either ran or was purged, not both
    states = await check_invariants(redis, q._keys)
    assert set(states.values()) <= {"completed"}
    groups = {g.name: g for g in await q.groups()}
    assert groups["b"].limit == 2
    assert groups["b"].queued == 0


# ---------------------------------------------------------------------- throughput, groups
async def test_throughput_counts_completions_and_dead_letters_per_minute(app: App) -> None:
    q = app.queue(app.default_queue)
    for i in range(3):
        await q.enqueue("t", (i,))
    for r in await q.reserve(3):
        await q.complete(r, None)
    await dead_letters(app, 2)
    tp = await q.throughput(60)
    assert isinstance(tp, Throughput)
    assert len(tp.minutes) == 60
    assert (tp.completed, tp.failed) == (3, 2)
    assert tp.minutes[-1].completed + tp.minutes[-2].completed == 3
    assert tp.minutes[0].start_ms < tp.minutes[-1].start_ms


async def test_groups_show_limit_rate_pause_and_counts(app: App) -> None:
    q = app.queue(app.default_queue)
    for i in range(3):
        await q.enqueue("t", (i,), group="acme")
    await q.enqueue("t", group="zed")
    await q.set_group_limit("acme", 4)
    await q.set_rate_limit(10, 2.0, group="acme")
    await q.pause("zed")
    await q.reserve(1)
    groups = await q.groups()
    assert groups == [
        GroupInfo("acme", queued=2, active=1, limit=4, rate=10, rate_seconds=2.0, paused=False),
        GroupInfo("zed", queued=1, active=0, limit=None, rate=None, rate_seconds=None, paused=True),
    ]
    assert [g.name for g in await q.groups(limit=1)] == ["acme"]


# ---------------------------------------------------------------------- paging at scale
@pytest.mark.no_cover  # a test of scale: coverage paused (tests/conftest.py, "Coverage")
@pytest.mark.slow
@pytest.mark.timeout(600)  # 100,000 jobs stored and checked: minutes on a busy machine
async def test_paging_100000_queued_jobs_while_a_worker_takes_them(app: App, redis: Redis) -> None:
    q = app.queue(app.default_queue)

    @app.task
    async def work(i: int) -> None:
        await asyncio.sleep(0.002)

    for lo in range(0, 60_000, 10_000):
        await work.enqueue_many([((i,), {}) for i in range(lo, lo + 10_000)])
    for g in range(4):
        await work.options(group=f"g{g}").enqueue_many([((i,), {}) for i in range(10_000)])
    seen: list[str] = []
    worker = Worker(app, concurrency=20, grace=5, prefetch=0)  # none leased, unstarted
    runner = asyncio.create_task(worker.run())
    try:
        await wait_until(lambda: worker.running_jobs > 0, 30, what="the worker to start")
        cursor = None
        pages = 0
        t0 = time.monotonic()
        while True:
            page = await q.jobs("queued", limit=1000, cursor=cursor)
            seen += [j.id for j in page.items]
            pages += 1
            cursor = page.cursor
            if cursor is None:
                break
        took = time.monotonic() - t0
    finally:
        worker.stop()
        await asyncio.wait_for(runner, 60)
    assert len(seen) == len(set(seen)), "a job was listed twice"
    states = await check_invariants(redis, q._keys)
    still = {i for i, s in states.items() if s == "queued"}
    assert still, "the worker took every job before the listing ended: nothing was checked"
    missed = still - set(seen)
    assert not missed, f"{len(missed)} of {len(still)} jobs stayed queued but were missed"
    assert len(seen) < 100_000 + 1
    print(f"{pages} pages of 1,000 in {took:.2f} s ({1000 * took / pages:.1f} ms a page)")
    await drop_keys(redis, app.prefix)


async def test_throughput_buckets_stay_bounded(app: App, redis: Redis) -> None:
    q = app.queue(app.default_queue)
    tp = q._keys.throughput
    sec, _ = await redis.time()
    minute = int(sec) // 60
    # counts left from long ago: 70 minutes (inside the window the next minute trims) and 5
    await redis.hset(tp, mapping={f"c:{minute - 70}": 9, f"c:{minute - 5}": 4})
    await q.enqueue("t")
    [r] = await q.reserve(1)
    await q.complete(r, None)  # the first count of this minute trims the old ones
    fields = {text(k) for k in await redis.hkeys(tp)}
    assert f"c:{minute - 70}" not in fields
    assert f"c:{minute - 5}" in fields
    assert 0 < await redis.pttl(tp) <= 61 * 60_000
    assert (await q.throughput(60)).completed == 5


async def test_a_consumer_popping_a_lane_between_reads_makes_no_page_skip_a_job(
    app: App,
) -> None:
    """A consumer takes jobs off the head of the lane being listed between every two reads of
    the listing (a real ZPOPMIN on the server, run at the worst moment, deterministically)."""
    q = app.queue(app.default_queue)
    ids = [(await q.enqueue("t", (i,), group="g")).id for i in range(60)]
    popped: set[str] = set()

    class Popping(QueueScripts):
        async def zpage(self, *args: Any, **kwargs: Any) -> list[tuple[bytes, float]]:
            got = await super().zpage(*args, **kwargs)
            taken = await self.client.zpopmin(self.keys.lane("g"), 3)
            popped.update(text(pair[0]) for pair in cast(list[tuple[bytes, float]], taken))
            return got

    lister = Lister(Popping(app.redis, q._keys), JobState.QUEUED, group="g")
    listed = [i async for page in lister.pages(5) for i in page]
    assert len(listed) == len(set(listed))
    missed = set(ids) - popped - set(listed)
    assert not missed, f"{len(missed)} jobs that stayed in the lane were not listed"
    assert popped
    assert set(ids) - popped
