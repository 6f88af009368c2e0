"""The pull API: reserve / complete / fail / release / extend, and waiting for results."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from aioqueue import (
    AioQueueError,
    App,
    Backoff,
    ClosedError,
    ConfigurationError,
    JobCancelled,
    JobFailed,
    JobNotFound,
    JobState,
    LeaseLost,
    Queue,
    Reservation,
    ResultTimeout,
    SerializationError,
)
from aioqueue._store.embedded import EmbeddedServer

from .support.apps import open_app, unique_prefix
from .support.invariants import check_invariants
from .support.proxy import ReplyDropProxy
from .support.server import blocked_in, clients_named, server_ms
from .support.waiting import PROMPT_S, wait_until

# also on a local Valkey Cluster (tests/conftest.py)
pytestmark = pytest.mark.cluster


async def lease_deadline(redis: Redis, queue: Queue, job_id: str) -> int:
    score = await redis.zscore(queue._keys.active, job_id)
    assert score is not None, f"job {job_id} holds no lease"
    return int(score)


async def reserve_one(queue: Queue, **kwargs: Any) -> Reservation:
    got = await queue.reserve(**kwargs)
    assert len(got) == 1, f"expected one reservation, got {got}"
    return got[0]


async def test_reserve_leases_a_job_until_a_server_clock_deadline(app: App, redis: Redis) -> None:
    q = app.queue()
    job = await q.enqueue("mail.send", ["ann@example.com"], {"urgent": True}, max_attempts=4)
    before = await server_ms(redis)
    r = await reserve_one(q, lease=10)
    after = await server_ms(redis)
    assert (r.id, r.task, r.queue) == (job.id, "mail.send", q.name)
    assert (r.args, r.kwargs) == (("ann@example.com",), {"urgent": True})
    assert (r.attempt, r.max_attempts) == (1, 4)
    assert r.token
    assert before + 10_000 <= await lease_deadline(redis, q, job.id) <= after + 10_000
    assert await job.state() is JobState.ACTIVE
    assert await q.reserve() == []  # one job, already leased
    assert await q.counts() == {"scheduled": 0, "queued": 0, "active": 1, "failed": 0}
    assert await check_invariants(redis, q._keys) == {job.id: "active"}


async def test_reserve_takes_the_highest_priority_first_fifo_within_a_level(
    app: App, redis: Redis
) -> None:
    q = app.queue()
    order = [0, 5, -5, 100, 5, 0, -100, 100]
    ids = [(await q.enqueue("t", [i], priority=p)).id for i, p in enumerate(order)]
    expected = sorted(range(len(order)), key=lambda i: (-order[i], i))
    got = await q.reserve(len(order))
    assert [r.id for r in got] == [ids[i] for i in expected]
    await check_invariants(redis, q._keys)


@pytest.mark.parametrize(("n", "lease"), [(0, None), (-1, None), (True, None), (1, 0), (1, -1)])
async def test_reserve_validates_its_arguments(app: App, n: Any, lease: Any) -> None:
    await app.queue().enqueue("t")
    with pytest.raises(ConfigurationError):
        await app.queue().reserve(n, lease=lease)
    assert (await app.queue().counts())["queued"] == 1


async def test_complete_stores_the_result_and_the_job_is_never_delivered_again(
    redis_url: str, redis: Redis
) -> None:
    async with open_app(redis_url, lease=0.2) as app:
        q = app.queue()
        job = await q.enqueue("t")
        r = await reserve_one(q)
        deadline = await lease_deadline(redis, q, job.id)
        await q.complete(r, {"ok": True, "n": [1, 2]})
        assert await job.state() is JobState.COMPLETED
        assert await job.result(timeout=1) == {"ok": True, "n": [1, 2]}
        info = await job.info()
        assert info.finished_ms is not None
        assert info.attempts == 1
        assert await check_invariants(redis, q._keys) == {job.id: "completed"}

        # the same ack again (as after a lost reply) is accepted and changes nothing
        await q.complete(r, "twice")
        assert await job.result(timeout=1) == {"ok": True, "n": [1, 2]}
        for again in (
            lambda: q.fail(r, "late"),
            lambda: q.release(r),
            lambda: q.extend(r),
        ):
            with pytest.raises(LeaseLost):
                await again()

        # long after the lease would have run out, nothing brings it back
        await wait_until(lambda: _server_past(redis, deadline + 50), what="the old lease deadline")
        assert (await q.reap())["recovered"] == 0
        assert await q.reserve(wait=0.2) == []
        assert await job.result(timeout=1) == {"ok": True, "n": [1, 2]}
        assert (await q.stats())["completed"] == 1


async def test_an_unserialisable_result_changes_nothing(app: App, redis: Redis) -> None:
    q = app.queue()
    job = await q.enqueue("t")
    r = await reserve_one(q, lease=30)
    deadline = await lease_deadline(redis, q, job.id)
    with pytest.raises(SerializationError):
        await q.complete(r, {"when": object()})
    assert await check_invariants(redis, q._keys) == {job.id: "active"}
    assert await lease_deadline(redis, q, job.id) == deadline
    await q.complete(r, {"when": "now"})  # the lease is still the caller's
    assert await job.result(timeout=1) == {"when": "now"}


async def _server_past(redis: Redis, ms: int) -> bool:
    return await server_ms(redis) > ms


# ---------------------------------------------------------------------------- results


async def test_result_waits_without_polling_and_returns_promptly(
    redis_url: str, redis: Redis
) -> None:
    prefix = unique_prefix()
    name = f"waiter-{prefix}"
    async with (
        open_app(redis_url, prefix=prefix) as worker,
        open_app(redis_url, prefix=prefix, redis_options={"client_name": name}) as waiter,
    ):
        q = worker.queue()
        job = await q.enqueue("t")
        r = await reserve_one(q)
        waiting = asyncio.create_task(waiter.queue().job(job.id).result(timeout=30))
        # the waiter has subscribed and marked the job as awaited: now it only listens
        await wait_until(
            lambda: redis.hexists(q._keys.job(job.id), "w"), what="the waiter to register"
        )

        async def commands() -> int:
            return sum(int(c["tot-cmds"]) for c in await clients_named(redis, name))

        before = await commands()
        done, _ = await asyncio.wait({waiting}, timeout=0.5)  # an observation window
        assert not done, "result() returned before the job finished"
        assert await commands() == before, "result() polled the server while waiting"

        loop = asyncio.get_running_loop()
        finished = loop.time()
        await q.complete(r, 42)
        assert await asyncio.wait_for(waiting, 5) == 42
        assert loop.time() - finished < PROMPT_S  # a re-check would take 5 s


async def test_many_waiters_of_one_job_all_get_the_result(app: App) -> None:
    q = app.queue()
    job = await q.enqueue("t")
    waiters = [asyncio.create_task(job.result(timeout=10)) for _ in range(20)]
    r = await reserve_one(q)
    await wait_until(lambda: app.redis.hexists(q._keys.job(job.id), "w"), what="waiters")
    await q.complete(r, "shared")
    assert await asyncio.gather(*waiters) == ["shared"] * 20


async def test_result_timeout(app: App) -> None:
    job = await app.queue().enqueue("t")
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(ResultTimeout) as caught:
        await job.result(timeout=0.3)
    elapsed = loop.time() - start
    assert 0.3 <= elapsed < 0.3 + PROMPT_S
    assert isinstance(caught.value, TimeoutError)
    assert await job.state() is JobState.QUEUED  # waiting changed nothing


async def test_result_of_a_dead_letter_raises_job_failed_with_its_error(
    app: App, redis: Redis
) -> None:
    q = app.queue()
    job = await q.enqueue("t")
    r = await reserve_one(q)
    try:
        raise ValueError("bad row 7")
    except ValueError as exc:
        error = exc
    assert await q.fail(r, error, retry=False) is False
    with pytest.raises(JobFailed) as caught:
        await job.result(timeout=1)
    err = caught.value
    assert (err.job_id, err.error_type, err.error_message) == (job.id, "ValueError", "bad row 7")
    assert err.traceback is not None
    assert "Traceback" in err.traceback
    assert 'raise ValueError("bad row 7")' in err.traceback
    info = await job.info()
    assert info.state is JobState.FAILED
    assert info.error is not None
    assert (info.error.type, info.error.message) == ("ValueError", "bad row 7")

    # a plain string reason works too
    other = await q.enqueue("t")
    await q.fail(await reserve_one(q), "gave up", retry=False)
    with pytest.raises(JobFailed, match="gave up"):
        await other.result(timeout=1)
    await check_invariants(redis, q._keys)


async def test_unknown_job_raises_job_not_found(app: App) -> None:
    missing = app.queue().job("no-such-job")
    with pytest.raises(JobNotFound) as caught:
        await missing.result(timeout=1)
    assert caught.value.job_id == "no-such-job"
    with pytest.raises(JobNotFound):
        await missing.state()
    with pytest.raises(JobNotFound):
        await missing.info()


async def test_result_pending_when_the_app_closes_raises_closed_error(redis_url: str) -> None:
    """Regression: the waiter's task used to get a CancelledError it never asked for."""
    async with open_app(redis_url) as app:
        job = await app.queue().enqueue("t")
        waiting = asyncio.create_task(job.result(timeout=10))
        await wait_until(
            lambda: app.redis.hexists(app.queue()._keys.job(job.id), "w"), what="the waiter"
        )
    # the App is closed: the waiter must learn why, not be cancelled
    with pytest.raises(ClosedError):
        await asyncio.wait_for(waiting, 5)


