"""The contract on a real server: I1 nothing lost, I2 no double completion, I6 one clock,
I8 bounded memory; and crashes of producers and consumers between (or during) calls."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import time
from collections import Counter
from typing import Any, Literal

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff, NoBackoff

import aioqueue
from aioqueue import App, JobNotFound, JobState, LeaseLost, Queue, Reservation
from aioqueue._store.loader import SCRIPTS

from .support.apps import open_app, unique_prefix
from .support.invariants import check_invariants
from .support.proxy import ReplyDropProxy
from .support.server import clients_named, server_ms, text
from .support.waiting import wait_until


async def server_past(redis: Redis, ms: int) -> bool:
    return await server_ms(redis) > ms


async def lease_deadline(redis: Redis, queue: Queue, job_id: str) -> int:
    score = await redis.zscore(queue._keys.active, job_id)
    assert score is not None, f"job {job_id} holds no lease"
    return int(score)


# ---------------------------------------------------------------------------- I1


async def test_check_invariants_catches_a_job_in_two_states(app: App, redis: Redis) -> None:
    """The checker itself: a job id copied into a second structure is reported."""
    q = app.queue()
    job = await q.enqueue("t")
    (r,) = await q.reserve()
    await check_invariants(redis, q._keys)
    await redis.rpush(q._keys.ready, job.id)
    with pytest.raises(AssertionError, match="both"):
        await check_invariants(redis, q._keys)
    await redis.lrem(q._keys.ready, 0, job.id)
    await redis.zrem(q._keys.active, job.id)
    with pytest.raises(AssertionError, match="no structure"):
        await check_invariants(redis, q._keys)
    await redis.zadd(q._keys.active, {job.id: 0})
    await q.complete(r)
    assert await check_invariants(redis, q._keys) == {job.id: "completed"}


async def test_every_operation_leaves_each_job_in_exactly_one_state(redis_url: str) -> None:
    """A seeded random walk over every operation, checking I1 after each one, against a model
    of what the consumer holds; completed jobs must never come back (I2)."""
    rng = random.Random(20240601)
    # a database of its own: the invariant check SCANs the key space after every step, which
    # would crawl through every key the rest of the suite left in database 0
    url = redis_url.rsplit("/", 1)[0] + "/13"
    redis = Redis.from_url(url, socket_timeout=None)
    await redis.flushdb()
    async with (
        contextlib.aclosing(redis),
        open_app(url, backoff=aioqueue.Backoff(base=0.05, jitter=0)) as app,
    ):
        q = app.queue()
        held: dict[str, Reservation] = {}
        completed: set[str] = set()
        enqueued = 0
        for step in range(500):
            op = rng.choice(
                ["enqueue"] * 4
                + ["reserve"] * 4
                + ["complete"] * 2
                + ["fail", "retry", "release", "release_later", "extend", "reap", "duplicate"]
            )
            try:
                if op == "enqueue" or (op == "duplicate" and enqueued == 0):
                    enqueued += 1
                    await q.enqueue(
                        "t",
                        [step],
                        job_id=f"j{enqueued}",
                        delay=rng.choice([None, None, 0.02, 0.1]),
                        priority=rng.choice([0, 0, 5, -5]),
                        max_attempts=rng.choice([1, 2, 3]),
                    )
                elif op == "duplicate":
                    again = await q.enqueue("t", [-1], job_id=f"j{rng.randint(1, enqueued)}")
                    assert (await again.info()).args != (-1,)  # the first enqueue won
                elif op == "reserve":
                    lease = rng.choice([0.05, 30.0])
                    for r in await q.reserve(rng.randint(1, 3), lease=lease):
                        assert r.id not in completed, f"completed job {r.id} delivered again"
                        held[r.id] = r  # a re-delivery replaces a lost lease
                elif held:
                    r = held.pop(rng.choice(sorted(held)))
                    if op == "complete":
                        await q.complete(r, step)
                        completed.add(r.id)
                    elif op == "fail":
                        await q.fail(r, "no", retry=False)
                    elif op == "retry":
                        await q.fail(r, "again", delay=rng.choice([0, 0.02]))
                    elif op == "release":
                        await q.release(r)
                    elif op == "release_later":
                        await q.release(r, delay=0.02, refund=rng.random() < 0.5)
                    elif op == "extend":
                        await q.extend(r, lease=30)
                        held[r.id] = r
                    elif op == "reap":
                        held[r.id] = r
                        await q.reap()
            except LeaseLost:
                pass  # its short lease ran out and a reserve handed it back: expected
            states = await check_invariants(redis, q._keys)
            assert completed <= {i for i, s in states.items() if s == "completed"}
        assert enqueued > 50
        assert len(completed) > 20


async def test_a_consumer_that_vanishes_loses_nothing(redis_url: str, redis: Redis) -> None:
    prefix = unique_prefix()
    async with open_app(redis_url, prefix=prefix) as producer:
        q = producer.queue()
        ids = {(await q.enqueue("t", [i])).id for i in range(10)}
        async with open_app(redis_url, prefix=prefix) as doomed:
            taken = await doomed.queue().reserve(10, lease=0.3)
            assert {r.id for r in taken} == ids
        # its App is gone without a single ack: every job is still active, none lost
        assert await check_invariants(redis, q._keys) == dict.fromkeys(ids, "active")

        got: dict[str, Reservation] = {}
        while len(got) < len(ids):
            for r in await q.reserve(10, wait=5):
                assert r.id not in got
                got[r.id] = r
        assert all(r.attempt == 2 for r in got.values())
        for r in got.values():
            await q.complete(r, "recovered")
        assert await check_invariants(redis, q._keys) == dict.fromkeys(ids, "completed")
        assert (await q.stats())["expired"] == 10


@pytest.mark.parametrize("retries", ["redis-py default retries", "no retries"])
async def test_a_producer_cut_off_mid_batch_leaves_every_job_whole(
    redis_url: str, redis: Redis, retries: str
) -> None:
    """CLIENT KILL on the producer's connection while a large enqueue_many is being stored.

    Whatever the call reports, every job it reported is stored exactly once, every stored job
    is whole and queued once, and (each script call being atomic) the jobs stored are whole
    500-job chunks of the batch."""
    prefix = unique_prefix()
    name = f"producer-{prefix}"
    options: dict[str, Any] = {"client_name": name}
    if retries == "no retries":
        options["retry"] = Retry(NoBackoff(), 0)
    n = 40_000
    async with open_app(redis_url, prefix=prefix, redis_options=options) as app:

        @app.task
        async def item(i: int, pad: str) -> None:
            return None

        keys = app.queue()._keys
        batch = asyncio.create_task(
            item.enqueue_many([{"i": i, "pad": "x" * 40} for i in range(n)])
        )

        async def storing() -> bool:
            return int(await redis.hget(keys.stats, "enqueued") or 0) > 0

        await wait_until(storing, interval=0.001, what="the batch to start landing")
        for client in await clients_named(redis, name):
            await redis.client_kill_filter(_id=client["id"])
        try:
            reported = [j.id for j in await batch]
        except aioqueue.ServerUnavailable:
            reported = []

        states = await check_invariants(redis, keys)
        ready = [text(m) for m in await redis.lrange(keys.ready, 0, -1)]
        assert set(ready) == set(states)
        assert set(states.values()) <= {"queued"}
        assert set(reported) <= set(states), "a reported job is missing"
        assert len(states) % 500 == 0 or len(states) == n, "a script call was cut in half"
        assert int(await redis.hget(keys.stats, "enqueued") or 0) == len(states)
        (r,) = await app.queue().reserve()
        assert r.kwargs["pad"] == "x" * 40  # a stored job is whole


# ---------------------------------------------------------------------------- concurrency


async def test_racing_claimers_complete_every_job_exactly_once(
    redis_url: str, redis: Redis
) -> None:
    total, claimers = 6000, 12
    prefix = unique_prefix()
    holder: dict[str, int] = {}  # job id -> the claimer holding it right now
    tokens: set[tuple[str, str]] = set()
    completions: Counter[str] = Counter()
    violations: list[str] = []

    async with open_app(redis_url, prefix=prefix) as producer:

        @producer.task
        async def work(i: int) -> int:
            return i

        jobs = await work.enqueue_many([((i,), {}) for i in range(total)])
        ids = {j.id for j in jobs}

        async def claimer(k: int) -> None:
            rng = random.Random(k)
            async with open_app(redis_url, prefix=prefix) as own:  # its own pool
                q = own.queue()
                while len(completions) < total:
                    got = await q.reserve(rng.randint(1, 6), wait=0.05)
                    for r in got:
                        if r.id in holder:
                            violations.append(f"{r.id} held by {holder[r.id]} and {k}")
                        if (r.id, r.token) in tokens:
                            violations.append(f"token {r.token} of {r.id} handed out twice")
                        holder[r.id] = k
                        tokens.add((r.id, r.token))
                    for r in got:
                        await q.complete(r, r.args[0])
                        del holder[r.id]
                        completions[r.id] += 1

        async with asyncio.timeout(100):  # a backstop for a hang (a busy machine is slow)
            await asyncio.gather(*(claimer(k) for k in range(claimers)))

        assert violations == []
        assert set(completions) == ids
        assert set(completions.values()) == {1}
        assert len(tokens) == total  # no job was ever handed out twice
        q = producer.queue()
        assert await q.counts() == {"scheduled": 0, "queued": 0, "active": 0, "failed": 0}
        assert (await q.stats())["completed"] == total
        assert await check_invariants(redis, q._keys) == dict.fromkeys(ids, "completed")
        assert await jobs[1234].result(timeout=1) == 1234


# ---------------------------------------------------------------------------- I2


async def test_stale_and_forged_tokens_are_rejected_and_change_nothing(
    app: App, redis: Redis
) -> None:
    q = app.queue()
    job = await q.enqueue("t")
    (r,) = await q.reserve(lease=30)
    deadline = await lease_deadline(redis, q, job.id)
    # a neighbour's under sequential tokens: 1000 leases on
    forged = dataclasses.replace(r, token=f"{(int(r.token, 16) + 1000) % 16**16:016x}")
    for call in (
        lambda: q.complete(forged, "x"),
        lambda: q.fail(forged, "x"),
        lambda: q.fail(forged, "x", retry=False),
        lambda: q.release(forged),
        lambda: q.extend(forged, lease=100),
    ):
        with pytest.raises(LeaseLost) as caught:
            await call()
        assert caught.value.job_id == job.id
    assert await check_invariants(redis, q._keys) == {job.id: "active"}
    assert await lease_deadline(redis, q, job.id) == deadline
    assert (await job.info()).attempts == 1

    unknown = dataclasses.replace(r, id="no-such-job")
    for call in (
        lambda: q.complete(unknown),
        lambda: q.fail(unknown, "x"),
        lambda: q.release(unknown),
        lambda: q.extend(unknown),
    ):
        with pytest.raises(JobNotFound):
            await call()

    await q.complete(r, "real")
    assert await job.result(timeout=1) == "real"


# ---------------------------------------------------------------------------- lost replies (I4)

Ack = Literal["complete", "fail", "release"]


async def _ack(q: Queue, r: Reservation, op: Ack) -> None:
    if op == "complete":
        await q.complete(r, "done")
    elif op == "fail":
        await q.fail(r, "broken", retry=False)
    else:
        await q.release(r)


@pytest.mark.parametrize("op", ["complete", "fail", "release"])
async def test_an_ack_whose_reply_is_lost_takes_effect_exactly_once(
    redis_url: str, redis: Redis, op: Ack
) -> None:
    """The ack runs on the server but its reply is lost: the App's retry sends it again on a
    fresh connection, the replay is recognised by its lease token, and the call succeeds;
    the job moved exactly once."""
    async with ReplyDropProxy(redis_url) as proxy, open_app(proxy.url) as app:
        q = app.queue()
        job = await q.enqueue("t", max_attempts=3)
        (r,) = await q.reserve()
        await app.redis.script_load(SCRIPTS[op].source)  # so that the call runs, not NOSCRIPT
        proxy.arm(SCRIPTS[op].function.encode() + b"\r\n")
        await _ack(q, r, op)
        assert proxy.dropped == 1
        info = await job.info()
        expected = {"complete": "completed", "fail": "failed", "release": "queued"}[op]
        assert await check_invariants(redis, q._keys) == {job.id: expected}
        if op == "complete":
            assert await job.result(timeout=1) == "done"
        if op == "release":
            assert info.attempts == 0  # refunded once


@pytest.mark.parametrize("op", ["complete", "fail", "release"])
async def test_an_ack_retried_after_a_lost_reply_is_not_reported_as_lease_lost(
    redis_url: str, op: Ack
) -> None:
    retry = Retry(ExponentialBackoff(cap=0.1, base=0.01), 3)
    async with (
        ReplyDropProxy(redis_url) as proxy,
        open_app(proxy.url, redis_options={"retry": retry}) as app,
    ):
        q = app.queue()
        job = await q.enqueue("t", max_attempts=3)
        (r,) = await q.reserve()
        await app.redis.script_load(SCRIPTS[op].source)
        proxy.arm(SCRIPTS[op].function.encode() + b"\r\n")
        try:
            await _ack(q, r, op)  # it succeeded on the server: must not say the lease was lost
        finally:
            assert proxy.dropped == 1
            assert (await job.info()).state is not JobState.ACTIVE  # and it did take effect


# ---------------------------------------------------------------------------- I6


async def test_the_clients_clock_does_not_matter(
    redis_url: str, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Client clocks hours off (wall clock ahead, monotonic clock ahead): delays and leases
    still follow the server's TIME."""
    real_time, real_monotonic = time.time, time.monotonic
    monkeypatch.setattr(time, "time", lambda: real_time() + 5 * 3600)
    monkeypatch.setattr(time, "monotonic", lambda: real_monotonic() + 3 * 3600)
    loop = asyncio.get_running_loop()
    monkeypatch.setattr(loop, "time", lambda: real_monotonic() + 3 * 3600)

    prefix = unique_prefix()
    async with open_app(redis_url, prefix=prefix) as app, open_app(redis_url, prefix=prefix) as b:
        q = app.queue()
        before = await server_ms(redis)
        job = await q.enqueue("t", delay=0.3)
        after = await server_ms(redis)
        info = await job.info()
        assert before <= info.created_ms <= after  # not five hours ahead
        assert info.due_ms == info.created_ms + 300

        (r,) = await q.reserve(wait=5, lease=0.3)
        claimed = await lease_deadline(redis, q, job.id) - 300
        assert info.due_ms <= claimed < info.due_ms + 250  # not early, not hours late
        deadline = claimed + 300

        # the lease runs out by the server's clock, and only then
        (again,) = await b.queue().reserve(wait=5, lease=30)
        reclaimed = await lease_deadline(redis, q, job.id) - 30_000
        assert deadline <= reclaimed < deadline + 250
        with pytest.raises(LeaseLost):
            await q.complete(r)
        await b.queue().complete(again, "ok")
        assert await job.result(timeout=1) == "ok"


