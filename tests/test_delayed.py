"""Delayed jobs: never claimable before they are due by the server's clock, promptly after."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis

from aioqueue import App, JobState, Queue

from .support.apps import open_app, unique_prefix
from .support.invariants import check_invariants
from .support.server import blocked_in, server_ms
from .support.waiting import PROMPT_S, wait_until

# also on a local Valkey Cluster (tests/conftest.py)
pytestmark = pytest.mark.cluster

LEASE_MS = 60_000  # long: a lease deadline minus this is the claim's server time
# "promptly after due": a missed wake-up leaves a consumer asleep for its whole wait (WAIT_S),
# ten times the margin
WAIT_S = 30
PROMPT_MS = int(PROMPT_S * 1000)


async def claim_times(redis: Redis, queue: Queue, ids: list[str]) -> dict[str, int]:
    """The server time at which each (active) job was claimed."""
    if not ids:
        return {}
    scores = await redis.zmscore(queue._keys.active, ids)
    assert all(s is not None for s in scores), "a claimed job holds no lease"
    return {i: int(s) - LEASE_MS for i, s in zip(ids, scores, strict=True) if s is not None}


async def due_times(redis: Redis, queue: Queue, ids: list[str]) -> dict[str, int]:
    pipe = redis.pipeline(transaction=False)
    for job_id in ids:
        pipe.hget(queue._keys.job(job_id), "due")
    return {i: int(d) for i, d in zip(ids, await pipe.execute(), strict=True) if d is not None}


async def test_a_delayed_job_is_not_claimable_before_it_is_due(app: App, redis: Redis) -> None:
    q = app.queue()
    # 1 s: on a busy machine a poll can take 100 ms, and the test wants a few early ones
    job = await q.enqueue("t", delay=1.0)
    due = (await job.info()).due_ms
    assert due is not None
    empty_polls = 0
    while not (got := await q.reserve(lease=LEASE_MS / 1000)):
        empty_polls += 1  # polling here is the test's point: every early look finds nothing
        await asyncio.sleep(0.005)
    assert [r.id for r in got] == [job.id]
    claimed = (await claim_times(redis, q, [job.id]))[job.id]
    assert claimed >= due, f"claimed {due - claimed} ms early"
    assert claimed - due < PROMPT_MS
    assert empty_polls > 5


async def test_a_blocked_consumer_gets_a_delayed_job_promptly_when_due(
    app: App, redis: Redis
) -> None:
    q = app.queue()
    for delay in (0.15, 0.4):
        job = await q.enqueue("t", delay=delay)
        due = (await job.info()).due_ms
        assert due is not None
        (r,) = await q.reserve(wait=WAIT_S, lease=LEASE_MS / 1000)
        claimed = (await claim_times(redis, q, [r.id]))[r.id]
        assert r.id == job.id
        assert due <= claimed < due + PROMPT_MS
        await q.complete(r)


async def test_a_consumer_already_blocked_is_woken_for_a_new_delayed_job(
    redis_url: str, redis: Redis
) -> None:
    prefix = unique_prefix()
    name = f"consumer-{prefix}"
    async with (
        open_app(redis_url, prefix=prefix, redis_options={"client_name": name}) as consumer,
        open_app(redis_url, prefix=prefix) as producer,
    ):
        waiting = asyncio.create_task(consumer.queue().reserve(wait=WAIT_S, lease=LEASE_MS / 1000))
        await wait_until(lambda: blocked_in(redis, name), what="the consumer to block")
        job = await producer.queue().enqueue("t", delay=0.3)
        due = (await job.info()).due_ms
        assert due is not None
        (r,) = await asyncio.wait_for(waiting, WAIT_S + 5)
        claimed = (await claim_times(redis, producer.queue(), [r.id]))[r.id]
        assert due <= claimed < due + PROMPT_MS


async def test_a_consumer_that_gives_up_does_not_swallow_the_wake_up_of_others(
    redis_url: str, redis: Redis
) -> None:
    """Regression: a reserve(wait=) that took the single wake token and then left empty-handed
    used to leave a consumer blocked earlier on a longer timeout asleep past the due time."""
    prefix = unique_prefix()
    brief, patient = f"brief-{prefix}", f"patient-{prefix}"
    async with (
        open_app(redis_url, prefix=prefix, redis_options={"client_name": brief}) as a,
        open_app(redis_url, prefix=prefix, redis_options={"client_name": patient}) as b,
        open_app(redis_url, prefix=prefix) as producer,
    ):
        # the server serves blocked clients first come, first served: the brief one first
        short = asyncio.create_task(a.queue().reserve(wait=0.6))
        await wait_until(lambda: blocked_in(redis, brief), what="the brief consumer to block")
        long = asyncio.create_task(b.queue().reserve(wait=WAIT_S))
        await wait_until(lambda: blocked_in(redis, patient), what="the patient one to block")
        job = await producer.queue().enqueue("t", delay=1.0)
        assert await asyncio.wait_for(short, 5) == []  # it gave up before the job was due
        try:
            got = await asyncio.wait_for(long, 1.0 + PROMPT_MS / 1000)  # not WAIT_S later
        except TimeoutError:
            pytest.fail("the blocked consumer was not woken when the delayed job fell due")
        assert [r.id for r in got] == [job.id]


async def test_at_takes_absolute_times(app: App, redis: Redis) -> None:
    q = app.queue()
    now = await server_ms(redis)
    at_posix = await q.enqueue("t", [1], at=(now + 300) / 1000)
    at_datetime = await q.enqueue("t", [2], at=datetime.fromtimestamp((now + 500) / 1000, UTC))
    in_the_past = await q.enqueue("t", [3], at=(now - 60_000) / 1000)
    dues = await due_times(redis, q, [at_posix.id, at_datetime.id])
    assert dues == {at_posix.id: now + 300, at_datetime.id: now + 500}
    assert await in_the_past.state() is JobState.QUEUED

    order: list[str] = []
    while len(order) < 3:
        for r in await q.reserve(wait=WAIT_S, lease=LEASE_MS / 1000):
            order.append(r.id)
            if r.id in dues:
                claimed = (await claim_times(redis, q, [r.id]))[r.id]
                assert dues[r.id] <= claimed < dues[r.id] + PROMPT_MS
    assert order == [in_the_past.id, at_posix.id, at_datetime.id]


async def test_a_due_job_waits_for_a_claim_or_reap_to_be_promoted(app: App, redis: Redis) -> None:
    q = app.queue()
    job = await q.enqueue("t", delay=0.1)
    due = (await job.info()).due_ms
    assert due is not None
    await wait_until(lambda: _server_past(redis, due), what="the due time")
    assert await job.state() is JobState.SCHEDULED  # promotion is lazy and atomic
    assert await check_invariants(redis, q._keys) == {job.id: "scheduled"}
    assert (await q.reap())["promoted"] == 1
    assert await check_invariants(redis, q._keys) == {job.id: "queued"}
    assert (await q.reap())["promoted"] == 0


async def _server_past(redis: Redis, ms: int) -> bool:
    return await server_ms(redis) >= ms


async def test_a_due_high_priority_job_goes_ahead_of_queued_ones(app: App, redis: Redis) -> None:
    q = app.queue()
    urgent = await q.enqueue("t", ["urgent"], delay=0.2, priority=10)
    plain = [(await q.enqueue("t", [i])).id for i in range(3)]
    due = (await urgent.info()).due_ms
    assert due is not None
    assert [r.id for r in await q.reserve()] == [plain[0]]  # not due yet
    await wait_until(lambda: _server_past(redis, due), what="the due time")
    assert [r.id for r in await q.reserve(3)] == [urgent.id, plain[1], plain[2]]


async def test_many_delayed_and_immediate_jobs_mixed(redis_url: str, redis: Redis) -> None:
    rng = random.Random(7)
    prefix = unique_prefix()
    async with open_app(redis_url, prefix=prefix) as producer:
        q = producer.queue()
        immediate = [(await q.enqueue("t", [i])).id for i in range(200)]
        delayed = [(await q.enqueue("t", [i], delay=rng.uniform(0.05, 0.6))).id for i in range(300)]

        @producer.task
        async def t(i: int) -> None:
            return None

        # more jobs due at one instant than one claim promotes at once
        at = (await server_ms(redis) + 400) / 1000
        burst = [j.id for j in await t.options(at=at).enqueue_many([{"i": i} for i in range(250)])]
        scheduled = delayed + burst
        due = await due_times(redis, q, scheduled)
        assert len(due) == len(scheduled)
        await check_invariants(redis, q._keys)

        claimed: dict[str, int] = {}
        # (server ms before the call, server ms after it) of every reserve that had room left
        with_room: list[tuple[int, int]] = []

        async def consume() -> None:
            async with open_app(redis_url, prefix=prefix) as consumer:
                cq = consumer.queue()
                while len(claimed) < len(immediate) + len(scheduled):
                    before = await server_ms(redis)
                    got = await cq.reserve(25, wait=0.2, lease=LEASE_MS / 1000)
                    times = await claim_times(redis, cq, [r.id for r in got])
                    if len(got) < 25:
                        with_room.append((before, await server_ms(redis)))
                    for r in got:
                        assert r.id not in claimed, f"job {r.id} delivered twice"
                        claimed[r.id] = times[r.id]
                    for r in got:
                        await cq.complete(r)

        # generous: on a loaded machine 750 jobs at one round trip each can take seconds
        await asyncio.wait_for(asyncio.gather(*(consume() for _ in range(4))), 120)

        assert set(claimed) == set(immediate) | set(scheduled)
        early = {i: due[i] - claimed[i] for i in scheduled if claimed[i] < due[i]}
        assert early == {}, f"claimed before due (ms early): {early}"
        # promptness, whatever the machine's speed: a claim that had room for more jobs left
        # none behind that was due when it started (each claim promotes at least 100 due jobs,
        # more than the 25 asked): every such job was claimed by the time that claim returned
        left_behind = [
            (i, due[i], start, end)
            for start, end in with_room
            for i in scheduled
            if due[i] <= start and claimed[i] > end
        ]
        assert left_behind == [], f"(job, due, claim started, returned): {left_behind[:5]}"
        late = sorted(claimed[i] - due[i] for i in scheduled)
        print(
            f"\ndue jobs claimed ms after due: median {late[len(late) // 2]}, max {late[-1]}; "
            f"{len(with_room)} claims had room"
        )
        assert await check_invariants(redis, q._keys) == dict.fromkeys(claimed, "completed")
