"""Named limiters (issue 28, point 1; docs/flow-control.md) through the pull API on a real
server: a job whose limits do not all admit it waits aside, not started and not charged, and
the claim says when to look again; concurrency slots come back with the ack; keys are
independent; code holds the same limits (``app.limit``); settings change at run time; limits
that are garbage, or planted, are contained."""

from __future__ import annotations

import json

import pytest
from redis.asyncio import Redis

from aioqueue import App, ConfigurationError
from aioqueue._app.limiters import limits_of_job

from .support.server import server_ms
from .support.waiting import wait_until


def declare(app: App) -> None:
    app.limiter("slow", rate=(1, 10.0), key=lambda who: who)  # one start per 10 s per key
    app.limiter("one", concurrency=1)

    @app.task(name="slow", limits=["slow"])
    async def slow(who: str) -> None: ...

    @app.task(name="both", limits=["slow", "one"])
    async def both(who: str) -> None: ...

    @app.task(name="single", limits=["one"])
    async def single(who: str) -> None: ...

    @app.task(name="plain")
    async def plain(who: str) -> None: ...


async def test_a_job_a_limit_does_not_admit_waits_aside_uncharged_and_the_claim_says_until_when(
    app: App, redis: Redis
) -> None:
    declare(app)
    q = app.queue()
    first = await app.tasks["slow"].enqueue("ann")
    second = await app.tasks["slow"].enqueue("ann")
    other = await app.tasks["slow"].enqueue("bob")  # another key: its own limit
    got = await q.reserve(10)
    assert sorted(r.id for r in got) == sorted([first.id, other.id])
    info = await q.job_info(second.id)
    assert (info.state.value, info.attempts) == ("queued", 0)  # not started, not charged
    res = await q.leases.claim(10, 30_000)  # nothing now; look again when "ann" admits one
    assert res.jobs == []
    state = await app.limiters.state("slow", "ann")
    assert (state.tokens, state.waiting) == (0, 1)
    assert res.next_wake_ms == state.next_admit_ms
    assert 9_000 <= state.next_admit_ms - res.now_ms <= 10_000
    for r in got:
        await q.complete(r)
    assert await q.reserve(10) == []  # completing does not free a rate
    # why it waits, as `why` and the dashboard can tell it: its limits, read from its record
    options = json.loads(await redis.hget(q._keys.job(second.id), "o") or b"{}")
    assert limits_of_job(options) == [("slow", "ann")]
    assert limits_of_job({"lim": "garbage"}) == []
    async with App(app.url, prefix=app.prefix) as reader:  # declares no limiter: a pure read
        assert (await reader.limiters.state("slow", "ann")).waiting == 1


async def test_a_job_needing_two_limits_starts_only_when_both_admit_and_is_charged_once(
    app: App,
) -> None:
    declare(app)
    q = app.queue()
    holder = await app.tasks["single"].enqueue("x")
    (held,) = await q.reserve(5)
    assert held.id == holder.id
    waiting = await app.tasks["both"].enqueue("ann")
    assert await q.reserve(5) == []  # "slow" admits it, "one" does not
    assert (await app.limiters.state("slow", "ann")).tat_ms is None  # "slow" not charged
    await q.complete(held)  # its slot back: the waiting job goes at once
    (r,) = await q.reserve(5)
    assert r.id == waiting.id
    state = await app.limiters.state("slow", "ann")
    assert (state.tokens, state.holders) == (0, 0)
    assert (await app.limiters.state("one")).holders == 1
    await q.fail(r, "boom", retry=False)  # a failure frees the slot too
    assert (await app.limiters.state("one")).holders == 0


async def test_code_holds_the_same_limits_as_jobs(app: App) -> None:
    declare(app)
    q = app.queue()
    async with app.limit("one"):
        job = await app.tasks["single"].enqueue("x")
        assert await q.reserve(5) == []
        assert (await app.limiters.state("one")).holders == 1

    async def admitted() -> bool:
        got = await q.reserve(5)
        return [r.id for r in got] == [job.id]

    await wait_until(admitted, timeout=10, what="the job once code gave the slot back")


async def test_set_limit_changes_the_rate_for_every_worker_until_reset(app: App) -> None:
    declare(app)
    q = app.queue()
    jobs = [await app.tasks["slow"].enqueue("ann") for _ in range(3)]
    assert len(await q.reserve(5)) == 1
    started = await server_ms(app.redis)
    await app.limiters.set("slow", rate=(1000, 1.0), burst=10)
    assert (await app.limiters.state("slow", "ann")).overrides == {
        "n": "1000",
        "ms": "1000",
        "burst": "10",
    }
    got: list[str] = []

    async def rest() -> bool:
        got.extend(r.id for r in await q.reserve(5))
        return len(got) == 2

    await wait_until(rest, timeout=30, what="the waiting jobs under the new rate")
    assert sorted(got) == sorted(j.id for j in jobs[1:])
    # at the new rate, not after the old one's 10 s turn (the debt is kept in starts, not ms)
    assert await server_ms(app.redis) - started < 9_000
    await app.limiters.set("slow", reset=True)
    assert (await app.limiters.state("slow", "ann")).overrides == {}


