"""Hand-off to parked workers: a worker whose claim found too little parks, and enqueue leases
new jobs to it directly (lua/lib/handoff.lua), so an idle worker gets a job in one hop.

Store level (the scripts driven by hand, a parked "worker" nobody runs): what is handed over,
that every QoS rule still applies, that a registration ends by itself, and that jobs handed to
a worker that never takes them come back with the lease. Worker level: the hop count, and a
clean parking after shutdown. A parked worker killed with kill -9 is in test_worker_crash.py.
"""

from __future__ import annotations

import asyncio
import time
from functools import partial

from redis.asyncio import Redis

from aioqueue import App, EmbeddedServer, Worker
from aioqueue._store.outcomes import Outcome
from aioqueue._store.scripts import QueueScripts

from .support.apps import open_app
from .support.instrumented import instrument
from .support.invariants import check_invariants
from .support.server import blocked_in, server_ms, text
from .support.waiting import wait_until

LEASE_MS = 60_000
DEAD_TTL_MS = 3_600_000


async def park(
    app: App, worker_id: str, want: int, *, park_ms: int = 60_000, lease_ms: int = LEASE_MS
) -> None:
    """Register ``worker_id`` as parked on the default queue, able to take ``want`` jobs."""
    res = await scripts(app).claim(want, lease_ms, DEAD_TTL_MS, worker_id, park_ms)
    assert res.jobs == []


def scripts(app: App) -> QueueScripts:
    return app.queue()._scripts


async def handed(redis: Redis, app: App, worker_id: str) -> list[tuple[str, int]]:
    """(id, attempt) of the jobs waiting in ``worker_id``'s hand list."""
    values = await redis.lrange(app.queue()._keys.hand(worker_id), 0, -1)
    return [(text(values[i]), int(values[i + 2])) for i in range(0, len(values), 7)]


async def parked(redis: Redis, app: App) -> list[str]:
    return [text(w) for w in await redis.zrange(app.queue()._keys.idle, 0, -1)]


async def test_enqueue_leases_new_jobs_to_the_parked_worker(redis_url: str, redis: Redis) -> None:
    async with open_app(redis_url) as app:
        q = app.queue()

        @app.task(name="t")
        async def t(i: int) -> None: ...

        await park(app, "w1", want=2)
        assert await parked(redis, app) == ["w1"]
        jobs = await t.enqueue_many([((i,), {}) for i in range(3)])
        # one enqueue, one hand-off: the first two fill w1's room; the third waits in the
        # queue, with a wake token
        assert await handed(redis, app, "w1") == [(jobs[0].id, 1), (jobs[1].id, 1)]
        assert await parked(redis, app) == []
        states = await check_invariants(redis, q._keys)
        assert [states[j.id] for j in jobs] == ["active", "active", "queued"]
        assert await redis.llen(q._keys.wake) == 1
        assert 0 < await redis.pttl(q._keys.hand("w1")) <= LEASE_MS
        # the worker's next claim takes what was handed over first, counted towards n
        res = await scripts(app).claim(2, LEASE_MS, DEAD_TTL_MS, "w1", 0)
        assert sorted(c.id for c in res.jobs) == [jobs[0].id, jobs[1].id]
        assert all(c.payload and c.task == "t" and c.max_attempts >= 1 for c in res.jobs)
        assert await redis.exists(q._keys.hand("w1")) == 0
        # the leases are the real ones: complete works with the handed-over token
        held = {c.id: c.token for c in res.jobs}
        done = await scripts(app).complete([(i, t, b"1", 60_000) for i, t in held.items()])
        assert done == [Outcome.OK, Outcome.OK]
        assert (await check_invariants(redis, q._keys))[jobs[2].id] == "queued"


