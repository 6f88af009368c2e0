"""Garbage in the schedule keys is contained (I9, issue 24 point 4): it costs at most its own
entry, set aside with its reason (listed in the queue's ``garbled`` hash), and every other
schedule of the queue goes on firing. Each case runs a real worker and waits on a good
schedule's jobs to run."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from aioqueue import App, Worker
from aioqueue._app.schedules import TICKS_PER_PASS
from aioqueue._model.keys import QueueKeys

from .support.apps import open_app
from .support.waiting import wait_until

EVERY = timedelta(milliseconds=200)


@pytest.fixture
async def beat_app(redis_url: str) -> AsyncIterator[tuple[App, list[Any]]]:
    ran: list[Any] = []
    async with open_app(redis_url) as app:

        @app.task(name="beat")
        async def beat(label: str) -> None:
            ran.append(label)

        yield app, ran


async def _garbled(redis: Redis, keys: QueueKeys) -> list[dict[str, Any]]:
    return [json.loads(v) for v in (await redis.hgetall(keys.garbled)).values()]


async def _runs(app: App, ran: list[Any], label: str, n: int) -> None:
    async def enough() -> bool:
        return ran.count(label) >= n

    async with Worker(app, concurrency=4):
        await wait_until(enough, timeout=90, what=f"{n} runs of {label!r}")


@pytest.mark.cluster  # also on a local cluster: the aside keys share the queue's slot
@pytest.mark.parametrize("kind", ["defs a string", "next a hash"])
async def test_a_schedule_key_of_the_wrong_type_is_set_aside(
    beat_app: tuple[App, list[Any]], redis: Redis, kind: str
) -> None:
    app, ran = beat_app
    app.schedule("beat", every=EVERY, args=["good"], name="good")
    k = app.queue()._keys
    if kind == "defs a string":
        await redis.set(k.cron_defs, "junk")
    else:
        await redis.hset(k.cron_next, "junk", "1")
    await _runs(app, ran, "good", 3)
    bad = k.cron_defs if kind == "defs a string" else k.cron_next
    [rec] = [g for g in await _garbled(redis, k) if g["key"] == bad]
    assert "wrong type" in rec["reason"]
    assert set(ran) == {"good"}


@pytest.mark.cluster
async def test_a_tick_of_minus_infinity_costs_only_its_entry(
    beat_app: tuple[App, list[Any]], redis: Redis
) -> None:
    app, ran = beat_app
    await app.schedules.add("beat", every=EVERY, args=["good"], name="good")
    k = app.queue()._keys
    await redis.zadd(k.cron_next, {"junk": float("-inf"), "huge": 2.0**60})
    # a readable definition whose tick is garbage starts afresh
    await app.schedules.add("beat", every=EVERY, args=["fixed"], name="fixed")
    await redis.zadd(k.cron_next, {"fixed": float("inf")})
    await _runs(app, ran, "good", 3)
    await _runs(app, ran, "fixed", 1)
    assert await redis.zscore(k.cron_next, "junk") is None
    assert await redis.zscore(k.cron_next, "huge") is None
    reasons = [g["reason"] for g in await _garbled(redis, k) if g["key"] == k.cron_next]
    assert any("not a valid time" in r for r in reasons)
    assert set(ran) == {"good", "fixed"}


async def test_ten_thousand_orphan_ticks_are_cleared_in_bounded_steps(
    beat_app: tuple[App, list[Any]], redis: Redis
) -> None:
    app, ran = beat_app
    await app.schedules.add("beat", every=EVERY, args=["good"], name="good")
    k = app.queue()._keys
    orphans = 10_001
    for start in range(0, orphans, 2000):
        await redis.zadd(
            k.cron_next, {f"orphan{i}": 0 for i in range(start, min(start + 2000, orphans))}
        )
    await _runs(app, ran, "good", 3)
    assert await redis.zcard(k.cron_next) == 1
    records = [g for g in await _garbled(redis, k) if g["key"] == k.cron_next]
    counts = [int(g["reason"].split()[0]) for g in records]
    assert sum(counts) == orphans  # each one listed ...
    assert max(counts) <= TICKS_PER_PASS  # ... by steps of at most one pass's read
    assert len(records) >= orphans // TICKS_PER_PASS


@pytest.mark.parametrize("value", [2**63 - 1, -1, "1e400", 1.5, 0, True, [1], None, "soon"])
async def test_integer_garbage_in_a_definition_costs_only_that_schedule(
    beat_app: tuple[App, list[Any]], redis: Redis, value: Any
) -> None:
    app, ran = beat_app
    await app.schedules.add("beat", every=EVERY, args=["good"], name="good")
    k = app.queue()._keys
    if value is None:  # every_ms missing and no cron: neither given
        bad = {"task": "beat", "args": ["bad"]}
    else:
        bad = {"task": "beat", "every_ms": value, "args": ["bad"]}
    raw = (
        json.dumps(bad)
        if not (isinstance(value, str) and value == "1e400")
        else ('{"task":"beat","every_ms":1e400,"args":["bad"]}')
    )
    await redis.hset(k.cron_defs, "bad", raw)
    await redis.zadd(k.cron_next, {"bad": 0})
    await _runs(app, ran, "good", 3)
    assert set(ran) == {"good"}
    assert await redis.hget(k.cron_defs, "bad") is None
    [rec] = [g for g in await _garbled(redis, k) if "schedule 'bad'" in g["reason"]]
    assert "garbled definition" in rec["reason"]
    assert await redis.get(next(a for a, g in _aside(await redis.hgetall(k.garbled)))) == (
        raw.encode()
    )


def _aside(garbled: dict[Any, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (a.decode(), json.loads(v))
        for a, v in garbled.items()
        if "schedule 'bad'" in json.loads(v)["reason"]
    ]


async def test_values_beyond_the_limits_are_refused_when_added(beat_app: tuple[App, Any]) -> None:
    from aioqueue import ConfigurationError

    app, _ = beat_app
    for every in (2.0**63, 1e300, float("inf"), -1):
        with pytest.raises(ConfigurationError):
            await app.schedules.add("beat", every=every, args=["x"])
    with pytest.raises(ConfigurationError):
        await app.schedules.add("beat", every=1, jitter=2.0**62, args=["x"])
    assert await app.schedules.list() == []
