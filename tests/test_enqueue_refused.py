"""An enqueue the server refuses part-way loses no job (issue 24, point 4 of the audit).

The server refuses an enqueue call in its middle when the App's ACL user may not write one
job's keys (its record, its group's lane). Redis does not roll a script back, so
``enqueue.lua`` checks every key a job will write before it writes anything: a refused call
stores nothing. Then the coalescer's retry of each job alone answers each caller truthfully,
and an ``enqueue_many`` is refused whole. Each test checks that every caller whose call
returned a ``Job`` gets a job that runs (a Worker on an App with full rights drains them),
that every refused caller gets ``ServerRefused``, and that no record sits in no lane.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis

from aioqueue import App, Job, JobState, Worker
from aioqueue._model.checks import new_job_id
from aioqueue._model.exceptions import ServerRefused

from .support.apps import unique_prefix
from .support.invariants import check_invariants

GLOB_SPECIAL = "*?[]\\^-"


def _lit(s: str) -> str:
    """``s`` as a glob pattern matching only itself."""
    return "".join("\\" + c if c in GLOB_SPECIAL else c for c in s)


def every_key_but(denied: str) -> list[str]:
    """ACL key patterns (``~...``) that allow every key except exactly ``denied`` (ACL key
    patterns only allow): for each proper prefix of it, the prefix itself and the prefix
    followed by any other character, then ``denied`` followed by anything."""
    patterns = []
    for i, c in enumerate(denied):
        head = _lit(denied[:i])
        if i:
            patterns.append("~" + head)
        patterns.append(f"~{head}[^{_lit(c)}]*")
    patterns.append(f"~{_lit(denied)}?*")
    return patterns


@contextlib.asynccontextmanager
async def refusing_app(
    redis_url: str, redis: Redis, prefix: str, denied: str = "", *rules: str
) -> AsyncIterator[App]:
    """An open App whose ACL user may run everything (but ``rules``, e.g. ``-xadd``) on
    every key but ``denied``."""
    user, password = f"u{prefix}", "pw-" + prefix
    acl: Any = redis  # redis-py's execute_command is untyped
    keys = every_key_but(denied) if denied else ["~*"]
    await acl.execute_command(
        "ACL", "SETUSER", user, "on", f">{password}", "+@all", *rules, "&*", *keys
    )
    try:
        url = redis_url.replace("redis://", f"redis://{user}:{password}@", 1)
        async with App(url, prefix=prefix) as app:
            yield app
    finally:
        await acl.execute_command("ACL", "DELUSER", user)


async def work(n: int = 0) -> int:
    return n


async def drained(redis_url: str, prefix: str, queue: str, jobs: list[Job[Any]]) -> None:
    """A Worker of an App with full rights runs every job in ``jobs`` (each must complete)."""
    app = App(redis_url, prefix=prefix)
    ran: list[str] = []

    @app.task(name="t", queue=queue)
    async def t(n: int = 0) -> int:
        ran.append(str(n))
        return n

    async with app, Worker(app, queues=[queue], concurrency=4):
        q = app.queue(queue)
        for job in jobs:
            await q.job(job.id).result(timeout=30)
            assert (await q.job(job.id).info()).state is JobState.COMPLETED


async def test_a_coalesced_call_refused_at_a_group_lane_in_its_middle_loses_no_job(
    redis_url: str, redis: Redis
) -> None:
    """20 concurrent enqueues share one call with, in its middle, a job of group ``bad``
    whose lane this user may not write (its record it may): before, the jobs ahead of it in
    the call had records in no lane and ``bad``'s record stayed in none."""
    prefix = unique_prefix()
    queue = "co"
    lane = f"{prefix}:{{{queue}}}:g:bad"
    async with refusing_app(redis_url, redis, prefix, lane) as app:
        q = app.queue(queue)
        await q.enqueue("t", job_id="first")  # goes alone; the others wait and go together
        ids = [f"j{i}" for i in range(10)] + ["zbad"] + [f"k{i}" for i in range(10)]

        async def one(job_id: str) -> Any:
            group = "bad" if job_id == "zbad" else ("ok" if job_id.startswith("k") else None)
            return await q.enqueue("t", job_id=job_id, group=group)

        first = asyncio.create_task(q.enqueue("t", job_id="second"))
        calls = {i: asyncio.create_task(one(i)) for i in ids}
        with anyio.fail_after(30):
            await asyncio.wait([first, *calls.values()])
        results: dict[str, Any] = {i: t.exception() or t.result() for i, t in calls.items()}
    bad = results.pop("zbad")
    assert isinstance(bad, ServerRefused), bad
    assert "permission" in str(bad).lower()
    assert all(isinstance(j, Job) and j.id == name for name, j in results.items()), results
    assert await redis.exists(q._keys.job("zbad")) == 0
    states = await check_invariants(redis, q._keys)  # every record in its lane
    assert sorted(states) == sorted([*results, "first", "second"])
    assert set(states.values()) == {"queued"}
    await drained(redis_url, prefix, queue, [*results.values(), first.result()])
    assert set((await check_invariants(redis, q._keys)).values()) == {"completed"}


