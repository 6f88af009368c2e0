"""Integer limits in the keyspace (I9, I12; issue 24, point 3): a counter at the end of the
server's 64 bits, past the 2^53 a script's Lua numbers hold exactly, negative, a float or
"1e400". Every increment in the scripts is guarded (``call`` in ``lua/lib/core.lua``): a counter
that is not an integer within 0..2^53-1 before and after it is set aside, listed in the queue's
``garbled`` hash, and counting restarts; a number read that is garbage counts as none. So no
script stops after writing a record, no job is lost, and the caller sees no exception for a job
that was handled."""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest
from redis.asyncio import Redis

from aioqueue import App, JobState, QueueFull, Reservation
from aioqueue._model.keys import QueueKeys
from aioqueue._model.limits import JOB_LOG_BYTES
from aioqueue._model.record import parse_claim

from .support.invariants import check_invariants
from .support.server import server_ms
from .support.waiting import wait_until
from .test_hostile import garbled_keys as garbled
from .test_hostile import hostile_app

#: the values written over a counter: the ends of the 64-bit range, past 2^53, negative, and
#: numbers that are not integers
LIMITS: list[Any] = [2**63 - 1, -(2**63), 2**53 + 1, -1, "1.5", "1e400", "nan", ""]
LIMIT_IDS = ["max64", "min64", "2^53+1", "-1", "float", "1e400", "nan", "empty"]


def limits_app(url: str) -> App:
    """The hostile tests' app, with leases no test step outlasts."""
    return hostile_app(url, lease=30.0, max_attempts=3)


async def reserve_all(app: App, n: int, timeout: float = 10.0) -> list[Reservation]:
    """Reserve until ``n`` jobs are held (bounded)."""
    q = app.queue()
    got: list[Reservation] = []

    async def more() -> bool:
        got.extend(await q.reserve(n - len(got), lease=30))
        return len(got) >= n

    await wait_until(more, timeout=timeout, what=f"{n} jobs reserved")
    return got


# ---------------------------------------------------------------------- the cases
async def test_seq_at_the_limit_then_enqueue_with_priority_and_with_group_the_jobs_run(
    redis_url: str, redis: Redis
) -> None:
    """seq = 2^63-1: enqueue(priority=5) and enqueue(group=) left a ``queued`` job in no lane
    (the counter overflowed after the record was written; the retry answered "exists")."""
    async with limits_app(redis_url) as app:
        q = app.queue()
        k = q._keys
        await redis.set(k.seq, 2**63 - 1)
        jobs = [
            await q.enqueue("echo", kwargs={"x": 1}, priority=5),
            await q.enqueue("echo", kwargs={"x": 2}, group="g"),
        ]
        got = await reserve_all(app, 2)
        assert sorted(r.id for r in got) == sorted(j.id for j in jobs)
        for r in got:
            await q.complete(r, r.kwargs["x"])
        assert [await j.result(timeout=10) for j in jobs] == [1, 2]
        assert (await garbled(redis, k))[k.seq] == "increment would overflow"
        assert 0 < int(cast(bytes, await redis.get(k.seq))) < 2**53
        await check_invariants(redis, k)


