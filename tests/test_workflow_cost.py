"""What a workflow's edges cost on the server (issue 27's benchmark, benchmarks/workflows.py):
dependencies completed by one script call tell their common dependent together, and a step
stored with its lone dependent (``dd``) is not read or written again when that dependent is
stored. Counted with ``INFO commandstats`` on a private server (no other test's commands)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from aioqueue import App, EmbeddedServer, JobState, Worker
from aioqueue._model.limits import MAX_JOBS_PER_CALL

from .support.server import text
from .wfapp import WfTasks, register


@pytest.fixture
async def private() -> AsyncIterator[tuple[App, Redis]]:
    with EmbeddedServer(appendonly=False) as server:
        client = Redis.from_url(server.url)
        try:
            async with App(server.url, prefix="cost") as app:
                yield app, client
        finally:
            await client.aclose()


async def calls(redis: Redis, *commands: str) -> dict[str, int]:
    stats = await redis.info("commandstats")
    return {c: int(stats.get(f"cmdstat_{c}", {"calls": 0})["calls"]) for c in commands}


async def test_dependencies_completed_in_one_call_tell_their_dependent_together(
    private: tuple[App, Redis],
) -> None:
    """Ten dependencies of one job completed by one call: one SREM on its set and no
    SMISMEMBER, one HSET of their ten results (not ten of each); it is released once all
    are counted, with every result. An ack sent again counts nothing."""
    app, redis = private
    t: WfTasks = register(app)
    q = app.queue()
    keys = q._keys
    deps = [await t.step.enqueue(i) for i in range(1, 12)]
    c = await t.join.options(depends_on=deps).enqueue("c")
    held = {r.id: r for r in await q.reserve(11, lease=60)}
    assert set(held) == {d.id for d in deps}
    acks = [(d.id, held[d.id].token, str(10 * i).encode(), 60_000) for i, d in enumerate(deps, 1)]
    before = await calls(redis, "srem", "smismember", "scard")
    done = await q._scripts.complete(acks[:10])
    after = await calls(redis, "srem", "smismember", "scard")
    assert all(o.value == "ok" for o in done), done
    assert {k: after[k] - before[k] for k in after} == {"srem": 1, "smismember": 0, "scard": 1}
    assert await c.state() is JobState.WAITING
    assert {text(m) for m in await redis.smembers(keys.deps(c.id))} == {keys.member(deps[10].id)}
    assert len(await redis.hgetall(keys.dep_results(c.id))) == 10
    again = await q._scripts.complete(acks[:10])  # a resent ack: counted before
    assert all(o.value == "ok" for o in again), again
    assert await c.state() is JobState.WAITING
    assert (await q._scripts.complete(acks[10:]))[0].value == "ok"
    assert await c.state() is JobState.QUEUED
    async with Worker(app, concurrency=2):
        got = await c.result(timeout=30)
    assert got == {"tag": "c", "results": {d.id: 10 * i for i, d in enumerate(deps, 1)}}


async def test_a_fan_in_is_stored_without_reading_its_steps_again(
    private: tuple[App, Redis],
) -> None:
    """Storing a fan-out / fan-in wider than one call holds (the sink's dependencies past the
    first call go in ``extend`` calls): each middle step is stored with the sink as its lone
    dependent (dd), so storing the sink reads and writes none of them (before: an HMGET and
    an HSET a step, and an HMGET more in ``extend``); a step given its own job id is
    registered as any dependency is (its id may name a job stored before), and the sink
    waits for every step."""
    app, redis = private
    t: WfTasks = register(app)
    keys = app.queue()._keys
    wf = app.workflow("fan")
    root = wf.step("root", t.step.call(0))
    n = MAX_JOBS_PER_CALL + 200
    mids = [wf.step(f"m{i}", t.step.call(i), after=[root]) for i in range(1, n)]
    own = wf.step("own", t.step.options(job_id="own-step").call(n), after=[root])
    sink = wf.step("sink", t.join.call("sink"), after=[*mids, own])
    before = await calls(redis, "hmget")
    handle = await wf.enqueue()
    after = await calls(redis, "hmget")
    graph = (await handle.graph())["steps"]
    sink_member = keys.member(graph[sink]["id"])
    for m in mids[:: n // 50]:
        rec = await redis.hmget(keys.job(graph[m]["id"]), ["dd", "d1", "dl"])
        assert text(rec[0]) == sink_member  # stored with it
        assert text(rec[1]) == keys.member(graph[root]["id"])
        assert rec[2] is None  # a lone dependency: d1 is the list
    assert text(await redis.hget(keys.job("own-step"), "dd")) == sink_member  # registered
    # the root (once a call), the step with its own id, and the opening: not one a step
    assert after["hmget"] - before["hmget"] <= 10
    async with Worker(app, concurrency=32):
        got = await handle.result(timeout=60)
    assert set(got["results"]) == {graph[m]["id"] for m in [*mids, own]}