async def test_an_enqueue_many_refused_at_a_record_in_its_middle_stores_nothing(
    redis_url: str, redis: Redis
) -> None:
    """``enqueue_many`` of 11 jobs whose 6th record this user may not write: before, the
    five ahead of it had records in no lane (the call failed, nothing ran them); now the
    call is refused whole, nothing is stored, and the same calls succeed once allowed."""
    prefix = unique_prefix()
    queue = "many"
    probe = new_job_id()  # the ids of this process count up: the next 11 are known
    head, n = probe[:11], int(probe[11:], 16)
    middle = f"{head}{n + 6:x}"
    async with refusing_app(redis_url, redis, prefix, f"{prefix}:{{{queue}}}:job:{middle}") as app:

        @app.task(name="t", queue=queue)
        async def t(n: int = 0) -> int:
            return n

        with pytest.raises(ServerRefused, match=r"(?i)permission"):
            await t.enqueue_many([{"n": i} for i in range(11)])
        keys = app.queue(queue)._keys
        assert await check_invariants(redis, keys) == {}  # nothing stored, nothing lost
        stored = await t.enqueue_many([{"n": i} for i in range(11)])  # other ids: allowed
        assert middle not in {j.id for j in stored}
    assert set((await check_invariants(redis, keys)).values()) == {"queued"}
    await drained(redis_url, prefix, queue, stored)


async def test_a_lone_enqueue_refused_at_its_lane_leaves_no_record(
    redis_url: str, redis: Redis
) -> None:
    """One job whose group lane is refused: before, its record was written, then the lane
    refused, and the record stayed in no lane (every retry refused again)."""
    prefix = unique_prefix()
    lane = f"{prefix}:{{lone}}:g:bad"
    async with refusing_app(redis_url, redis, prefix, lane) as app:
        q = app.queue("lone")
        for _ in range(2):  # a retry is refused the same way
            with pytest.raises(ServerRefused, match=r"(?i)permission"):
                await q.enqueue("t", job_id="x", group="bad")
        assert await redis.exists(q._keys.job("x")) == 0
        assert await check_invariants(redis, q._keys) == {}


async def test_an_enqueue_without_xadd_on_a_queue_with_events_stores_nothing(
    redis_url: str, redis: Redis
) -> None:
    """Events on, and a user without ``XADD``: before, the jobs were written and the call
    failed at its event (so the caller of ``enqueue_many`` was told nothing was stored while
    the jobs ran); now the call is refused before any write, and the same jobs enqueued by a
    user with ``XADD`` run."""
    prefix = unique_prefix()
    queue = "ev"
    async with App(redis_url, prefix=prefix) as full:
        await full.queue(queue).set_events(100)
    async with refusing_app(redis_url, redis, prefix, "", "-xadd") as app:
        t = app.task(name="t", queue=queue)(work)
        with pytest.raises(ServerRefused, match=r"(?i)permission"):
            await t.enqueue_many([{"n": i} for i in range(5)])
        with pytest.raises(ServerRefused, match=r"(?i)permission"):
            await app.queue(queue).enqueue("t", job_id="one")
        keys = app.queue(queue)._keys
        assert await check_invariants(redis, keys) == {}
    async with App(redis_url, prefix=prefix) as full:
        stored = await full.task(name="t", queue=queue)(work).enqueue_many(
            [{"n": i} for i in range(5)]
        )
    await drained(redis_url, prefix, queue, stored)
