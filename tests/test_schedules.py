"""Periodic schedules in Redis: managing them at run time, firing a tick exactly once
(schedule.lua's compare-and-set on the stored tick, judged by the server's clock), missed-tick
policies, jitter, and schedulers in several in-process workers racing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from aioqueue import App, ConfigurationError, JobState, Worker
from aioqueue._app.schedules import Scheduler
from aioqueue._model.cron import Spec, job_id_for
from aioqueue._model.record import JobRecord, Template
from aioqueue._store.outcomes import TickOutcome

from .support.apps import open_app, unique_prefix
from .support.invariants import check_invariants
from .support.server import server_ms, text
from .support.waiting import wait_until


@pytest.mark.cluster  # also on a local cluster: the listing scans every primary
async def test_schedules_are_added_listed_and_removed_from_any_process(
    app: App, redis_url: str
) -> None:
    @app.task
    async def report(kind: str) -> None:
        pass

    info = await app.schedules.add(report, every=timedelta(minutes=5), args=["daily"])
    assert info.name == "report"
    assert info.every == timedelta(minutes=5)
    assert info.next_run is not None
    assert info.next_run.timestamp() % 300 == 0
    await app.schedules.add("report", cron="0 9 * * 1-5", tz="Europe/Berlin", name="weekdays")
    async with open_app(redis_url, prefix=app.prefix) as other:  # knows no tasks
        listed = await other.schedules.list()
        assert {s.name for s in listed} == {"report", "weekdays"}
        weekdays = next(s for s in listed if s.name == "weekdays")
        assert (weekdays.cron, weekdays.tz, weekdays.queue) == (
            "0 9 * * 1-5",
            "Europe/Berlin",
            "default",
        )
        assert await other.schedules.remove("weekdays")
        assert not await other.schedules.remove("weekdays")
    assert [s.name for s in await app.schedules.list()] == ["report"]


async def test_bad_schedules_are_refused(app: App) -> None:
    @app.task
    async def work(n: int) -> None:
        pass

    with pytest.raises(ConfigurationError, match="cron"):
        await app.schedules.add(work, cron="* * *", args=[1])
    with pytest.raises(ConfigurationError):
        await app.schedules.add(work, cron="* * * * *", every=5, args=[1])
    with pytest.raises(TypeError):
        await app.schedules.add(work, every=5)  # work() needs n
    with pytest.raises(ConfigurationError, match="JSON"):
        await app.schedules.add(work, every=5, args=[object()])
    with pytest.raises(ConfigurationError, match=r"above @app\.task"):
        app.cron("* * * * *")(work.fn)  # type: ignore[type-var]
    app.schedule(work, every=5, args=[1])
    with pytest.raises(ConfigurationError, match="already declared"):
        app.schedule(work, every=10, args=[2])
    assert await app.schedules.list() == []  # declaring does no I/O


def _spec(app: App, name: str = "s", **kw: Any) -> Spec:
    fields: dict[str, Any] = {"task": "t", "queue": app.default_queue, "every_ms": 1000}
    return Spec(name=name, **(fields | kw))


async def test_schedule_lua_fires_a_tick_once_and_refuses_stale_or_early_callers(
    app: App, redis: Redis
) -> None:
    q = app.queue()
    s = q._scripts
    now = await server_ms(redis)
    tick = now - now % 1000
    assert await s.schedule_put("s", _spec(app).to_json(), tick) == 1
    job = JobRecord(job_id_for("s", tick), b"[[],{}]", Template("t", 3))
    # a scheduler that read another tick is refused, and so is one that is early
    assert (await s.schedule_tick("s", tick - 1000, tick + 1000, job))[1] is TickOutcome.STALE
    assert await s.schedule_put("s", _spec(app).to_json(), tick + 60_000) == 0  # unchanged
    await redis.zadd(q._keys.cron_next, {"s": tick + 60_000})
    early = await s.schedule_tick("s", tick + 60_000, tick + 61_000, job)
    assert early[1] is TickOutcome.NOT_DUE
    await redis.zadd(q._keys.cron_next, {"s": tick})
    assert (await s.schedule_tick("s", tick, tick + 1000, job))[1] is TickOutcome.FIRED
    # the same tick again, even once its job ran and its record is gone (keep_result=False):
    # stale; the stored tick moved on exactly once
    await redis.delete(q._keys.job(job.id))
    await redis.delete(q._keys.ready)
    assert (await s.schedule_tick("s", tick, tick + 1000, job))[1] is TickOutcome.STALE
    assert not await redis.exists(q._keys.job(job.id))
    await q.enqueue("t", job_id=job.id)  # back, for the checks below
    assert await redis.zscore(q._keys.cron_next, "s") == tick + 1000
    assert await q.counts() == {**await q.counts(), "queued": 1}
    # a tick whose job already exists (enqueued by hand): the tick moves on, no second job
    await redis.zadd(q._keys.cron_next, {"s": tick - 1000})
    again = JobRecord(job.id, b"[[],{}]", Template("t", 3))
    assert (await s.schedule_tick("s", tick - 1000, tick + 1000, again))[1] is TickOutcome.ADVANCED
    assert (await q.counts())["queued"] == 1
    assert (await s.schedule_tick("nope", tick, tick + 1000, job))[1] is TickOutcome.NO_SCHEDULE
    states = await check_invariants(redis, q._keys)
    assert states == {job.id: "queued"}


async def _due_in_past(redis: Redis, app: App, name: str, seconds_ago: float) -> int:
    """Pretend no scheduler ran for a while: the stored tick is long past."""
    now = await server_ms(redis)
    tick = now - int(seconds_ago * 1000)
    tick -= tick % 1000
    await redis.zadd(app.queue()._keys.cron_next, {name: tick})
    return tick


@pytest.mark.parametrize("missed", ["skip", "once"])
async def test_ticks_missed_while_no_worker_ran_follow_the_policy(
    app: App, redis: Redis, missed: str
) -> None:
    @app.task
    async def beat() -> None:
        pass

    grace = 5_000
    await app.schedules.add(beat, every=60, missed=missed, grace=timedelta(milliseconds=grace))  # type: ignore[arg-type]
    # clear of the grace boundary: the current minute's tick is already more than 8 s late
    await wait_until(
        lambda: _second_of_minute_past(redis, 8_000), timeout=30, what="8 s into a minute"
    )
    now = await server_ms(redis)
    minute = now - now % 60_000
    stored = minute - 10 * 60_000  # as if no worker ran for ten minutes
    await redis.zadd(app.queue()._keys.cron_next, {"beat": stored})
    scheduler = Scheduler(app, [app.default_queue])
    while await scheduler.fire_due(app.default_queue) == 0:
        pass
    ids = {text(j) for j in await redis.lrange(app.queue()._keys.ready, 0, -1)}
    ticks = sorted(int(i.rsplit(":", 1)[1]) for i in ids)
    missed_ticks = [t for t in ticks if t <= minute]
    if missed == "skip":
        assert missed_ticks == []
    else:
        assert missed_ticks == [minute]  # one job for the ten missed ticks: the last one's id
    assert ids == {job_id_for("beat", t) for t in ticks}
    # the stored tick moved past the missed ones, to the first one not missed
    assert await redis.zscore(app.queue()._keys.cron_next, "beat") >= minute + 60_000  # type: ignore[operator]


async def _second_of_minute_past(redis: Redis, ms: int) -> bool:
    return await server_ms(redis) % 60_000 > ms


async def test_jitter_delays_a_ticks_job_deterministically(app: App, redis: Redis) -> None:
    @app.task
    async def beat() -> None:
        pass

    await app.schedules.add(beat, every=3600, jitter=600)
    tick = await _due_in_past(redis, app, "beat", 0.5)
    await Scheduler(app, [app.default_queue]).fire_due(app.default_queue)
    info = await app.queue().job_info(job_id_for("beat", tick))
    spec = _spec(app, "beat", every_ms=3_600_000, jitter_ms=600_000)
    assert info.state is JobState.SCHEDULED
    assert info.due_ms == tick + spec.jitter_for(tick)


async def test_a_garbled_definition_is_logged_and_the_others_still_fire(
    app: App, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    @app.task
    async def beat() -> None:
        pass

    await app.schedules.add(beat, every=3600)
    k = app.queue()._keys
    await redis.hset(k.cron_defs, "bad", b"{not json")
    tick = await _due_in_past(redis, app, "beat", 0.5)
    await _due_in_past(redis, app, "bad", 0.5)
    with caplog.at_level(logging.ERROR, logger="aioqueue"):
        await Scheduler(app, [app.default_queue]).fire_due(app.default_queue)
    assert "garbled definition" in caplog.text
    assert (await app.queue().job_info(job_id_for("beat", tick))).state is JobState.QUEUED
    assert [s.name for s in await app.schedules.list()] == ["beat"]


@contextlib.asynccontextmanager
async def schedule_app(redis_url: str, prefix: str, seen: list[str]) -> AsyncIterator[App]:
    """An App (one 'process') declaring the schedule 'tick' every 0.2 s in code."""
    async with open_app(redis_url, prefix=prefix) as app:

        @app.task
        async def tick() -> None:
            from aioqueue import current_job

            seen.append(current_job().id)

        app.schedule(tick, every=timedelta(milliseconds=200))
        yield app


@pytest.mark.cluster
async def test_racing_workers_fire_each_tick_exactly_once(redis_url: str, redis: Redis) -> None:
    prefix = unique_prefix()
    seen: list[str] = []
    async with contextlib.AsyncExitStack() as stack:
        apps = [
            await stack.enter_async_context(schedule_app(redis_url, prefix, seen)) for _ in range(3)
        ]
        workers = [Worker(a, concurrency=5) for a in apps]
        for w in workers:
            await stack.enter_async_context(w)
        await wait_until(lambda: len(set(seen)) >= 12, timeout=60, what="a dozen ticks")
        for w in workers:
            w.stop()
    counts = Counter(seen)
    assert max(counts.values()) == 1, [i for i, n in counts.items() if n > 1]
    fired = sum(w.scheduler.fired for w in workers if w.scheduler is not None)
    # (on a cluster: every primary)
    found = redis.scan_iter(match=f"{prefix}:*:job:cron:*", count=1000)
    stored = {text(k).rsplit("job:", 1)[1] async for k in found}
    assert fired == len(stored)  # one job per successful fire: no tick fired twice
    assert set(counts) <= stored
    ticks = sorted(int(i.rsplit(":", 1)[1]) for i in counts)
    assert all(t % 200 == 0 for t in ticks)
    # no tick skipped between the first and the last (all were reached within grace)
    assert ticks == list(range(ticks[0], ticks[-1] + 200, 200))


async def test_a_worker_stores_declared_schedules_and_a_restart_keeps_the_tick(
    redis_url: str, redis: Redis
) -> None:
    prefix = unique_prefix()
    async with open_app(redis_url, prefix=prefix) as app:

        @app.cron("0 3 * * *", tz="Europe/Berlin")
        @app.task
        async def nightly() -> None:
            pass

        async with Worker(app, burst=False) as worker:
            await wait_until(lambda: _stored(app), timeout=30, what="the declared schedule stored")
        assert worker.scheduler is not None
        (info,) = await app.schedules.list()
        assert (info.name, info.cron, info.declared) == ("nightly", "0 3 * * *", True)
        await redis.zadd(app.queue()._keys.cron_next, {"nightly": 42})  # as if mid-flight
        await Scheduler(app, [app.default_queue]).sync()
        assert await redis.zscore(app.queue()._keys.cron_next, "nightly") == 42
    async with open_app(redis_url, prefix=prefix) as changed:

        @changed.cron("0 4 * * *", tz="Europe/Berlin", name="nightly")
        @changed.task
        async def nightly2() -> None:
            pass

        await Scheduler(changed, [changed.default_queue]).sync()
        (info,) = await changed.schedules.list()
        assert info.cron == "0 4 * * *"
        assert await redis.zscore(changed.queue()._keys.cron_next, "nightly") != 42


async def _stored(app: App) -> bool:
    return bool(await app.schedules.list())


async def test_a_worker_without_a_scheduler_fires_nothing(app: App, redis: Redis) -> None:
    @app.task
    async def beat() -> None:
        pass

    app.schedule(beat, every=0.05)
    async with Worker(app, scheduler=False) as worker:
        await asyncio.sleep(0)
        assert worker.scheduler is None
    assert await app.schedules.list() == []


async def test_wrong_typed_schedule_keys_never_stop_a_worker(
    app: App, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    @app.task
    async def work() -> int:
        return 7

    k = app.queue()._keys
    await redis.set(k.cron_next, "garbage")
    await redis.set(k.cron_defs, "garbage")
    with caplog.at_level(logging.ERROR, logger="aioqueue"):
        async with Worker(app) as worker:
            assert await (await work.enqueue()).result(timeout=30) == 7
            await wait_until(lambda: "wrong type was set aside" in caplog.text, what="the log")
            assert worker.scheduler is not None
    assert worker.completed == 1
    # set aside (kept for inspection, listed in garbled with the reason), not left in the way
    assert await redis.type(k.cron_next) in (b"none", b"zset")
    listed = {json.loads(v)["key"] for v in (await redis.hgetall(k.garbled)).values()}
    assert {k.cron_next, k.cron_defs} <= listed


async def test_a_signed_apps_schedule_runs_its_tick_jobs(redis_url: str) -> None:
    # a tick's job is stored by the scheduler, not by Task.enqueue: its payload must be signed
    # for its queue, id and task like any other, or a signed worker dead-letters it
    ran: list[str] = []
    async with open_app(redis_url, signing_key=b"k" * 32) as app:

        @app.task
        async def tick(label: str) -> None:
            ran.append(label)

        await app.schedules.add(tick, every=timedelta(seconds=1), args=["signed"])
        async with Worker(app, concurrency=2) as worker:
            await wait_until(lambda: len(ran) >= 2, timeout=60, what="two signed ticks")
            worker.stop()
        assert set(ran) == {"signed"}
        assert (await app.queue().stats()).get("failed", 0) == 0