async def test_a_parked_worker_gets_one_hand_off_until_its_own_next_claim(
    redis_url: str, redis: Redis
) -> None:
    """A worker that died parked never claims again: after the one hand-off it got, the jobs
    enqueued after wait in the queue for a live worker, not in its hand list."""
    async with open_app(redis_url) as app:
        q = app.queue()
        await park(app, "w1", want=5)
        first = await q.enqueue("t")
        later = [await q.enqueue("t") for _ in range(3)]
        assert await handed(redis, app, "w1") == [(first.id, 1)]
        assert await parked(redis, app) == []
        states = await check_invariants(redis, q._keys)
        assert [states[j.id] for j in later] == ["queued"] * 3
        # its own claim takes the hand-off and the queued jobs, and parks it again
        res = await scripts(app).claim(5, LEASE_MS, DEAD_TTL_MS, "w1", 60_000)
        assert [c.id for c in res.jobs] == [first.id] + [j.id for j in later]
        assert await parked(redis, app) == ["w1"]
        again = await q.enqueue("t")
        assert await handed(redis, app, "w1") == [(again.id, 1)]


async def test_a_new_job_goes_straight_to_the_parked_worker_when_nothing_else_can_run() -> None:
    """With no lane in the ring and the ready list empty, enqueue leases its first new plain
    jobs to a parked worker without pushing them on the list (HO.direct): the list, the ring
    and the backlog count are not written for them; the rest are pushed as before. (A private
    server: its command counts are this test's alone.)"""
    with EmbeddedServer(appendonly=False) as server:
        async with Redis.from_url(server.url) as redis, open_app(server.url) as app:

            @app.task(name="t")
            async def t(i: int) -> None: ...

            k = app.queue()._keys
            await park(app, "w1", want=2)
            before = await commands_on(redis, ("rpush", "lpop", "hlen"))
            jobs = await t.enqueue_many([((i,), {}) for i in range(3)])
            assert await handed(redis, app, "w1") == [(jobs[0].id, 1), (jobs[1].id, 1)]
            # only the third job was pushed (RPUSHes: on ready, on the hand list and a wake
            # token for the job left), and counted in the backlog (one HLEN, for its new field)
            assert await commands_on(redis, ("rpush", "lpop", "hlen")) == {
                "rpush": before["rpush"] + 3,
                "lpop": before["lpop"],
                "hlen": before["hlen"] + 1,
            }
            assert [text(i) for i in await redis.lrange(k.ready, 0, -1)] == [jobs[2].id]
            assert await redis.zrange(k.ring, 0, -1) == [b""]
            assert await redis.hgetall(k.backlog) == {b"t:t": b"1"}
            states = await check_invariants(redis, k)
            assert [states[j.id] for j in jobs] == ["active", "active", "queued"]


async def test_a_job_already_runnable_is_handed_before_a_new_one(
    redis_url: str, redis: Redis
) -> None:
    """A job runnable before the enqueue (put back on the ready list, as a release does) goes
    first: the new one takes the list's and the ring's way, after it."""
    async with open_app(redis_url) as app:
        q = app.queue()
        k = q._keys
        await park(app, "w1", want=1)
        older = await q.enqueue("t")  # handed to w1, which is no longer parked
        res = await scripts(app).claim(2, LEASE_MS, DEAD_TTL_MS, "w1", 60_000)  # parks again
        assert [c.id for c in res.jobs] == [older.id]
        await scripts(app).release([(older.id, res.jobs[0].token)])
        assert [text(i) for i in await redis.lrange(k.ready, 0, -1)] == [older.id]
        newer = await q.enqueue("t")
        # w1 parked with room for 1 (its claim of 2 found 1): the older job
        assert [i for i, _ in await handed(redis, app, "w1")] == [older.id]
        assert [text(i) for i in await redis.lrange(k.ready, 0, -1)] == [newer.id]
        assert (await check_invariants(redis, k))[newer.id] == "queued"


async def test_a_hand_off_wakes_the_other_parked_workers_only(redis_url: str, redis: Redis) -> None:
    """The first lease to run out must reach every idle consumer's wake-up time: a hand-off
    leaves a wake token for the other parked workers, but none when the worker handed the job
    is the only one (its own next claim tells it when the lease runs out)."""
    async with open_app(redis_url) as app:
        q = app.queue()
        await park(app, "w1", want=1)
        first = await q.enqueue("t")
        assert await handed(redis, app, "w1") == [(first.id, 1)]
        assert await redis.llen(q._keys.wake) == 0
        # its next claim takes the job and, finding no more, learns the lease's deadline
        res = await scripts(app).claim(2, LEASE_MS, DEAD_TTL_MS, "w1", 60_000)
        assert [c.id for c in res.jobs] == [first.id]
        assert res.now_ms < res.next_wake_ms <= res.now_ms + LEASE_MS
        # two parked: the one not handed the job is woken to re-arm for the new lease
        await scripts(app).complete([(first.id, res.jobs[0].token, b"1", 60_000)])
        await park(app, "w2", want=1, lease_ms=1_000)
        second = await q.enqueue("t")
        assert sorted(await parked(redis, app)) in (["w1"], ["w2"])
        assert await redis.llen(q._keys.wake) == 1
        assert (await check_invariants(redis, q._keys))[second.id] == "active"