async def test_result_timeout_holds_when_subscribe_is_refused(
    fresh_server: EmbeddedServer,
) -> None:
    """Regression: an ACL user without channel rights (the Redis 7 default for new users)
    used to make result(timeout=) hang forever, and App.aclose() raise NOPERM."""
    await _user_without_channels(fresh_server)
    url = fresh_server.url.replace("redis://", "redis://worker:pw@")
    async with open_app(url) as app:
        job = await app.queue().enqueue("t")
        with pytest.raises(ResultTimeout):
            await asyncio.wait_for(job.result(timeout=0.3), 3)


async def test_an_awaited_job_can_be_finished_without_channel_rights(
    fresh_server: EmbeddedServer,
) -> None:
    await _user_without_channels(fresh_server)
    url = fresh_server.url.replace("redis://", "redis://worker:pw@")
    async with open_app(url, result_ttl=60) as app:
        q = app.queue()
        job = await q.enqueue("t")
        with pytest.raises(ResultTimeout):  # marks the job as awaited
            await job.result(timeout=0.2)
        (r,) = await q.reserve()
        await q.complete(r, "seen")
        assert await job.result(timeout=2) == "seen"
        assert 0 < await app.redis.pttl(q._keys.job(job.id)) <= 60_000
        assert (await q.stats())["completed"] == 1