async def test_seq_at_the_limit_claims_and_reserve_go_on(redis_url: str, redis: Redis) -> None:
    """seq = 2^63-1 stopped every claim and reserve ("increment or decrement would
    overflow"); a worker's claims go on too."""
    from aioqueue import Worker

    async with limits_app(redis_url) as app:
        q = app.queue()
        k = q._keys
        await q.pause()
        jobs = [await q.enqueue("echo", kwargs={"x": i}) for i in range(4)]
        await q.resume()
        await redis.set(k.seq, 2**63 - 1)
        got = await q.reserve(2, lease=30)
        assert [r.id for r in got] == [j.id for j in jobs[:2]]
        for r in got:
            await q.complete(r, r.kwargs["x"])
        await redis.set(k.seq, 2**63 - 1)
        async with Worker(app, concurrency=2, idle_block=0.1, grace=0.5):
            assert [await j.result(timeout=10) for j in jobs] == [0, 1, 2, 3]
        # tokens are the worker's random material, whatever the counter holds
        assert len({r.token for r in got}) == 2
        assert all(len(r.token) == 16 and int(r.token, 16) >= 0 for r in got)
        # a claim short of material (an older client's 32-digit nonce for 4 jobs) numbers its
        # tokens with the counter: at the limit, it goes on too
        await q.pause()
        more = [await q.enqueue("echo", kwargs={"x": i}) for i in range(2)]
        await q.resume()
        await redis.set(k.seq, 2**63 - 1)
        scripts = q._scripts
        args = (scripts.base, 4, 30_000, 60_000, "", 0, "ab" * 16, "", "")
        derived = parse_claim(await scripts.run("claim", args)).jobs
        assert [r.id for r in derived] == [j.id for j in more]
        seqs = [int(r.token.split("-")[0]) for r in derived]
        assert all(0 < t < 2**53 for t in seqs)
        await check_invariants(redis, k)


async def test_stats_completed_at_the_limit_complete_succeeds_with_event_count_and_wake(
    redis_url: str, redis: Redis
) -> None:
    """stats completed = 2^63-1 made complete() raise although the job completed, and
    skipped its event, its count and the wake-up of a freed group slot from then on."""
    async with limits_app(redis_url) as app:
        q = app.queue()
        k = q._keys
        await q.set_events(100)
        await q.set_group_limit("g", 1)
        first = await q.enqueue("echo", kwargs={"x": 1}, group="g")
        second = await q.enqueue("echo", kwargs={"x": 2}, group="g")
        (r,) = await reserve_all(app, 1)
        assert r.id == first.id
        assert await q.reserve(1, lease=30) == []  # the group is at its limit
        await redis.hset(k.stats, "completed", 2**63 - 1)
        await redis.delete(k.wake)
        await q.complete(r, 1)  # does not raise
        assert await first.result(timeout=5) == 1
        assert (await q.stats())["completed"] == 1  # counting restarted
        assert k.stats in await garbled(redis, k)
        assert await redis.llen(k.wake) == 1  # the freed slot woke a consumer
        events = cast(list[Any], await redis.xrange(k.events))
        assert any(e[b"k"] == b"completed" and e[b"j"] == first.id.encode() for _, e in events), (
            events
        )
        (r2,) = await reserve_all(app, 1)
        assert r2.id == second.id
        await q.complete(r2, 2)
        assert (await q.stats())["completed"] == 2
        await check_invariants(redis, k)


async def test_a_retried_enqueue_puts_a_job_found_in_no_lane_back_in_it(
    redis_url: str, redis: Redis
) -> None:
    """The "exists" answer of a retried enqueue is given only for a job in its lane: a queued
    record in no lane (what a script stopped midway left) is put back and runs."""
    async with limits_app(redis_url) as app:
        q = app.queue()
        k = q._keys
        await q.pause()
        plain = await q.enqueue("echo", kwargs={"x": 1}, job_id="plain")
        prio = await q.enqueue("echo", kwargs={"x": 2}, priority=5, job_id="prio")
        grouped = await q.enqueue("echo", kwargs={"x": 3}, group="g", job_id="grouped")
        later = await q.enqueue("echo", kwargs={"x": 4}, delay=60, job_id="later")
        await redis.delete(k.ready, k.prio, k.lane("g"), k.scheduled)
        for job in (plain, prio, grouped, later):  # the retries
            again = await q.enqueue("echo", kwargs={"x": 0}, job_id=job.id)
            assert again.id == job.id
        assert await redis.lrange(k.ready, 0, -1) == [b"plain"]
        assert await redis.zscore(k.prio, "prio") is not None
        assert await redis.zscore(k.lane("g"), "grouped") is not None
        assert await redis.zscore(k.scheduled, "later") is not None
        await q.enqueue("echo", kwargs={"x": 1}, job_id="plain")  # in its lane: not twice
        assert await redis.lrange(k.ready, 0, -1) == [b"plain"]
        await q.resume()
        got = await reserve_all(app, 3)
        assert sorted(r.id for r in got) == ["grouped", "plain", "prio"]
        for r in got:
            await q.complete(r, r.kwargs["x"])
        assert [await j.result(timeout=5) for j in (plain, prio, grouped)] == [1, 2, 3]
        await check_invariants(redis, k)


