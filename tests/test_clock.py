"""The testing kit's virtual clock (``aioqueue.testing.VirtualClock``, ``App(testing=True)``):
the real scripts see time move without anyone sleeping; only Apps in test mode do."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from redis.asyncio import Redis

from aioqueue import App, Backoff, ConfigurationError, JobState, Worker
from aioqueue._store.clock import PRODUCTION_NOW, TEST_NOW
from aioqueue.testing import VirtualClock, run_until_empty, unique_prefix

from .support.server import server_ms

LUA = Path(__file__).resolve().parents[1] / "aioqueue" / "_store" / "lua"
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


@pytest.fixture
async def tapp(redis_url: str) -> AsyncIterator[App]:
    async with App(redis_url, prefix=unique_prefix(), testing=True) as app:
        yield app


@pytest.mark.cluster
async def test_a_one_hour_retry_backoff_is_checked_in_milliseconds(tapp: App) -> None:
    clock = VirtualClock(tapp)
    attempts: list[int] = []

    @tapp.task(max_attempts=2, backoff=Backoff(base=3600, max=7200, jitter=0))
    async def flaky() -> str:
        attempts.append(len(attempts) + 1)
        if len(attempts) == 1:
            raise RuntimeError("first attempt fails")
        return "ok"

    started = time.monotonic()
    job = await flaky.enqueue()
    first = await run_until_empty(tapp, delayed="skip")
    assert (first.failed, first.scheduled) == (1, 1)  # the retry waits for its hour
    await clock.advance(HOUR - timedelta(seconds=1))
    assert (await run_until_empty(tapp, delayed="skip")).scheduled == 1  # not due yet
    assert attempts == [1]
    await clock.advance(timedelta(seconds=1))
    second = await run_until_empty(tapp, delayed="skip")
    assert (second.completed, second.scheduled) == (1, 0)
    assert attempts == [1, 2]
    assert await job.result(timeout=5) == "ok"
    assert await clock.offset() == HOUR
    assert time.monotonic() - started < 20  # an hour of backoff, in (loaded-machine) seconds


async def test_a_daily_cron_ticks_once_per_virtual_day(tapp: App) -> None:
    clock = VirtualClock(tapp)
    ran: list[str] = []

    @tapp.cron("0 3 * * *")  # 03:00 UTC every day
    @tapp.task
    async def nightly_report() -> None:
        ran.append("report")

    await run_until_empty(tapp)  # the burst worker stores the declared schedule
    [info] = await tapp.schedules.list()
    assert info.next_run is not None
    assert info.next_run.hour == 3
    first_tick = info.next_run
    await clock.advance_to(first_tick - timedelta(minutes=1))
    assert await clock.fire_schedules() == 0  # a minute early: nothing
    await clock.advance(timedelta(minutes=1))  # 03:00 (the advance fires the tick)
    assert (await run_until_empty(tapp)).completed == 1
    assert ran == ["report"]
    [info] = await tapp.schedules.list()
    assert info.next_run == first_tick + DAY
    await clock.advance(DAY)  # the next night
    assert (await run_until_empty(tapp)).completed == 1
    assert ran == ["report", "report"]
    [info] = await tapp.schedules.list()
    assert info.next_run == first_tick + 2 * DAY


async def test_a_delayed_job_wakes_a_sleeping_worker_when_the_clock_passes_its_due_time(
    tapp: App,
) -> None:
    clock = VirtualClock(tapp)
    done = asyncio.Event()

    @tapp.task
    async def remind() -> None:
        done.set()

    async with Worker(tapp, concurrency=1):
        await remind.options(delay=3 * 3600).enqueue()
        await asyncio.sleep(0)  # the worker is parked on the wake list, for hours
        await clock.advance(timedelta(hours=3))
        await asyncio.wait_for(done.wait(), timeout=20)  # woken: not three hours later


async def test_an_abandoned_lease_runs_out_on_the_virtual_clock_and_the_job_is_requeued(
    tapp: App,
) -> None:
    clock = VirtualClock(tapp)

    @tapp.task
    async def work() -> str:
        return "done"

    job = await work.enqueue()
    q = tapp.queue()
    [held] = await q.reserve(lease=600)  # a consumer takes it and goes away
    assert held.id == job.id
    assert await q.reserve() == []
    await clock.advance(timedelta(seconds=601))
    summary = await run_until_empty(tapp)  # the expired lease is recovered and run
    assert summary.completed == 1
    info = await job.info()
    assert info.state is JobState.COMPLETED
    assert info.attempts == 2


@pytest.mark.cluster
async def test_a_rate_limit_window_opens_when_the_clock_passes_it(tapp: App) -> None:
    clock = VirtualClock(tapp)

    @tapp.task
    async def call_api(n: int) -> int:
        return n

    q = tapp.queue()
    await q.set_rate_limit(1, period=HOUR)
    for n in range(2):
        await call_api.enqueue(n)
    assert len(await q.reserve(2)) == 1  # one start per hour
    assert await q.reserve() == []
    await clock.advance(HOUR)
    assert len(await q.reserve()) == 1  # the next window


async def test_a_jobs_expiry_passes_on_the_virtual_clock(tapp: App) -> None:
    clock = VirtualClock(tapp)

    @tapp.task
    async def offer() -> None:
        raise AssertionError("an expired job must not run")

    job = await offer.options(expires=timedelta(minutes=10), delay=300).enqueue()
    await clock.advance(timedelta(minutes=11))  # due, and past its expiry
    summary = await run_until_empty(tapp, delayed="skip")
    assert (summary.completed, summary.failed, summary.scheduled) == (0, 0, 0)
    assert (await job.info()).state is JobState.CANCELLED


async def test_the_python_side_reads_the_same_shifted_clock(tapp: App, redis: Redis) -> None:
    clock = VirtualClock(tapp)
    await clock.advance(DAY)
    with pytest.raises(ConfigurationError, match=">= 0"):
        await clock.advance(-1)  # the clock never goes back
    assert await clock.offset() == DAY
    shifted = await tapp.queue()._scripts.server_ms()
    real = await server_ms(redis)
    assert DAY.total_seconds() * 1000 - 5000 < shifted - real <= DAY.total_seconds() * 1000 + 5000

    @tapp.task
    async def waits() -> None: ...

    await waits.enqueue()  # created by the scripts' clock, aged by Python's: the same clock
    wait = await tapp.queue().wait_time()
    assert wait is not None
    assert 0 <= wait < 60


async def test_a_garbage_offset_counts_as_none_and_breaks_no_script(
    tapp: App, redis: Redis
) -> None:
    """In test mode too, an offset that is not a number (or a key of another type) is 0:
    every script still runs (tests/test_hostile.py has the production App's row)."""

    @tapp.task
    async def echo(x: int) -> int:
        return x

    key = tapp.queue()._keys.testclock
    for garbage in (b"nan", b"1e400", b"-inf", b"not a number"):
        await redis.set(key, garbage)
        assert abs(await tapp.queue()._scripts.server_ms() - await server_ms(redis)) < 5000
        job = await echo.enqueue(1)
        assert (await run_until_empty(tapp)).completed == 1
        assert await job.result(timeout=5) == 1
    await redis.delete(key)
    await redis.hset(key, "x", "1")
    assert (await run_until_empty(tapp)).completed == 0
    await echo.enqueue(2)
    assert (await run_until_empty(tapp)).completed == 1


def test_every_script_reads_the_time_through_core_now_ms_only() -> None:
    readers = {
        str(path.relative_to(LUA)): len(re.findall(r"['\"]TIME['\"]", path.read_text()))
        for path in LUA.rglob("*.lua")
    }
    assert {name: n for name, n in readers.items() if n} == {"lib/core.lua": 1}
    core = (LUA / "lib" / "core.lua").read_text()
    assert core.count(PRODUCTION_NOW) == 1
    assert "testclock" not in core  # the production build reads no offset
    assert "testclock" in TEST_NOW


async def test_the_blocking_producer_of_a_test_mode_app_runs_on_the_same_clock(tapp: App) -> None:
    clock = VirtualClock(tapp)

    @tapp.task
    async def later(n: int) -> int:
        return n

    await clock.advance(DAY)  # a day ahead already: a delay counts from the virtual now
    sync = tapp.sync()
    try:
        job = await asyncio.to_thread(lambda: sync.enqueue(later.options(delay=3600), 7))
    finally:
        await asyncio.to_thread(sync.close)
    assert (await run_until_empty(tapp, delayed="skip")).scheduled == 1
    await clock.advance(HOUR)
    assert (await run_until_empty(tapp, delayed="skip")).completed == 1
    assert (await tapp.queue().job_info(job.id)).state is JobState.COMPLETED


async def test_a_queue_the_app_does_not_know_follows_the_prefixs_clock(tapp: App) -> None:
    clock = VirtualClock(tapp)
    await clock.advance(DAY)
    q = tapp.queue("elsewhere")  # no task names it, no worker registered it
    job = await q.enqueue("anything", delay=3600)
    assert await q.reserve() == []
    await clock.advance(HOUR)  # sets the App's queues and the prefix's offset
    [reserved] = await q.reserve()
    assert reserved.id == job.id