# ---------------------------------------------------------------------------- I8


async def test_completed_jobs_expire_after_result_ttl(redis_url: str, redis: Redis) -> None:
    async with open_app(redis_url, result_ttl=5) as app:
        q = app.queue()
        default = await q.enqueue("t")
        short = await q.enqueue("t", result_ttl=2)
        gone = await q.enqueue("t", result_ttl=0)
        for r in await q.reserve(3):
            await q.complete(r, "x")
        assert 4000 < await redis.pttl(q._keys.job(default.id)) <= 5000
        assert 1000 < await redis.pttl(q._keys.job(short.id)) <= 2000
        assert await redis.exists(q._keys.job(gone.id)) == 0
        with pytest.raises(JobNotFound):
            await gone.state()
        assert await check_invariants(redis, q._keys) == {
            default.id: "completed",
            short.id: "completed",
        }

    async with open_app(redis_url, result_ttl=None) as keep:
        job = await keep.queue().enqueue("t")
        (r,) = await keep.queue().reserve()
        await keep.queue().complete(r)
        assert await redis.pttl(keep.queue()._keys.job(job.id)) == -1  # kept, as configured


async def test_a_tasks_result_ttl_applies_to_pull_api_completions(app: App, redis: Redis) -> None:
    @app.task(result_ttl=2)
    async def brief() -> None:
        return None

    job = await brief.enqueue()
    (r,) = await app.queue().reserve()
    await app.queue().complete(r)
    assert 0 < await redis.pttl(app.queue()._keys.job(job.id)) <= 2000