async def test_a_connection_lost_while_subscribing_delays_a_result_but_never_fails_it(
    redis_url: str,
) -> None:
    """The pub/sub connection is cut with the reply to SUBSCRIBE (the Cluster's case, a
    connection killed under SSUBSCRIBE, is in test_cluster.py): the waiter still gets the
    result, and a later wait on the same App subscribes and gets its own."""
    no_retry = {"retry": Retry(NoBackoff(), 0)}  # as a Cluster's node connections have it
    async with (
        ReplyDropProxy(redis_url) as proxy,
        open_app(proxy.url, result_ttl=60, redis_options=no_retry) as app,
    ):
        q = app.queue()
        first, second = await q.enqueue("t"), await q.enqueue("t")
        proxy.arm(b"SUBSCRIBE")  # the server subscribes; the client's connection is cut
        waiting = asyncio.create_task(first.result(timeout=30))
        await wait_until(lambda: proxy.dropped == 1, what="the subscription's reply dropped")
        await wait_until(lambda: app.redis.hexists(q._keys.job(first.id), "w"), what="a waiter")
        for r in await q.reserve(2):
            await q.complete(r, r.id)
        assert await asyncio.wait_for(waiting, 35) == first.id
        assert await second.result(timeout=30) == second.id


async def _user_without_channels(server: EmbeddedServer) -> None:
    """What `ACL SETUSER worker on >pw ~* +@all` gives on Redis 7+: no channel rights."""
    admin = Redis.from_url(server.url)
    try:
        await admin.acl_setuser(
            "worker",
            enabled=True,
            passwords=["+pw"],
            keys=["*"],
            commands=["+@all"],
            reset_channels=True,
        )
    finally:
        await admin.aclose()


# ---------------------------------------------------------------------------- release