async def test_a_waiting_job_cancelled_stays_cancelled(app: App) -> None:
    declare(app)
    q = app.queue()
    await app.tasks["slow"].enqueue("ann")
    doomed = await app.tasks["slow"].enqueue("ann")
    assert len(await q.reserve(5)) == 1
    assert await q.reserve(5) == []
    assert await q.cancel_jobs([doomed.id]) == 1
    await app.limiters.set("slow", rate=(1000, 1.0))
    assert await q.reserve(5) == []
    assert (await q.job_info(doomed.id)).state.value == "cancelled"


async def test_declarations_are_checked(app: App) -> None:
    declare(app)
    with pytest.raises(ConfigurationError):
        app.limiter("slow", rate=(1, 1.0))  # twice
    for bad in [
        {"rate": (0, 1.0)},
        {"rate": (1, 0.0)},
        {"burst": 0, "rate": (1, 1.0)},
        {"concurrency": 0},
        {"concurrency": 10**6},
        {},
    ]:
        with pytest.raises(ConfigurationError):
            app.limiter("bad", **bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        app.task(name="t2", limits="slow")(lambda: None)
    app.task(name="t3", limits=["nobody"])(lambda: None)
    with pytest.raises(ConfigurationError, match="no limiter named 'nobody'"):
        await app.tasks["t3"].enqueue()


async def test_limits_that_are_garbage_dead_letter_their_job_and_planted_ones_stop_no_other(
    app: App, redis: Redis
) -> None:
    declare(app)
    q, other = app.queue(), app.queue("other")
    k = q._keys
    job = await app.tasks["slow"].enqueue("ann")
    # limits aimed at another queue's keys, and limits that are not a list
    bad = [
        {"lim": {"b": other._keys.base, "l": [["slow", "ann", 1, 1000, 1, 0]]}},
        {"lim": {"b": app.prefix + ":", "l": "x"}},
        {"lim": {"b": app.prefix + ":", "l": [["a" * 300, "k", 1, 1, 1, 0]]}},
    ]
    victims = [await app.tasks["plain"].enqueue(str(i)) for i in range(len(bad))]
    for victim, opts in zip(victims, bad, strict=True):
        await redis.hset(k.job(victim.id), "o", json.dumps(opts))
    # planted waits: a member naming a key of another queue, a list of ids that do not exist
    now = await server_ms(redis)
    await redis.zadd(k.base + "lwait", {other._keys.ready: 0, "nokey": now})
    await redis.rpush(k.base + "lw:" + other._keys.ready, "nosuchjob")
    plain = await app.tasks["plain"].enqueue("p")
    on_other = await app.tasks["plain"].options(queue="other").enqueue("o")
    got = {r.id for r in await q.reserve(10)}
    assert got == {job.id, plain.id}
    assert {r.id for r in await other.reserve(10)} == {on_other.id}
    for victim in victims:
        info = await q.job_info(victim.id)
        assert info.state.value == "failed"
        assert info.error is not None
        assert info.error.type == "Garbled"
    assert await redis.llen(other._keys.ready) == 0  # nothing was pushed into another queue


@pytest.mark.cluster
async def test_limits_live_in_the_queues_slot_on_a_cluster(
    app: App, redis: Redis, backend: str
) -> None:
    declare(app)
    q = app.queue()
    first = await app.tasks["both"].enqueue("ann")
    second = await app.tasks["both"].enqueue("ann")
    (r,) = await q.reserve(5)
    assert r.id == first.id
    state = await app.limiters.state("slow", "ann")
    assert (state.tokens, state.waiting) == (0, 1)
    await q.complete(r)
    started = await server_ms(app.redis)
    await app.limiters.set("slow", rate=(1000, 1.0))  # burst 1: no tolerance at all

    async def second_runs() -> bool:
        return [x.id for x in await q.reserve(5)] == [second.id]

    await wait_until(second_runs, timeout=30, what="the second job under the new rate")
    assert await server_ms(app.redis) - started < 9_000  # not at the old rate's turn
    async with app.limit("slow", key="bob"):
        assert (await app.limiters.state("slow", "bob")).tat_ms is not None
    # shared by every queue of the prefix; on a Cluster, in the queue's slot
    base = app.prefix + (":{default}:" if backend == "cluster" else ":")
    assert await redis.exists(base + "lim:{slow:ann}", base + "lim:slow") == 2