async def test_dead_letters_expire_and_reap_trims_them(redis_url: str, redis: Redis) -> None:
    async with open_app(redis_url, dead_ttl=0.4) as app:
        q = app.queue()
        job = await q.enqueue("t")
        (r,) = await q.reserve()
        await q.fail(r, "fatal", retry=False)
        died = await redis.zscore(q._keys.dead, job.id)
        assert died is not None
        assert 0 < await redis.pttl(q._keys.job(job.id)) <= 400
        assert (await q.reap())["dead_trimmed"] == 0  # not old enough yet
        assert await redis.zscore(q._keys.dead, job.id) == died

        await wait_until(lambda: server_past(redis, int(died) + 400), what="dead_ttl to pass")
        assert await redis.exists(q._keys.job(job.id)) == 0
        assert (await q.reap())["dead_trimmed"] == 1
        assert await redis.zcard(q._keys.dead) == 0
        assert await check_invariants(redis, q._keys, allow_expired_dead=False) == {}

    async with open_app(redis_url, dead_ttl=60) as app:
        q = app.queue()
        job = await q.enqueue("t")
        (r,) = await q.reserve()
        await q.fail(r, "fatal", retry=False)
        assert 59_000 < await redis.pttl(q._keys.job(job.id)) <= 60_000


async def test_finished_jobs_leave_no_key_without_a_ttl(redis_url: str, redis: Redis) -> None:
    async with open_app(redis_url, result_ttl=60, dead_ttl=60) as app:
        q = app.queue()
        ids = [(await q.enqueue("t", [i], priority=i % 3 - 1)).id for i in range(30)]
        ids.append((await q.enqueue("t", delay=0.05)).id)
        waiters = [asyncio.create_task(q.job(i).result(timeout=10)) for i in ids[:5]]
        await wait_until(lambda: redis.hexists(q._keys.job(ids[0]), "w"), what="the result waiters")
        done = 0
        while done < len(ids):
            for r in await q.reserve(8, wait=2):
                if r.attempt == 1 and done % 4 == 0:
                    await q.fail(r, "once more", delay=0)  # retried: finishes later
                    continue
                if done % 7 == 0:
                    await q.fail(r, "fatal", retry=False)
                else:
                    await q.complete(r, r.args)
                done += 1
        await asyncio.gather(*waiters, return_exceptions=True)
        await q.reap()

        no_ttl = set()
        async for key in redis.scan_iter(match=app.prefix + ":*", count=1000):
            name = text(key)
            ttl = await redis.pttl(name)
            if name.startswith(q._keys.base + "job:"):
                assert 0 < ttl <= 60_000, f"{name} has TTL {ttl}"
            elif ttl == -1:
                no_ttl.add(name[len(q._keys.base) :])
        # bounded bookkeeping only: counters, one wake token, dead letters (trimmed by reap),
        # the indexes of finished jobs (bounded, and trimmed by reap as records expire)
        assert no_ttl <= {"stats", "seq", "wake", "dead", "completed", "cancelled"}, no_ttl
        states = await check_invariants(redis, q._keys)
        assert set(states.values()) <= {"completed", "failed"}