async def test_release_with_delay_reschedules_by_the_server_clock(app: App, redis: Redis) -> None:
    q = app.queue()
    job = await q.enqueue("t")
    r = await reserve_one(q)
    before = await server_ms(redis)
    await q.release(r, delay=3.0)
    after = await server_ms(redis)
    info = await job.info()
    assert info.state is JobState.SCHEDULED
    assert info.due_ms is not None
    assert before + 3000 <= info.due_ms <= after + 3000
    assert await check_invariants(redis, q._keys) == {job.id: "scheduled"}
    # not before it is due: a reserve made now gets it only if the checks above outlasted the
    # 3 s delay (a very loaded machine), and then only at or after its due time
    early = await q.reserve(lease=30)
    again = early[0] if early else await reserve_one(q, wait=30, lease=30)
    claimed_at = await lease_deadline(redis, q, job.id) - 30_000
    assert claimed_at >= info.due_ms
    assert again.attempt == 1  # the release refunded the attempt
    with pytest.raises(LeaseLost):
        await q.complete(r)  # the first reservation ended with the release


async def test_release_now_puts_the_job_back_at_the_front(app: App, redis: Redis) -> None:
    q = app.queue()
    first = await q.enqueue("t", [1])
    second = await q.enqueue("t", [2])
    r = await reserve_one(q)
    assert r.id == first.id
    await q.release(r)
    assert [x.id for x in await q.reserve(2)] == [first.id, second.id]
    await check_invariants(redis, q._keys)


async def test_release_refund_does_not_consume_an_attempt(app: App, redis: Redis) -> None:
    q = app.queue()
    job = await q.enqueue("t", max_attempts=1)
    for _ in range(3):  # released again and again: still its first attempt
        r = await reserve_one(q)
        assert r.attempt == 1
        await q.release(r)
        assert (await job.info()).attempts == 0
    r = await reserve_one(q)
    assert await q.fail(r, "boom") is False  # its only attempt: dead-lettered
    assert await job.state() is JobState.FAILED
    await check_invariants(redis, q._keys)


async def test_release_without_refund_counts_the_attempt(app: App) -> None:
    q = app.queue()
    job = await q.enqueue("t", max_attempts=3)
    r = await reserve_one(q)
    await q.release(r, refund=False)
    assert (await job.info()).attempts == 1
    assert (await reserve_one(q)).attempt == 2


# ---------------------------------------------------------------------------- fail / retry


async def test_fail_retries_after_its_delay_and_dead_letters_after_max_attempts(
    app: App, redis: Redis
) -> None:
    q = app.queue()
    job = await q.enqueue("t", max_attempts=3)

    r1 = await reserve_one(q)
    before = await server_ms(redis)
    # long enough that a loaded machine cannot let it fall due before the next reserve()
    assert await q.fail(r1, RuntimeError("flaky"), delay=2.0) is True
    after = await server_ms(redis)
    info = await job.info()
    assert info.state is JobState.SCHEDULED
    assert info.due_ms is not None
    assert before + 2000 <= info.due_ms <= after + 2000
    assert info.error is not None
    assert info.error.message == "flaky"
    assert await check_invariants(redis, q._keys) == {job.id: "scheduled"}
    # not reservable before it is due (checked only while well before: the invariant check
    # scans the keyspace, which on a loaded machine can take most of the delay)
    if await server_ms(redis) < info.due_ms - 500:
        assert await q.reserve() == []

    r2 = await reserve_one(q, wait=15, lease=30)
    assert await lease_deadline(redis, q, job.id) - 30_000 >= info.due_ms
    assert r2.attempt == 2
    with pytest.raises(LeaseLost):
        await q.fail(r1, "stale")
    assert await q.fail(r2, "again", delay=0) is True  # no delay: runnable at once
    assert await job.state() is JobState.QUEUED

    r3 = await reserve_one(q)
    assert r3.attempt == 3
    assert await q.fail(r3, "last") is False  # out of attempts, retry or not
    assert await job.state() is JobState.FAILED
    assert await redis.zscore(q._keys.dead, job.id) is not None
    assert await q.counts() == {"scheduled": 0, "queued": 0, "active": 0, "failed": 1}
    stats = await q.stats()
    assert (stats["retried"], stats["failed"]) == (2, 1)
    with pytest.raises(JobFailed, match="last"):
        await job.result(timeout=1)
    assert await q.reserve() == []
    assert await check_invariants(redis, q._keys) == {job.id: "failed"}


async def test_fail_without_retry_dead_letters_at_once(app: App, redis: Redis) -> None:
    q = app.queue()
    job = await q.enqueue("t", max_attempts=10)
    assert await q.fail(await reserve_one(q), "fatal", retry=False) is False
    assert await job.state() is JobState.FAILED
    assert await check_invariants(redis, q._keys) == {job.id: "failed"}


