"""Job expiry (``.options(expires=...)``): a job no run of which started by then is recorded as
cancelled with the reason Expired, at claim time, and never run late; and ``keep_result=``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from redis.asyncio import Redis

from aioqueue import App, ConfigurationError, JobCancelled, JobState, Retry, Worker

from .support.server import server_ms
from .support.waiting import wait_until


async def past(redis: Redis, app: App, job_id: str, ms: int) -> None:
    """Wait until the server's clock is ``ms`` past the job's creation."""
    created = (await app.queue().job_info(job_id)).created_ms
    assert created is not None
    await wait_until(lambda: _after(redis, created + ms), timeout=30, what="the expiry to pass")


async def _after(redis: Redis, when: int) -> bool:
    return await server_ms(redis) > when


async def assert_expired(app: App, job_id: str) -> None:
    info = await app.queue().job_info(job_id)
    assert info.state is JobState.CANCELLED
    assert info.error is not None
    assert info.error.type == "Expired"
    with pytest.raises(JobCancelled) as caught:
        await app.queue().job(job_id).result(timeout=5)
    assert caught.value.reason == "Expired"


async def test_a_job_past_its_expiry_is_not_handed_out(app: App, redis: Redis) -> None:
    @app.task
    async def work() -> None:
        pass

    job = await work.options(expires=0.2).enqueue()
    fresh = await work.options(expires=60).enqueue()
    plain = await work.enqueue()
    await past(redis, app, job.id, 200)
    got = await app.queue().reserve(10, lease=30)
    assert sorted(r.id for r in got) == sorted([fresh.id, plain.id])
    await assert_expired(app, job.id)
    assert (await app.queue().stats())["cancelled"] == 1


async def test_an_expired_delayed_job_never_runs(app: App, redis: Redis) -> None:
    ran: list[str] = []

    @app.task
    async def work(tag: str) -> None:
        ran.append(tag)

    late = await work.options(delay=0.1, expires=0.3).enqueue("late")
    ok = await work.options(delay=0.1, expires=timedelta(minutes=5)).enqueue("ok")
    await past(redis, app, late.id, 300)  # no worker ran while it was due and fresh
    await Worker(app, burst=True).run()
    assert ran == ["ok"]
    await ok.result(timeout=5)
    await assert_expired(app, late.id)


async def test_a_job_that_expires_while_its_queue_is_paused_never_runs(
    app: App, redis: Redis
) -> None:
    ran: list[str] = []

    @app.task
    async def work(tag: str) -> None:
        ran.append(tag)

    q = app.queue()
    await q.pause()
    job = await work.options(expires=0.3).enqueue("expiring")
    keep = await work.enqueue("kept")
    await past(redis, app, job.id, 300)
    await q.resume()
    await Worker(app, burst=True).run()
    assert ran == ["kept"]
    await keep.result(timeout=5)
    await assert_expired(app, job.id)


async def test_an_absolute_expiry_and_by_name_enqueue(app: App, redis: Redis) -> None:
    gone = datetime.fromtimestamp((await server_ms(redis) - 1000) / 1000, UTC)
    q = app.queue()
    job = await q.enqueue("t", expires=gone)
    later = await q.enqueue("t", expires=datetime.now(UTC) + timedelta(hours=1))
    got = await q.reserve(10, lease=30)
    assert [r.id for r in got] == [later.id]
    await assert_expired(app, job.id)


async def test_a_retry_due_after_the_expiry_is_discarded(app: App, redis: Redis) -> None:
    runs: list[int] = []

    @app.task(max_attempts=5)
    async def flaky() -> None:
        runs.append(1)
        raise Retry(delay=0.5)

    job = await flaky.options(expires=0.3).enqueue()
    async with Worker(app):
        await wait_until(lambda: runs == [1], what="the first run")
        await past(redis, app, job.id, 300)
        await wait_until(
            lambda: _state_is(app, job.id, JobState.CANCELLED), timeout=30, what="the expiry"
        )
    assert runs == [1]
    await assert_expired(app, job.id)


async def _state_is(app: App, job_id: str, state: JobState) -> bool:
    return (await app.queue().job_info(job_id)).state is state


def test_expiry_options_are_checked(app: App) -> None:
    @app.task
    async def work() -> None:
        pass

    with pytest.raises(ConfigurationError, match="later than delay"):
        work.options(delay=5, expires=5)
    with pytest.raises(ConfigurationError, match="timezone-aware"):
        work.options(expires=datetime(2030, 1, 1))
    with pytest.raises(ConfigurationError):
        work.options(expires=-1)


async def test_keep_result_per_task(app: App, redis: Redis) -> None:
    @app.task(keep_result=False)
    async def dropped() -> int:
        return 1

    @app.task(keep_result=True)
    async def kept() -> int:
        return 2

    @app.task(keep_result=timedelta(seconds=120))
    async def timed() -> int:
        return 3

    @app.task
    async def default() -> int:
        return 4

    jobs = [await t.enqueue() for t in (dropped, kept, timed, default)]
    await Worker(app, burst=True).run()
    q = app.queue()
    ttls = [await redis.pttl(q._keys.job(j.id)) for j in jobs]
    assert ttls[0] == -2  # not kept at all
    assert ttls[1] == -1  # kept for good, overriding the App's default (a day)
    assert 0 < ttls[2] <= 120_000
    assert 120_000 < ttls[3] <= 86_400_000
    assert await jobs[1].result(timeout=5) == 2


def test_keep_result_and_result_ttl_are_one_setting(app: App) -> None:
    with pytest.raises(ConfigurationError, match="keep_result"):

        @app.task(keep_result=5, result_ttl=5)
        async def both() -> None:
            pass


async def test_an_idle_worker_is_never_handed_an_expired_job(app: App, redis: Redis) -> None:
    ran: list[str] = []

    @app.task
    async def work(tag: str) -> None:
        ran.append(tag)

    gone = datetime.fromtimestamp((await server_ms(redis) - 1000) / 1000, UTC)
    async with Worker(app, scheduler=False):
        # enqueue hands new jobs straight to a parked worker (lib/handoff): not this one
        job = await work.options(expires=gone).enqueue("expired")
        ok = await work.enqueue("fresh")
        await ok.result(timeout=30)
        await wait_until(lambda: _state_is(app, job.id, JobState.CANCELLED), what="the expiry")
    assert ran == ["fresh"]
    await assert_expired(app, job.id)