async def test_a_live_workers_heartbeat_buries_a_dead_one(redis_url: str, redis: Redis) -> None:
    """Burial does not wait for a live worker's next claim (up to idle_block away): its next
    heartbeat buries a worker past its deadline, hands back its jobs (those it never started
    with their attempt refunded) and leaves a wake token for the idle consumers."""
    info = ("h", 1, "0", "default", 4, 0, 0, 0, 0)  # ..., done, failed, signs
    async with open_app(redis_url) as app:
        q = app.queue()
        await scripts(app).beat("dead", 200, LEASE_MS, 0, info, [], DEAD_TTL_MS)
        job = await q.enqueue("t")
        res = await scripts(app).claim(1, LEASE_MS, DEAD_TTL_MS, "dead", 0, started=(0, 0))
        assert [c.id for c in res.jobs] == [job.id]  # leased, never started (prefetched)
        end = await server_ms(redis) + 200
        await wait_until(lambda: _after(redis, end), interval=0.01, what="its deadline")
        await redis.delete(q._keys.wake)
        await scripts(app).beat("alive", 60_000, LEASE_MS, 0, info, [], DEAD_TTL_MS)
        assert [w.id for w in await q.workers()] == ["alive"]
        assert (await check_invariants(redis, q._keys))[job.id] == "queued"
        assert (await job.info()).attempts == 0
        assert await redis.llen(q._keys.wake) == 1
        assert int((await q.stats())["buried"]) == 1


async def test_the_worker_parked_longest_ahead_is_served_first(
    redis_url: str, redis: Redis
) -> None:
    async with open_app(redis_url) as app:
        await park(app, "older", want=1, park_ms=60_000)
        await park(app, "newer", want=1, park_ms=61_000)  # its parking ends last
        a = await app.queue().enqueue("t")
        b = await app.queue().enqueue("t")
        assert await handed(redis, app, "newer") == [(a.id, 1)]
        assert await handed(redis, app, "older") == [(b.id, 1)]


async def test_no_hand_off_past_a_pause_a_group_limit_or_a_delay(
    redis_url: str, redis: Redis
) -> None:
    async with open_app(redis_url) as app:
        q = app.queue()
        await park(app, "w1", want=5)
        await q.pause()
        paused = await q.enqueue("t")
        assert await handed(redis, app, "w1") == []
        assert await parked(redis, app) == ["w1"]  # still parked, for later jobs
        await q.resume()
        await q.set_group_limit("g", 1)
        g1 = await q.enqueue("t", group="g")
        g2 = await q.enqueue("t", group="g")
        later = await q.enqueue("t", delay=60)
        # the paused job and the first of group g go to w1, within g's limit of one
        got = [job_id for job_id, _ in await handed(redis, app, "w1")]
        assert sorted(got) == sorted([paused.id, g1.id])
        states = await check_invariants(redis, q._keys)
        assert (states[g2.id], states[later.id]) == ("queued", "scheduled")


async def test_a_registration_ends_by_itself(redis_url: str, redis: Redis) -> None:
    async with open_app(redis_url) as app:
        await park(app, "gone", want=5, park_ms=50)
        end = await server_ms(redis) + 50
        await wait_until(lambda: _after(redis, end), interval=0.005, what="the parking to end")
        job = await app.queue().enqueue("t")
        assert await handed(redis, app, "gone") == []
        assert await parked(redis, app) == []  # the stale registration was cleared
        assert (await check_invariants(redis, app.queue()._keys))[job.id] == "queued"