async def test_fail_without_a_delay_uses_the_backoff(redis_url: str, redis: Redis) -> None:
    async with open_app(redis_url, backoff=Backoff(base=0.25, factor=2, jitter=0)) as app:
        q = app.queue()
        job = await q.enqueue("t", max_attempts=5)
        for attempt, delay_ms in ((1, 250), (2, 500)):
            r = await reserve_one(q, wait=5)
            assert r.attempt == attempt
            before = await server_ms(redis)
            assert await q.fail(r, "retry me") is True
            after = await server_ms(redis)
            due = (await job.info()).due_ms
            assert due is not None
            assert before + delay_ms <= due <= after + delay_ms


# ---------------------------------------------------------------------------- leases (I2, I5)


async def test_abandoned_reservation_comes_back_and_the_old_token_is_stale(
    redis_url: str, redis: Redis
) -> None:
    prefix = unique_prefix()
    async with (
        open_app(redis_url, prefix=prefix) as gone,
        open_app(redis_url, prefix=prefix) as other,
    ):
        job = await gone.queue().enqueue("t")
        old = await reserve_one(gone.queue(), lease=0.3)
        deadline = await lease_deadline(redis, gone.queue(), job.id)

        q = other.queue()
        new = await reserve_one(q, wait=5, lease=30)  # blocks until the lease runs out
        claimed_at = await lease_deadline(redis, q, job.id) - 30_000
        assert claimed_at >= deadline
        assert (new.id, new.attempt) == (job.id, 2)
        assert new.token != old.token
        assert await check_invariants(redis, q._keys) == {job.id: "active"}

        for stale in (
            lambda: gone.queue().complete(old, "from the lost consumer"),
            lambda: gone.queue().fail(old, "x"),
            lambda: gone.queue().release(old),
            lambda: gone.queue().extend(old),
        ):
            with pytest.raises(LeaseLost):
                await stale()
        assert await check_invariants(redis, q._keys) == {job.id: "active"}
        await q.complete(new, "from the new holder")
        assert await job.result(timeout=1) == "from the new holder"
        assert (await q.stats())["expired"] == 1


async def test_lease_expiry_on_the_last_attempt_dead_letters_the_job(
    redis_url: str, redis: Redis
) -> None:
    async with open_app(redis_url) as app:
        q = app.queue()
        job = await q.enqueue("poison", max_attempts=2)
        for attempt in (1, 2):  # each consumer "dies" holding it
            r = await reserve_one(q, wait=5, lease=0.2)
            assert r.attempt == attempt
        deadline = await lease_deadline(redis, q, job.id)
        await wait_until(lambda: _server_past(redis, deadline), what="the last lease to expire")
        assert await q.reserve() == []
        assert await job.state() is JobState.FAILED
        with pytest.raises(JobFailed) as caught:
            await job.result(timeout=1)
        assert caught.value.error_type == "LeaseExpired"
        assert "attempt 2 of 2" in caught.value.error_message
        assert await check_invariants(redis, q._keys) == {job.id: "failed"}


async def test_extend_keeps_a_lease_alive_past_its_first_deadline(
    redis_url: str, redis: Redis
) -> None:
    prefix = unique_prefix()
    async with (
        open_app(redis_url, prefix=prefix) as holder,
        open_app(redis_url, prefix=prefix) as rival,
    ):
        job = await holder.queue().enqueue("t")
        # a lease of 1 s renewed every 50 ms: a loaded machine (or a cluster's routing)
        # cannot hold a renewal back that long
        r = await reserve_one(holder.queue(), lease=1.0)
        first_deadline = await lease_deadline(redis, holder.queue(), job.id)

        async def heartbeat() -> None:
            while True:
                await holder.queue().extend(r, lease=1.0)
                await asyncio.sleep(0.05)

        beat = asyncio.create_task(heartbeat())
        try:
            # the rival waits through three original lease lengths and gets nothing
            assert await rival.queue().reserve(wait=3.0) == []
            assert await server_ms(redis) > first_deadline + 1000
        finally:
            beat.cancel()
            await asyncio.gather(beat, return_exceptions=True)
        before = await server_ms(redis)
        await holder.queue().extend(r, lease=5)
        assert await lease_deadline(redis, holder.queue(), job.id) >= before + 5000
        await holder.queue().complete(r, "done")
        assert await job.result(timeout=1) == "done"
        assert (await holder.queue().stats()).get("expired", 0) == 0


# ---------------------------------------------------------------------------- blocking reserve


