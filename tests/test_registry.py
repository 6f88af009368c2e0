"""The worker registry (issue 19 §1): no job waits on, or is charged for, a worker that is gone.

Every worker registers on its queues and renews that with each heartbeat (lua/beat.lua); a
worker three heartbeats late is dead, and the next claim of a live worker (or reap) buries it:
its jobs are handed back at once, not when their leases run out, and those it never started
get their attempt back. Hand-off goes only to workers whose registration is fresh. Store-level
tests drive the scripts by hand (a "worker" nobody runs); process tests kill real workers.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from datetime import timedelta
from uuid import uuid4

import pytest
from redis.asyncio import Redis

import aioqueue
from aioqueue import App, ConfigurationError, JobFailed, JobState, Worker

from .support.apps import open_app
from .support.invariants import check_invariants
from .support.processes import WorkerProcesses, run_records, side_effects
from .support.server import server_ms, text
from .support.waiting import wait_until

LEASE_MS = 60_000
DEAD_TTL_MS = 3_600_000
INFO = ("h", 1, "0", "default", 4, 0, 0, 0, 0)


async def beat(app: App, wid: str, period_ms: int, started: int = 0) -> None:
    await app.queue()._scripts.beat(wid, period_ms, LEASE_MS, started, INFO, [], DEAD_TTL_MS)


async def past(redis: Redis, ms: int) -> None:
    async def after() -> bool:
        return await server_ms(redis) > ms

    await wait_until(after, interval=0.01, what="the server clock to pass a deadline")


# ---------------------------------------------------------------------- store level
async def test_reap_buries_a_dead_worker_and_refunds_what_it_never_started(
    app: App, redis: Redis
) -> None:
    q = app.queue()
    scripts = q._scripts
    await beat(app, "dead", period_ms=200)
    jobs = [await q.enqueue("t", max_attempts=1) for _ in range(4)]
    # it starts the first two at once (two free slots); the other two wait in its buffer
    res = await scripts.claim(4, LEASE_MS, DEAD_TTL_MS, "dead", 0, started=(0, 2))
    assert [c.id for c in res.jobs] == [j.id for j in jobs]
    assert await redis.scard(q._keys.worker_jobs("dead")) == 4
    assert [w.jobs_held for w in await q.workers()] == [4]
    await past(redis, await server_ms(redis) + 200)
    assert [w.alive for w in await q.workers()] == [False]
    # long before the leases (60 s) run out
    assert (await q.reap())["recovered"] == 4
    states = await check_invariants(redis, q._keys)
    # started with max_attempts=1: dead; never started: back in the queue, attempt refunded,
    # one runnable now and the next 100 ms later (recovered jobs are spread)
    assert [states[j.id] for j in jobs[:2]] == ["failed", "failed"]
    assert sorted(states[j.id] for j in jobs[2:]) == ["queued", "scheduled"]
    assert [(await j.info()).attempts for j in jobs[2:]] == [0, 0]
    failed = await jobs[0].info()
    assert failed.error is not None
    assert failed.error.type == "LeaseExpired"
    assert await q.workers() == []
    assert await redis.exists(q._keys.worker("dead"), q._keys.worker_jobs("dead")) == 0
    assert (await q.stats())["buried"] == 1


@pytest.mark.parametrize(
    ("first_free", "charged"),
    [(4, 6), (2, 2)],
    ids=["the first claims jobs all start", "some of the first claims jobs wait"],
)
async def test_a_claim_sent_behind_another_counts_its_own_jobs_started(
    app: App, redis: Redis, first_free: int, charged: int
) -> None:
    """A busy worker sends a claim before the reply to the one in flight is in (fetch.py):
    its report still says 0 started, and its free slots are what the first claim's jobs leave.
    When the first claim's jobs all start at once, the server counts the second's right after
    them, so a death charges the attempts of every job that ran; when some of the first's
    wait in the buffer, the second's count for nothing, and nothing that never ran is
    charged."""
    q = app.queue()
    scripts = q._scripts
    await beat(app, "dead", period_ms=200)
    jobs = [await q.enqueue("t", max_attempts=1) for _ in range(8)]
    first = await scripts.claim(4, LEASE_MS, DEAD_TTL_MS, "dead", 0, started=(0, first_free))
    # sent before that reply came: 6 free slots, 4 of them promised to the first claim's jobs
    second = await scripts.claim(4, LEASE_MS, DEAD_TTL_MS, "dead", 0, started=(0, 2))
    assert [c.id for c in [*first.jobs, *second.jobs]] == [j.id for j in jobs]
    assert text(await redis.hget(q._keys.worker("dead"), "sn")) == str(charged)
    await past(redis, await server_ms(redis) + 200)
    assert (await q.reap())["recovered"] == 8
    states = await check_invariants(redis, q._keys)
    assert [states[j.id] for j in jobs[:charged]] == ["failed"] * charged
    assert all(states[j.id] in ("queued", "scheduled") for j in jobs[charged:])


async def test_a_live_workers_claim_buries_a_dead_one(app: App, redis: Redis) -> None:
    q = app.queue()
    scripts = q._scripts
    await beat(app, "dead", period_ms=200)
    await beat(app, "alive", period_ms=60_000)
    job = await q.enqueue("t")
    res = await scripts.claim(1, LEASE_MS, DEAD_TTL_MS, "dead", 0, started=(0, 1))
    assert [c.attempt for c in res.jobs] == [1]
    await past(redis, await server_ms(redis) + 200)
    # the live worker's claim buries the dead one and gets its job
    res = await scripts.claim(1, LEASE_MS, DEAD_TTL_MS, "alive", 0, started=(0, 1))
    assert [(c.id, c.attempt) for c in res.jobs] == [(job.id, 2)]  # it had started: charged
    assert [w.id for w in await q.workers()] == ["alive"]


async def test_no_hand_off_to_a_worker_whose_registration_ran_out(app: App, redis: Redis) -> None:
    q = app.queue()
    scripts = q._scripts
    await beat(app, "dead", period_ms=200)
    await scripts.claim(5, LEASE_MS, DEAD_TTL_MS, "dead", 60_000, started=(0, 5))  # parks
    await past(redis, await server_ms(redis) + 200)
    job = await q.enqueue("t")
    assert await redis.exists(q._keys.hand("dead")) == 0
    assert (await check_invariants(redis, q._keys))[job.id] == "queued"
    assert await redis.zrange(q._keys.idle, 0, -1) == []  # its parking was dropped


async def test_hand_off_prefers_a_worker_with_an_empty_hand_list(app: App, redis: Redis) -> None:
    q = app.queue()
    scripts = q._scripts
    for wid, park_ms in (("a", 61_000), ("b", 60_000)):
        await beat(app, wid, period_ms=60_000)
        await scripts.claim(5, LEASE_MS, DEAD_TTL_MS, wid, park_ms, started=(0, 5))
    first = await q.enqueue("t")
    second = await q.enqueue("t")
    # "a" parks longest ahead and gets the first; it has room left, but the second goes to
    # "b", whose hand list is empty (a worker that died parked keeps its list full)
    hand_a = await redis.lrange(q._keys.hand("a"), 0, -1)
    hand_b = await redis.lrange(q._keys.hand("b"), 0, -1)
    assert (text(hand_a[0]), text(hand_b[0])) == (first.id, second.id)


# ---------------------------------------------------------------------- the registry
async def test_a_running_worker_is_listed_with_what_it_is(redis_url: str) -> None:
    async with open_app(redis_url, heartbeat=0.1) as app:

        @app.task
        async def ok() -> int:
            return 1

        q = app.queue()
        async with Worker(app, concurrency=3, grace=1) as worker:
            await (await ok.enqueue()).result(timeout=5)

            async def counted() -> bool:
                listed = await q.workers()
                return len(listed) == 1 and listed[0].done == 1

            await wait_until(counted, what="the heartbeat to report the job")
            [info] = await q.workers()
            assert isinstance(info, aioqueue.WorkerInfo)
            assert (info.id, info.host, info.pid) == (worker.id, socket.gethostname(), os.getpid())
            assert (info.version, info.queues, info.concurrency) == (
                aioqueue.__version__,
                ("default",),
                3,
            )
            assert info.alive
            assert info.failed == 0
            assert info.jobs_held == 0
            assert info.started is not None
            assert info.last_beat is not None
            assert info.last_beat >= info.started
        # a worker that stopped has left the registry
        assert await q.workers() == []


# ---------------------------------------------------------------------- unknown tasks
async def test_a_job_of_an_unknown_task_waits_for_a_worker_that_knows_it(
    redis_url: str, redis: Redis
) -> None:
    prefix = f"t{uuid4().hex[:12]}"
    async with App(redis_url, prefix=prefix) as old, App(redis_url, prefix=prefix) as new:

        @new.task
        async def added_later(x: int) -> int:
            return x * 2

        q = old.queue()
        job = await q.enqueue("added_later", args=[21])
        async with Worker(old, concurrency=2, grace=1, unknown_task_grace=30):

            async def handed_back() -> bool:
                raw = await redis.hmget(q._keys.job(job.id), ["s", "rl"])
                return raw[0] == b"scheduled" and raw[1] is not None

            await wait_until(handed_back, what="the old worker to hand the job back")
            info = await job.info()
            assert (info.state, info.attempts) == (JobState.SCHEDULED, 0)
            async with Worker(new, concurrency=2, grace=1):
                assert await job.result(timeout=20) == 42
        assert (await job.info()).attempts == 1


async def test_a_job_of_an_unknown_task_is_dead_lettered_after_the_grace(
    app: App, redis: Redis
) -> None:
    q = app.queue()
    job = await q.enqueue("nobody_knows", args=[1])
    async with Worker(app, concurrency=2, grace=1, unknown_task_grace=0.5):
        with pytest.raises(JobFailed) as failed:
            await job.result(timeout=20)
    assert failed.value.error_type == "UnknownTask"
    info = await job.info()
    assert info.finished_ms is not None
    assert info.finished_ms - info.created_ms >= 500  # handed back until the grace was over
    assert info.attempts == 1


# ---------------------------------------------------------------------- real processes
async def test_jobs_handed_to_a_killed_parked_worker_run_on_the_live_one_at_once(
    workers: WorkerProcesses, producer: App, redis: Redis, prefix: str
) -> None:
    """Two idle workers at concurrency 20; kill -9 one; enqueue 40 jobs right after: every
    job runs on the live worker, as its first attempt, long before a lease (30 s) runs out."""
    lease = 30.0
    victim = workers.start(lease=lease, concurrency=20)
    survivor = workers.start(lease=lease, concurrency=20)
    await workers.wait_idle(redis, victim, survivor)
    keys = producer.queue()._keys
    victim.signal(signal.SIGKILL)
    assert await victim.wait_exit(5) == -signal.SIGKILL
    jobs = [
        await producer.queue().enqueue("record", kwargs={"tag": str(i)}, max_attempts=1)
        for i in range(40)
    ]
    handed = set()
    for hand in await redis.keys(keys.base + "hand:*"):
        values = await redis.lrange(hand, 0, -1)
        handed |= {text(values[i]) for i in range(0, len(values), 7)}
    # the 40 jobs complete within about one heartbeat period (6 s), not the 30 s lease
    results = await asyncio.gather(*(j.result(timeout=lease - 5) for j in jobs))
    assert results == [survivor.pid] * 40
    runs = await run_records(redis, prefix)
    assert sorted((r.id, r.attempt) for r in runs) == sorted((j.id, 1) for j in jobs)
    stats = await producer.queue().stats()
    assert (stats["completed"], stats.get("failed", 0)) == (40, 0)
    print(f"\n{len(handed)} jobs were handed to the dead worker before it was buried")
    assert [w.pid for w in await producer.queue().workers()] == [survivor.pid]


async def test_a_poison_job_does_not_take_its_neighbours_with_it(
    workers: WorkerProcesses, producer: App, redis: Redis, prefix: str
) -> None:
    """One job that kills its worker among 40 normal jobs, max_attempts 3, while crashed
    workers are replaced: every normal job completes, the poison job is dead-lettered."""
    lease = 2.0
    q = producer.queue()
    normal = [await q.enqueue("record", kwargs={"tag": str(i)}, max_attempts=3) for i in range(20)]
    poison = await q.enqueue("poison", max_attempts=3)
    normal += [
        await q.enqueue("record", kwargs={"tag": str(i)}, max_attempts=3) for i in range(20, 40)
    ]
    procs = [workers.start(lease=lease, concurrency=4) for _ in range(2)]
    crashes = 0

    async def settled() -> bool:
        nonlocal crashes
        for i, p in enumerate(procs):
            if p.popen.poll() is not None:  # crashed on the poison job: replace it
                crashes += 1
                procs[i] = workers.start(lease=lease, concurrency=4)
        states = [(await j.info()).state for j in [*normal, poison]]
        return all(s in (JobState.COMPLETED, JobState.FAILED) for s in states)

    await wait_until(settled, timeout=120, interval=0.2, what="every job to settle")
    outcomes = [(await j.info()) for j in normal]
    assert [i.state for i in outcomes] == [JobState.COMPLETED] * 40, [
        (i.state, i.error) for i in outcomes if i.state is not JobState.COMPLETED
    ]
    with pytest.raises(JobFailed) as failed:
        await poison.result(timeout=1)
    assert failed.value.error_type == "LeaseExpired"
    assert "of 3" in failed.value.error_message
    # bounded: the poison job killed at most max_attempts workers plus max_attempts refunds
    poison_runs = [r for r in await run_records(redis, prefix) if r.id == poison.id]
    assert 3 <= len(poison_runs) <= 6
    assert crashes >= 2
    _starts, done = await side_effects(redis, prefix)
    assert all(done[j.id] >= 1 for j in normal)
    assert await check_invariants(redis, q._keys)


def test_the_heartbeat_is_configurable_within_the_lease() -> None:
    assert App(lease=30).heartbeat == 2.0
    assert App(lease=0.3).heartbeat == pytest.approx(0.1)
    assert App(lease=10, heartbeat=timedelta(seconds=1)).heartbeat == 1.0
    for bad in (0.01, 6.0, -1.0, float("nan")):
        with pytest.raises(ConfigurationError, match="heartbeat"):
            App(lease=10, heartbeat=bad)
