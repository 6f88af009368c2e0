"""Garbage in and around the event stream (I9): a garbled events key, a stream that refuses
new entries, a garbage setting, planted entries. No transition ever stops for it."""

from __future__ import annotations

import asyncio
import json

import pytest
from redis.asyncio import Redis

from aioqueue import App, Backoff, JobEventKind, Worker
from aioqueue._model.keys import QueueKeys

from .support.apps import unique_prefix
from .support.invariants import check_invariants
from .support.waiting import wait_until

K = JobEventKind


def events_app(url: str) -> App:
    app = App(
        url,
        prefix=unique_prefix(),
        lease=2.0,
        max_attempts=2,
        backoff=Backoff(base=0.01, factor=1.0, max=0.01, jitter=0.0),
    )

    @app.task
    async def echo(x: int = 0) -> int:
        return x

    runs: list[int] = []

    @app.task
    async def flaky(i: int) -> int:
        runs.append(i)
        if runs.count(i) == 1:
            raise RuntimeError("the first attempt fails")
        return i

    return app


async def garbled(redis: Redis, keys: QueueKeys) -> dict[str, str]:
    """The queue's quarantine record: ``{original key: reason}``."""
    out = {}
    for value in (await redis.hgetall(keys.garbled)).values():
        rec = json.loads(value)
        out[rec["key"]] = rec["reason"]
    return out


async def run_every_kind(app: App) -> None:
    q = app.queue()
    jobs = [
        await q.enqueue("echo", kwargs={"x": 1}),
        await q.enqueue("echo", kwargs={"x": 2}, priority=3),
        await q.enqueue("echo", kwargs={"x": 3}, group="g"),
        await q.enqueue("echo", kwargs={"x": 4}, delay=0.05),
        await q.enqueue("flaky", kwargs={"i": 5}),
    ]
    async with Worker(app, concurrency=4, idle_block=0.1, grace=0.5):
        assert [await j.result(timeout=15) for j in jobs] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("kind", ["string", "list", "hash", "zset"])
async def test_an_events_key_of_the_wrong_type_is_set_aside_and_nothing_stops(
    redis_url: str, redis: Redis, kind: str
) -> None:
    app = events_app(redis_url)
    async with app:
        q = app.queue()
        k = q._keys
        await q.set_events(1000)
        if kind == "string":
            await redis.set(k.events, "garbage")
        elif kind == "list":
            await redis.rpush(k.events, "garbage")
        elif kind == "hash":
            await redis.hset(k.events, "garbage", "x")
        else:
            await redis.zadd(k.events, {"garbage": 1})
        assert await q.events_page() == []  # read only: the reader never fails on it
        await run_every_kind(app)
        assert k.events in await garbled(redis, k)
        assert await redis.type(k.events) == b"stream"
        kinds = {e.kind for e in await q.events_page(count=1000)}
        assert {K.ENQUEUED, K.STARTED, K.RETRIED, K.COMPLETED} <= kinds
        await check_invariants(redis, k)


async def test_a_stream_that_refuses_new_entries_is_set_aside(redis_url: str, redis: Redis) -> None:
    """A stream whose last id is the last possible one: every XADD * fails on it."""
    app = events_app(redis_url)
    async with app:
        q = app.queue()
        k = q._keys
        await q.set_events(1000)
        top = "18446744073709551615-18446744073709551615"
        await redis.xadd(k.events, {"k": "planted"}, id=top)
        await run_every_kind(app)
        assert "refused XADD" in (await garbled(redis, k))[k.events]
        assert {e.kind for e in await q.events_page()} >= {K.COMPLETED}
        await check_invariants(redis, k)


@pytest.mark.parametrize("cap", ["garbage", "nan", "inf", "-5", "0", "1e999", "", "\xff", "²"])
async def test_a_garbage_cap_means_off_and_the_queue_goes_on(
    redis_url: str, redis: Redis, cap: str
) -> None:
    app = events_app(redis_url)
    async with app:
        q = app.queue()
        await redis.hset(q._keys.qconf, "events", cap)
        assert await q.events_maxlen() is None
        await run_every_kind(app)
        assert await redis.exists(q._keys.events) == 0


@pytest.mark.parametrize("cap", ["99999999999999999999", "12.7", "1e6"])
async def test_a_cap_out_of_range_is_bounded_and_the_queue_goes_on(
    redis_url: str, redis: Redis, cap: str
) -> None:
    app = events_app(redis_url)
    async with app:
        q = app.queue()
        await redis.hset(q._keys.qconf, "events", cap)
        await run_every_kind(app)
        assert await redis.hlen(q._keys.garbled) == 0
        assert await redis.xlen(q._keys.events) > 0


async def test_planted_entries_are_skipped_by_the_readers(redis_url: str, redis: Redis) -> None:
    app = events_app(redis_url)
    async with app:
        q = app.queue()
        k = q._keys
        await q.set_events(1000)
        await redis.xadd(k.events, {"k": "exploded", "j": "x"})
        await redis.xadd(k.events, {"junk": b"\xff\xfe"})
        await redis.xadd(k.events, {"k": "completed", "j": b"\xff", "a": "²", "d": "9" * 30})
        for n, e in (("2", "not json"), ("2", '["a"]'), ("²", "[]"), ("1000", "[]"), ("2", "{}")):
            await redis.xadd(k.events, {"k": "started", "n": n, "e": e})
        await redis.xadd(
            k.events, {"k": "started", "n": "2", "e": '["a",1,"","","","b","","","",""]'}
        )
        job = await q.enqueue("echo")
        page = await q.events_page()
        assert [e.kind for e in page] == [K.ENQUEUED, K.COMPLETED]
        odd = page[1]
        assert (odd.attempt, odd.due, odd.task) == (None, None, None)
        it = app.events(since="0", block=0.5)
        async with asyncio.timeout(20):
            got = [await anext(it), await anext(it)]
        await it.aclose()  # type: ignore[attr-defined]
        assert [e.kind for e in got] == [K.COMPLETED, K.ENQUEUED]
        assert got[1].job_id == job.id


async def test_a_follower_waits_out_a_garbled_key_and_goes_on(redis_url: str, redis: Redis) -> None:
    app = events_app(redis_url)
    async with app:
        q = app.queue()
        k = q._keys
        await q.set_events(1000)
        await redis.set(k.events, "garbage")
        it = app.events(since="0", block=0.5)
        first = asyncio.ensure_future(anext(it))

        async def refused() -> bool:
            # the follower met the wrong type at least once (it keeps trying)
            return not first.done() and await redis.type(k.events) == b"string"

        await wait_until(refused, timeout=10)
        job = await q.enqueue("echo")  # sets the key aside and writes to a fresh stream
        async with asyncio.timeout(20):
            event = await first
        await it.aclose()  # type: ignore[attr-defined]
        assert (event.kind, event.job_id) == (K.ENQUEUED, job.id)