async def test_reserve_wait_returns_as_soon_as_a_job_is_enqueued(
    redis_url: str, redis: Redis
) -> None:
    prefix = unique_prefix()
    name = f"consumer-{prefix}"
    async with (
        open_app(redis_url, prefix=prefix, redis_options={"client_name": name}) as consumer,
        open_app(redis_url, prefix=prefix) as producer,
    ):
        loop = asyncio.get_running_loop()
        waiting = asyncio.create_task(consumer.queue().reserve(wait=30))
        await wait_until(lambda: blocked_in(redis, name), what="the consumer to block")
        enqueued_at = loop.time()
        job = await producer.queue().enqueue("t")
        got = await asyncio.wait_for(waiting, 35)
        assert [r.id for r in got] == [job.id]
        assert loop.time() - enqueued_at < PROMPT_S  # far from the 30 s wait: woken


async def test_reserve_wait_wakes_when_a_delayed_job_falls_due(app: App, redis: Redis) -> None:
    q = app.queue()
    loop = asyncio.get_running_loop()
    job = await q.enqueue("t", delay=0.4)
    due = (await job.info()).due_ms
    assert due is not None
    start = loop.time()
    r = await reserve_one(q, wait=10, lease=30)
    claimed_at = await lease_deadline(redis, q, job.id) - 30_000
    assert r.id == job.id
    assert claimed_at >= due
    assert claimed_at - due < 250
    assert loop.time() - start < 2.0


async def test_reserve_wait_times_out_empty(app: App) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await app.queue().reserve(wait=0.3) == []
    assert 0.3 <= loop.time() - start < 2.0


async def test_reserve_can_wait_longer_than_the_socket_timeout(redis_url: str) -> None:
    async with open_app(redis_url, redis_options={"socket_timeout": 1}) as app:
        loop = asyncio.get_running_loop()
        start = loop.time()
        assert await app.queue().reserve(wait=1.5) == []
        assert loop.time() - start >= 1.5


# ---------------------------------------------------------------------------- cancellation


async def test_a_cancelled_queued_job_is_never_delivered(app: App, redis: Redis) -> None:
    q = app.queue()
    job = await q.enqueue("t")
    keep = await q.enqueue("t")
    assert await job.cancel() is True
    assert await job.state() is JobState.CANCELLED
    with pytest.raises(JobCancelled):
        await job.result(timeout=1)
    assert [r.id for r in await q.reserve(5)] == [keep.id]
    assert await check_invariants(redis, q._keys) == {job.id: "cancelled", keep.id: "active"}


async def test_counts_do_not_report_a_cancelled_job_as_queued(app: App) -> None:
    job = await app.queue().enqueue("t")
    assert await job.cancel() is True
    assert (await app.queue().counts())["queued"] == 0


async def test_extend_tells_a_pull_consumer_that_its_job_was_cancelled(app: App) -> None:
    q = app.queue()
    job = await q.enqueue("t")
    r = await reserve_one(q)
    assert await job.cancel() is False  # running: flagged, stopped by its holder
    with pytest.raises(AioQueueError):
        await q.extend(r)


async def test_a_job_cancelled_while_held_is_not_delivered_again_after_its_lease(
    app: App, redis: Redis
) -> None:
    q = app.queue()
    job = await q.enqueue("t")
    await reserve_one(q, lease=0.2)  # its holder then vanishes
    assert await job.cancel() is False
    assert await q.reserve(wait=1) == []
    assert await job.state() is JobState.CANCELLED
    assert await check_invariants(redis, q._keys) == {job.id: "cancelled"}


# ---------------------------------------------------------------------------- bad payloads (I7)


async def test_an_undecodable_payload_is_dead_lettered_and_reserve_carries_on(
    app: App, redis: Redis
) -> None:
    q = app.queue()
    bad = await q.enqueue("t", ["will be corrupted"])
    good = await q.enqueue("t", ["fine"])
    await redis.hset(q._keys.job(bad.id), "p", b"\xff not a payload")
    got = await q.reserve(2)
    assert [r.id for r in got] == [good.id]
    assert await bad.state() is JobState.FAILED
    with pytest.raises(JobFailed) as caught:
        await bad.result(timeout=1)
    # the same reason as a worker records, with the decoder's error in the message
    assert caught.value.error_type == "CorruptPayload"
    assert "cannot decode" in str(caught.value)
    assert await check_invariants(redis, q._keys) == {bad.id: "failed", good.id: "active"}
