"""The one door to Redis (aioqueue/_store/scripts.py): named outcomes for every per-job return
code, typed failure modes, and every call bounded by the socket timeout."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

import aioqueue
from aioqueue import App
from aioqueue._store.outcomes import _COMPLETE, _EXTEND, _FAIL, _RELEASE, FailMode, Outcome

from .support.apps import open_app
from .support.invariants import check_invariants
from .support.proxy import ReplyDropProxy
from .test_scripts import HEADER, read_lua


@pytest.mark.parametrize(
    ("script", "table"),
    [("complete", _COMPLETE), ("fail", _FAIL), ("extend", _EXTEND), ("release", _RELEASE)],
)
def test_each_outcome_table_names_exactly_the_codes_its_script_documents(
    script: str, table: dict[int, Outcome]
) -> None:
    header = HEADER.match(read_lua(script))
    assert header is not None
    returns = header["body"].split("Returns", 1)[1]
    documented = {int(c) for c in re.findall(r"(?<![\w\[])(-?\d) (?=[a-z])", returns)}
    assert documented == set(table), f"{script}.lua documents {documented}"


async def test_fail_modes_retry_dead_letter_or_record_a_cancellation(
    app: App, redis: Redis
) -> None:
    q = app.queue()
    jobs = [await q.enqueue("t", [i]) for i in range(3)]
    reserved = {r.args[0]: r for r in await q.reserve(3)}
    scripts, err, ttl = q._scripts, app.codec.dump_error("no"), app.dead_ttl_ms
    r = reserved[0]
    assert await scripts.fail(r.id, r.token, err, FailMode.RETRY, ttl, 50) is Outcome.RETRY
    r = reserved[1]
    assert await scripts.fail(r.id, r.token, err, FailMode.DEAD, ttl) is Outcome.DEAD
    r = reserved[2]
    assert await scripts.fail(r.id, r.token, err, FailMode.CANCELLED, ttl) is Outcome.CANCELLED
    # a resent failure reports what this lease did; another lease's token is stale
    assert await scripts.fail(r.id, r.token, err, FailMode.DEAD, ttl) is Outcome.CANCELLED
    assert await scripts.fail(r.id, "1", err, FailMode.DEAD, ttl) is Outcome.STALE
    assert await scripts.fail("nope", "1", err, FailMode.DEAD, ttl) is Outcome.NO_JOB
    states = await check_invariants(redis, q._keys)
    assert [states[j.id] for j in jobs] == ["scheduled", "failed", "cancelled"]


async def test_every_read_fails_cleanly_when_the_server_stops_answering(redis_url: str) -> None:
    """Behind a network that silently stops replying, no call hangs: each one raises
    aioqueue's ConnectionError once the socket timeout has passed."""
    async with ReplyDropProxy(redis_url) as proxy, open_app(proxy.url, socket_timeout=1) as app:
        q = app.queue()
        job = await q.enqueue("t")
        batch: aioqueue.Batch[None] = await app.batch()
        proxy.mute()
        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "Job.state": job.state,
            "Job.info": job.info,
            "Queue.stats": q.stats,
            "Queue.counts": q.counts,
            "Queue.group_counts": q.group_counts,
            "Batch.info": batch.info,
            "Batch.results": batch.results,
            "Queue.reserve": q.reserve,
        }

        async def fails_in_time(what: str, call: Callable[[], Awaitable[Any]]) -> None:
            start = time.monotonic()
            with pytest.raises(aioqueue.ServerUnavailable):
                await call()
            assert time.monotonic() - start < 3, f"{what} outlived the socket timeout"

        # side by side (each on a connection of its own, each timed on its own): one socket
        # timeout in all rather than one per call
        await asyncio.gather(*(fails_in_time(what, call) for what, call in calls.items()))