# ---------------------------------------------------------------------- the class
Writer = Callable[[Redis, QueueKeys, Any], Awaitable[None]]


def _field(name: Callable[[QueueKeys], str], field: str) -> Writer:
    async def write(redis: Redis, k: QueueKeys, value: Any) -> None:
        await redis.hset(name(k), field, value)

    return write


def _string(name: Callable[[QueueKeys], str]) -> Writer:
    async def write(redis: Redis, k: QueueKeys, value: Any) -> None:
        await redis.set(name(k), value)

    return write


async def _throughput(redis: Redis, k: QueueKeys, value: Any) -> None:
    minute = await server_ms(redis) // 60000
    await redis.hset(k.throughput, mapping={f"c:{minute}": value, f"c:{minute + 1}": value})


async def _trends(redis: Redis, k: QueueKeys, value: Any) -> None:
    """The trend buckets (lua/lib/trends.lua) of this minute and hour and the next ones:
    every task's counts, and the sampled backlog and wait."""
    now = await server_ms(redis)
    for res, ms in (("m", 60_000), ("h", 3_600_000)):
        for b in (now // ms, now // ms + 1):
            await redis.hset(
                k.trend(res, b), mapping={"c:echo": value, "f:echo": value, "b": value, "w": value}
            )


async def _rate_windows(redis: Redis, k: QueueKeys, value: Any) -> None:
    window = await server_ms(redis) // 60000
    for w in (window, window + 1):
        await redis.set(f"{k.base}qrate:{w}", value)
        await redis.set(f"{k.base}grate:g:{w}", value)


#: every key family that holds a number a script counts or reads, and how to garble it;
#: counted: a script increments it, so it must be set aside (listed in ``garbled``)
FAMILIES: dict[str, tuple[Writer, bool]] = {
    "seq": (_string(lambda k: k.seq), True),
    "stats-enqueued": (_field(lambda k: k.stats, "enqueued"), True),
    "stats-completed": (_field(lambda k: k.stats, "completed"), True),
    "stats-retried": (_field(lambda k: k.stats, "retried"), True),
    "stats-failed": (_field(lambda k: k.stats, "failed"), True),
    "stats-cancelled": (_field(lambda k: k.stats, "cancelled"), True),
    "stats-garbled": (_field(lambda k: k.stats, "garbled"), True),
    "gactive": (_field(lambda k: k.gactive, "g"), True),
    "throughput": (_throughput, True),
    "trends": (_trends, True),
    "rate-windows": (_rate_windows, True),
    "glimit": (_field(lambda k: k.qconf, "glimit"), False),
    "group-limit": (_field(lambda k: k.gconf, "limit:g"), False),
    "rate-setting": (_field(lambda k: k.qconf, "rate_n"), False),
}


async def every_operation(app: App, redis: Redis) -> None:
    """Enqueue (plain, priority, group, delayed, a batch), reserve, complete, fail with a
    retry and without, release, extend and cancel: each job ends as it should, and nothing
    raises."""
    q = app.queue()
    k = q._keys
    jobs = [
        await q.enqueue("echo", kwargs={"x": 1}),
        await q.enqueue("echo", kwargs={"x": 2}, priority=5),
        await q.enqueue("echo", kwargs={"x": 3}, group="g"),
    ]
    echo = app.tasks["echo"]
    batch: Any = await app.batch([echo.call(4), echo.call(5)])
    for field in ("n", "total", "done"):  # and the batch's own counters
        await redis.hset(k.batch(batch.id), field, 2**63 - 1)
    doomed = await q.enqueue("echo", kwargs={"x": 6})
    delayed = await q.enqueue("echo", kwargs={"x": 9}, delay=60)
    assert await q.cancel_jobs([delayed.id]) == 1
    got = await reserve_all(app, 6)
    (dead,) = [r for r in got if r.id == doomed.id]
    got.remove(dead)
    await q.fail(dead, "dead-lettered", retry=False)
    retried = got[0]
    await q.fail(retried, "the first attempt fails", retry=True)
    await q.release(got[1])
    await q.extend(got[2], lease=30)
    for r in got[2:]:
        await q.complete(r, r.args[0] if r.args else r.kwargs["x"])
    for r in await reserve_all(app, 2):
        await q.complete(r, r.args[0] if r.args else r.kwargs["x"])
    assert [await j.result(timeout=10) for j in jobs] == [1, 2, 3]
    info = await batch.wait(timeout=10)
    assert info.failed == 0
    assert (await q.counts())["queued"] == 0
    assert (await q.job_info(doomed.id)).state.value == "failed"


@pytest.mark.parametrize("value", LIMITS, ids=LIMIT_IDS)
@pytest.mark.parametrize("family", list(FAMILIES))
async def test_every_counter_at_every_limit_loses_no_job_and_is_set_aside(
    redis_url: str, redis: Redis, family: str, value: Any
) -> None:
    write, counted = FAMILIES[family]
    async with limits_app(redis_url) as app:
        q = app.queue()
        k = q._keys
        if family == "rate-setting":
            await q.set_rate_limit(1000, 60)
        await write(redis, k, value)
        await every_operation(app, redis)
        quarantined = await garbled(redis, k)
        sane = isinstance(value, int) and 0 <= value < 2**53
        if counted and not sane:
            assert quarantined, f"{family}={value!r} was not set aside"
        await check_invariants(redis, k)
        stats = await q.stats()
        assert all(0 <= n < 2**53 for n in stats.values()), stats


async def test_negative_one_in_a_counter_is_garbage_not_a_count(
    redis_url: str, redis: Redis
) -> None:
    """A counter at -1 would give 0 after its increment: set aside all the same (the count
    restarts at the increment), and the reason says it was out of range."""
    async with limits_app(redis_url) as app:
        q = app.queue()
        k = q._keys
        await redis.hset(k.stats, "enqueued", -1)
        await q.enqueue("echo")
        assert (await q.stats())["enqueued"] == 1
        assert (await garbled(redis, k))[k.stats] == "field enqueued out of range"
        aside = [v for v in [await redis.get(a) for a in await redis.hkeys(k.garbled)] if v]
        assert b"enqueued=-1" in aside


async def test_a_parked_workers_registration_with_huge_numbers_is_garbage(
    redis_url: str, redis: Redis
) -> None:
    """idlew holds "want lease dead_ttl nonce": numbers of 400 digits made an infinite PEXPIRE
    that stopped enqueue after the job was stored."""
    async with limits_app(redis_url) as app:
        q = app.queue()
        k = q._keys
        far = await server_ms(redis) + 60_000
        await redis.zadd(k.idle, {"w1": far})
        await redis.hset(k.idlew, "w1", f"1 {'9' * 400} 1000 abc")
        job = await q.enqueue("echo", kwargs={"x": 7})
        (r,) = await reserve_all(app, 1)
        assert r.id == job.id
        await q.complete(r, 7)
        assert await job.result(timeout=5) == 7
        await check_invariants(redis, k)


# ---------------------------------------------------------------------- the readers
async def test_readers_answer_over_scores_at_infinity_and_counts_at_the_limits(
    redis_url: str, redis: Redis
) -> None:
    """What Python reads back: a registry deadline or a lease deadline at +-inf (int(inf)
    raised OverflowError), a worker's counts at the 64-bit limits or garbage."""
    async with limits_app(redis_url) as app:
        q = app.queue()
        k = q._keys
        await redis.zadd(k.workers, {"ghost": float("inf"), "gone": float("-inf")})
        await redis.hset(k.worker("ghost"), mapping={"done": 2**63 - 1, "failed": "1e400"})
        job = await q.enqueue("echo", kwargs={"x": 1})
        (r,) = await reserve_all(app, 1)
        await redis.zadd(k.active, {r.id: float("inf")})
        workers = {w.id: w for w in await q.workers()}
        assert workers["ghost"].alive
        assert "gone" not in workers  # past its deadline: the claim buried it
        assert workers["ghost"].done == 2**63 - 1
        assert workers["ghost"].failed == 0
        detail = await q.job_detail(job.id)
        assert detail.info.id == job.id
        await q.complete(r, 1)
        assert await job.result(timeout=5) == 1


@pytest.mark.parametrize(
    "fields",
    [
        {"pos": 2**63 - 1},
        {"pos": -1},
        {"pos": 1.5},
        {"pos": "1e400"},
        {"sc": "nan"},
        {"an": [1, 2]},
        {"id": 5},
    ],
    ids=["pos-max64", "pos-neg", "pos-float", "pos-text", "sc-text", "an-ints", "id-int"],
)
async def test_a_listing_cursor_with_numbers_at_the_limits_is_a_typed_error(
    app: App, fields: dict[str, Any]
) -> None:
    from aioqueue import ConfigurationError

    q = app.queue()
    for i in range(3):
        await q.enqueue("echo", kwargs={"x": i})
    cursor = base64.urlsafe_b64encode(json.dumps({"src": "ready", **fields}).encode()).decode()
    with pytest.raises(ConfigurationError):
        await q.jobs("queued", limit=1, cursor=cursor)
    page = await q.jobs("queued", limit=1)  # a cursor this listing wrote goes on
    assert page.cursor is not None
    assert len((await q.jobs("queued", limit=5, cursor=page.cursor)).items) == 2


@pytest.mark.parametrize("value", LIMITS, ids=LIMIT_IDS)
async def test_a_jobs_attempts_at_a_limit_restart_and_the_job_runs(
    redis_url: str, redis: Redis, value: Any
) -> None:
    """A job record's attempts (a) or refunds (rf) at a limit: the claim restarts the count
    (the job runs, its attempt a sane number), a failure retries it by its maximum, and an
    expired lease brings it back as usual."""
    async with limits_app(redis_url) as app:
        q = app.queue()
        k = q._keys
        job = await q.enqueue("echo", kwargs={"x": 1})
        await redis.hset(k.job(job.id), mapping={"a": value, "rf": value})
        (r,) = await reserve_all(app, 1)
        assert r.attempt == 1
        assert r.max_attempts == 3
        await redis.hset(k.job(job.id), "a", value)
        await q.fail(r, "the first attempt fails", retry=True)  # retried, not dead-lettered
        (r,) = await reserve_all(app, 1)
        assert r.id == job.id
        assert 1 <= r.attempt < 2**53
        await q.complete(r, 1)
        assert await job.result(timeout=5) == 1
        await check_invariants(redis, k)


@pytest.mark.parametrize("value", LIMITS, ids=LIMIT_IDS)
async def test_why_reads_counts_and_times_at_the_limits_as_garbage_or_numbers(
    redis_url: str, redis: Redis, value: Any
) -> None:
    """why.lua reads a group's running count and limit, a rate window's count, a due time and
    a lease deadline: at the 64-bit limits or garbage each is no count (or the server's now),
    never a script error or a number Python cannot hold."""
    async with limits_app(redis_url) as app:
        q = app.queue()
        k = q._keys
        await q.enqueue("echo", job_id="g1", group="g")
        await redis.hset(k.gactive, "g", value)
        await redis.hset(k.gconf, "limit:g", value)
        await redis.hset(k.qconf, mapping={"rate_n": value, "rate_ms": 1000})
        w = await q.job("g1").why()
        assert w.rows[-1].reason.value == "position"
        for row in w.rows:
            assert row.limit is None or 0 <= row.limit < 2**53
            assert row.active is None or 0 <= row.active < 2**53
        await q.enqueue("echo", job_id="s1", delay=3600)
        await redis.hset(k.job("s1"), "due", value)
        await redis.zrem(k.scheduled, "s1")
        w = await q.job("s1").why()
        assert w.rows[0].reason.value == "scheduled"
        assert w.rows[0].until_ms is not None
        assert -(2**63) <= w.rows[0].until_ms < 2**63
        assert w.sentence().startswith("It ")


@pytest.mark.parametrize("value", LIMITS, ids=LIMIT_IDS)
async def test_a_max_queued_setting_at_the_limits_is_a_limit_or_none(
    redis_url: str, redis: Redis, value: Any
) -> None:
    """enqueue.lua reads qconf maxq and maxq_wait with count_of: at the 64-bit limits or
    garbage each is no limit (no wait), never a script error or a queue that refuses all."""
    async with limits_app(redis_url) as app:
        q = app.queue()
        await redis.hset(q._keys.qconf, mapping={"maxq": value, "maxq_wait": value})
        limit = await q.max_queued()
        await q.enqueue("echo", job_id="a")
        if limit is None:
            await q.enqueue("echo", job_id="b")
            assert (await q.counts())["queued"] == 2
        else:  # 2^53+1 is past count_of's range: only values within it are a limit
            assert limit[0] == int(value)


@pytest.mark.parametrize("value", [*LIMITS, 2**53 - 1], ids=[*LIMIT_IDS, "2^53-1"])
@pytest.mark.parametrize("field", ["t:echo", "t:other", "*"])
async def test_a_backlog_count_at_the_limits_never_refuses_for_ever(
    redis_url: str, redis: Redis, value: Any, field: str
) -> None:
    """The backlog's count (lib/core BL) at the 64-bit limits, garbage, or a sane integer no
    queue could hold (2^53-1: more than the keys on the server): with max_queued set, the
    enqueue that meets it sets the hash aside and counts from 0 again (listed in garbled),
    so producers are not refused for ever; the jobs are all stored and run."""
    async with limits_app(redis_url) as app:
        q = app.queue()
        await q.set_max_queued(5)
        await redis.hset(q._keys.backlog, field, value)
        jobs = [await q.enqueue("echo", kwargs={"x": i}) for i in range(5)]
        assert (await q.counts())["queued"] == 5
        with pytest.raises(QueueFull):  # counted afresh: exactly 5, so full
            await q.enqueue("echo", kwargs={"x": 6})
        assert sum((await q.backlog()).values()) == 5
        garbled = await redis.hgetall(q._keys.base + "garbled")
        assert any(b"backlog" in k for k in garbled)
        for r in await q.reserve(10):
            await q.complete(r, r.kwargs["x"])
        assert [await j.result(timeout=10) for j in jobs] == list(range(5))
        assert await q.backlog() == {}


@pytest.mark.parametrize("value", LIMITS, ids=LIMIT_IDS)
async def test_a_dependents_numbers_at_a_limit_the_graph_ends(
    redis_url: str, redis: Redis, value: Any
) -> None:
    """The number lib/deps reads from a dependent's record (dt, the retention of its
    cancelled end) at a limit: the dependent is cancelled when its dependency fails and kept
    (a garbage retention is none: kept for good); nothing stops midway."""
    async with limits_app(redis_url) as app:
        q = app.queue()
        k = q._keys
        dep = await q.enqueue("echo", kwargs={"x": 1})
        waiting = await app.tasks["echo"].options(depends_on=[dep]).enqueue(x=2)
        await redis.hset(k.job(waiting.id), "dt", value)
        (r,) = await reserve_all(app, 1)
        await q.fail(r, "for good", retry=False)
        info = await waiting.info()
        assert info.state.value == "cancelled"
        assert info.error is not None
        assert info.error.type == "DependencyFailed"
        ttl = await redis.pttl(k.job(waiting.id))
        assert ttl == -1 or ttl > 0  # kept: for good, or for a sane retention


# ---------------------------------------------------------------------- workflows (issue 27)
@pytest.mark.parametrize("value", LIMITS, ids=LIMIT_IDS)
async def test_a_log_byte_count_or_a_wait_end_at_a_limit_is_garbage_handled(
    redis_url: str, redis: Redis, value: Any
) -> None:
    """A job's log byte count (field lb) at a limit counts as 0 and is written over with a
    count in range; a recorded wait end (its step hash's d:<n>) at a limit counts as passed:
    the wait ends, it never parks the job for good."""
    async with limits_app(redis_url) as app:
        q = app.queue()
        k = q._keys
        job = await q.enqueue("echo", kwargs={"x": 1})
        (r,) = await reserve_all(app, 1)
        await redis.hset(k.job(job.id), "lb", str(value))
        assert await q._scripts.append_log(job.id, r.token, ["x" * 10]) == 1
        lb = int(await redis.hget(k.job(job.id), "lb") or -1)
        assert 0 <= lb <= JOB_LOG_BYTES
        ct = await redis.hget(k.job(job.id), "ct")
        assert ct is not None
        await redis.hset(k.steps(job.id), mapping={"ct": ct, "d:1": str(value)})
        assert await q._scripts.wait(job.id, r.token, 1, 3_600_000, "", 0) == [2]
        assert await job.state() is JobState.ACTIVE  # not parked: the wait counts as over
        await q.complete(r, 1)
        await check_invariants(redis, k)


# ---------------------------------------------------------------------- named limiters
#: where a limiter keeps numbers (docs/data-model.md): its key's state, its start log, its
#: run-time settings; (key under the limiter base, field or None for a list entry)
LIMITER_FIELDS = {
    "tat": ("lim:{api:}", "tat"),
    "factor": ("lim:{api:}", "f"),
    "decreased": ("lim:{api:}", "fd"),
    "log": ("lim:{api:}:log", None),
    "setting-n": ("lim:api", "n"),
    "setting-ms": ("lim:api", "ms"),
    "setting-burst": ("lim:api", "burst"),
    "setting-conc": ("lim:api", "conc"),
}


@pytest.mark.parametrize("value", LIMITS, ids=LIMIT_IDS)
@pytest.mark.parametrize("field", list(LIMITER_FIELDS))
async def test_a_limiters_numbers_at_every_limit_stop_no_job_of_it(
    redis_url: str, redis: Redis, field: str, value: Any
) -> None:
    async with limits_app(redis_url) as app:
        app.limiter("api", rate=(1000, 1.0), concurrency=5)

        @app.task(name="limited", limits=["api"])
        async def limited() -> None: ...

        key, name = LIMITER_FIELDS[field]
        key = f"{app.prefix}:{key}"
        if name is None:
            await redis.rpush(key, value)
        else:
            await redis.hset(key, name, value)
        jobs = [await limited.enqueue() for _ in range(2)]
        got = await reserve_all(app, 2)
        assert sorted(r.id for r in got) == sorted(j.id for j in jobs)
        for r in got:
            await app.queue().complete(r)


@pytest.mark.parametrize("value", LIMITS, ids=LIMIT_IDS)
async def test_a_parked_waiters_wait_number_at_a_limit_is_contained(
    redis_url: str, redis: Redis, value: Any
) -> None:
    """The wait number a parked waiter's record names (field wn, read by signal.lua) at a
    limit: the signal still wakes it, its payload lands under that number (not its wait's),
    so the resumed wait does not find it and parks the job again until the wait's end; the
    queue goes on, nothing stops midway (issue 27)."""
    async with limits_app(redis_url) as app:
        q = app.queue()
        k = q._keys
        job = await q.enqueue("echo", kwargs={"x": 1})
        (r,) = await reserve_all(app, 1)
        parked = await q._scripts.wait(job.id, r.token, 1, 3_600_000, "ev", 60_000)
        assert parked[0] == 3
        await redis.hset(k.job(job.id), "wn", value)
        assert await q._scripts.signal("ev", b"payload") == (1, 0)
        (r,) = await reserve_all(app, 1)
        again = await q._scripts.wait(job.id, r.token, 1, 3_600_000, "ev", 60_000)
        assert again == [3, parked[1]]  # parked again until the end it recorded first
        assert await job.state() is JobState.SCHEDULED
        other = await q.enqueue("echo", kwargs={"x": 2})
        (r2,) = await reserve_all(app, 1)
        assert r2.id == other.id
        await q.complete(r2, 2)
        await check_invariants(redis, k)