async def test_reap_drops_a_dead_registration_behind_a_live_one(
    redis_url: str, redis: Redis
) -> None:
    async with open_app(redis_url) as app:
        await park(app, "gone", want=5, park_ms=50)
        await park(app, "alive", want=1, park_ms=60_000)
        end = await server_ms(redis) + 50
        await wait_until(lambda: _after(redis, end), interval=0.005, what="the parking to end")
        job = await app.queue().enqueue("t")
        assert [i for i, _ in await handed(redis, app, "alive")] == [job.id]
        # the live worker's room is used up; the dead one's registration is left to reap
        assert await parked(redis, app) == ["gone"]
        await scripts(app).reap(100, DEAD_TTL_MS)
        assert await parked(redis, app) == []
        assert await redis.hlen(app.queue()._keys.idlew) == 0


async def _after(redis: Redis, ms: int) -> bool:
    return await server_ms(redis) > ms


async def test_jobs_handed_to_a_worker_that_never_took_them_come_back(
    redis_url: str, redis: Redis
) -> None:
    async with open_app(redis_url) as app:
        q = app.queue()
        # a lease long enough that a busy machine's round trips cannot outlast it
        await park(app, "dead", want=1, lease_ms=1000)
        job = await q.enqueue("t")
        assert await handed(redis, app, "dead") == [(job.id, 1)]
        assert 0 < await redis.pttl(q._keys.hand("dead")) <= 1000  # it expires with the lease

        async def recovered() -> bool:
            return (await q.reap())["recovered"] == 1

        await wait_until(recovered, interval=0.02, what="the lease to run out")

        async def hand_list_gone() -> bool:
            return await redis.exists(q._keys.hand("dead")) == 0

        # (on a busy server the key's expiry and the reap's clock can be a moment apart)
        await wait_until(hand_list_gone, timeout=5, interval=0.02, what="the hand list to expire")
        assert (await check_invariants(redis, q._keys))[job.id] == "queued"
        got = await q.reserve(1)
        assert [(r.id, r.attempt) for r in got] == [(job.id, 2)]


async def test_pull_api_consumers_never_park(redis_url: str, redis: Redis) -> None:
    async with open_app(redis_url) as app:
        assert await app.queue().reserve(3, wait=0.05) == []
        assert await parked(redis, app) == []


async def test_a_parked_worker_gets_a_new_job_in_one_hop(redis_url: str, redis: Redis) -> None:
    name = f"c{time.monotonic_ns()}"
    async with App(redis_url, prefix=name, redis_options={"client_name": name}) as app:
        claims_at_start: list[int] = []
        done = asyncio.Event()

        @app.task
        async def ping() -> None:
            claims_at_start.append(calls["claim"] + calls["complete_claim"])
            done.set()

        calls = instrument(app).calls
        async with Worker(app, concurrency=4, grace=1) as worker:
            claims_per_job = []
            for i in range(5):
                done.clear()
                await wait_until(lambda: blocked_in(redis, name, "blmpop"), what="parking")
                before = calls["claim"] + calls["complete_claim"]
                await ping.enqueue()
                await asyncio.wait_for(done.wait(), 5)
                # the job reached the worker without a claim of its own
                assert claims_at_start[-1] == before
                await wait_until(partial(completed, app, i + 1), what="the completion")
                await wait_until(lambda: blocked_in(redis, name, "blmpop"), what="parked again")
                claims_per_job.append(calls["claim"] + calls["complete_claim"] - before)
            assert await parked(redis, app) == [worker.id]
            # one claim a job, the one that parks it again: no wake token sent it a second
            assert claims_per_job == [1] * 5
        # a stopped worker has left its parking
        assert await parked(redis, app) == []
        assert await redis.exists(app.queue()._keys.hand(worker.id)) == 0
        assert (await app.queue().stats())["completed"] == 5


async def completed(app: App, n: int) -> bool:
    return (await app.queue().stats()).get("completed", 0) >= n


async def commands_on(redis: Redis, names: tuple[str, ...]) -> dict[str, int]:
    """How many times the server ran each command (INFO commandstats) so far."""
    stats = await redis.info("commandstats")
    return {n: int(stats.get(f"cmdstat_{n}", {}).get("calls", 0)) for n in names}
