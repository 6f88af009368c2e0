"""A dependency's result outlives its own retention for as long as its dependents need it
(issue 27, point 1; the soak's finding): when a dependency completes, the script that tells
its dependents keeps its result for each of them (``depres:<dependent>``, one of the
dependent's record's extras), and ``dependency_results()`` / ``wait_for_children`` read
there first. The dependency's own record expires in real time (Redis TTLs do not follow the
virtual clock): a short real ``result_ttl`` and a wait until the record is gone; the sibling
that holds the dependent back waits an hour on the virtual clock.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from aioqueue import App, Job, JobState, current_job
from aioqueue._queue.deps import _kept as deps_kept
from aioqueue.testing import VirtualClock, run_until_empty, unique_prefix

from .support.waiting import wait_until

HOUR = timedelta(hours=1)
OTHER = "ttl_other"


@dataclass(frozen=True, slots=True)
class Total:
    n: int


@pytest.fixture
async def tapp(redis_url: str) -> AsyncIterator[App]:
    async with App(redis_url, prefix=unique_prefix(), testing=True) as app:
        yield app


@dataclass
class Tasks:
    app: App

    def __post_init__(self) -> None:
        app = self.app

        @app.task(result_ttl=0.2)
        async def brief(x: int) -> Total:
            return Total(x * 10)

        @app.task(keep_result=False)
        async def unkept(x: int) -> int:
            return x * 100

        @app.task(name="brief_other", queue=OTHER, result_ttl=0.2)
        async def brief_other(x: int) -> Total:
            return Total(x * 1000)

        @app.task
        async def later(x: int) -> int:
            return x

        @app.task
        async def join() -> dict[str, Any]:
            """What its dependencies gave it, and as which types (by their annotations)."""
            got = await current_job().dependency_results()
            return {"types": {k: type(v).__name__ for k, v in got.items()}, "results": got}

        @app.task(name="join_other", queue=OTHER)
        async def join_other() -> dict[str, Any]:
            return await current_job().dependency_results()

        @app.task
        async def parent(children: list[str]) -> dict[str, Any]:
            got = await current_job().wait_for_children(children)
            return {"types": {k: type(v).__name__ for k, v in got.items()}, "results": got}

        self.brief, self.unkept, self.brief_other = brief, unkept, brief_other
        self.later, self.join, self.parent = later, join, parent
        self.join_other = join_other


async def gone(app: App, job: Job[Any]) -> None:
    """Wait (real time) until the job's record expired or was deleted."""
    key = app.queue(job.queue)._keys.job(job.id)

    async def absent() -> bool:
        return not await app.redis.exists(key)

    await wait_until(absent, timeout=30, what=f"the record of {job.id} to expire")


async def test_a_dependent_reads_a_result_whose_record_expired_before_it_ran(tapp: App) -> None:
    t = Tasks(tapp)
    clock = VirtualClock(tapp)
    a = await t.brief.enqueue(1)
    b = await t.later.options(delay=HOUR).enqueue(2)
    c = await t.join.options(depends_on=[a, b]).enqueue()
    assert (await run_until_empty(tapp, delayed="skip")).completed == 1  # a only
    assert await c.state() is JobState.WAITING
    await gone(tapp, a)  # its own retention, 0.2 s, is over
    await clock.advance(HOUR)
    summary = await run_until_empty(tapp, delayed="skip")
    assert (summary.completed, summary.failed) == (2, 0)
    # read by the dependency's task's return annotation (its name kept with the result)
    assert await c.result(timeout=5) == {
        "types": {a.id: "Total", b.id: "int"},
        "results": {a.id: {"n": 10}, b.id: 2},
    }
    info = await c.info()
    assert info.attempts == 1  # never retried for a missing result
    # the kept copy follows the dependent's record: it expires with it
    kept = tapp.queue()._keys.dep_results(c.id)
    record_ttl = await tapp.redis.pttl(tapp.queue()._keys.job(c.id))
    assert record_ttl > 0
    assert 0 < await tapp.redis.pttl(kept) <= record_ttl


async def test_a_dependency_on_another_queue_is_kept_through_the_outbox(tapp: App) -> None:
    t = Tasks(tapp)
    clock = VirtualClock(tapp, queues=[tapp.default_queue, OTHER])
    a = await t.brief_other.enqueue(3)
    b = await t.later.options(delay=HOUR).enqueue(4)
    c = await t.join.options(depends_on=[a, b]).enqueue()
    queues = [tapp.default_queue, OTHER]
    await run_until_empty(tapp, queues, delayed="skip")
    await wait_until(lambda: _kept(tapp, c, a), timeout=30, what="the result kept for c")
    await gone(tapp, a)
    await clock.advance(HOUR)
    await run_until_empty(tapp, queues, delayed="skip")
    assert await c.result(timeout=5) == {
        "types": {a.id: "Total", b.id: "int"},
        "results": {a.id: {"n": 3000}, b.id: 4},
    }


async def test_a_dependency_completed_before_its_dependent_was_enqueued_is_kept_too(
    tapp: App,
) -> None:
    t = Tasks(tapp)
    clock = VirtualClock(tapp)
    a = await t.brief.enqueue(5)
    await run_until_empty(tapp)
    b = await t.later.options(delay=HOUR).enqueue(6)
    c = await t.join.options(depends_on=[a, b]).enqueue()  # a completed: counted at once
    await gone(tapp, a)
    await clock.advance(HOUR)
    await run_until_empty(tapp, delayed="skip")
    assert await c.result(timeout=5) == {
        "types": {a.id: "Total", b.id: "int"},
        "results": {a.id: {"n": 50}, b.id: 6},
    }


async def test_keep_result_false_on_a_dependency_still_gives_its_dependents_the_result(
    tapp: App,
) -> None:
    """A dependency that keeps no result (``keep_result=False``: its record is deleted when
    it completes) still hands its result to its dependents: they declared they need it."""
    t = Tasks(tapp)
    a = await t.unkept.enqueue(7)
    c = await t.join.options(depends_on=[a]).enqueue()
    await run_until_empty(tapp)
    assert not await tapp.redis.exists(tapp.queue()._keys.job(a.id))
    assert (await c.result(timeout=5))["results"] == {a.id: 700}


async def test_a_parked_parent_reads_a_child_whose_record_expired(tapp: App) -> None:
    t = Tasks(tapp)
    clock = VirtualClock(tapp)
    a = await t.brief.enqueue(8)
    b = await t.later.options(delay=HOUR).enqueue(9)
    p = await t.parent.enqueue([a.id, b.id])
    await run_until_empty(tapp, delayed="skip")  # p parks; a completes
    assert await p.state() is JobState.WAITING
    await gone(tapp, a)
    await clock.advance(HOUR)
    summary = await run_until_empty(tapp, delayed="skip")
    assert summary.failed == 0
    assert await p.result(timeout=5) == {
        "types": {a.id: "Total", b.id: "int"},
        "results": {a.id: {"n": 80}, b.id: 9},
    }


async def test_a_kept_result_that_is_garbage_is_read_from_the_record_instead(
    tapp: App,
) -> None:
    t = Tasks(tapp)
    a = await t.later.enqueue(11)
    b = await t.later.options(delay=HOUR).enqueue(12)
    c = await t.join.options(depends_on=[a, b]).enqueue()
    await run_until_empty(tapp, delayed="skip")
    kept = tapp.queue()._keys.dep_results(c.id)
    member = tapp.queue()._keys.member(a.id)
    assert await tapp.redis.hget(kept, member) is not None
    await tapp.redis.hset(kept, member, b"\xff{garbage")
    await VirtualClock(tapp).advance(HOUR)
    await run_until_empty(tapp, delayed="skip")
    assert (await c.result(timeout=5))["results"] == {a.id: 11, b.id: 12}


async def _kept(app: App, dependent: Job[Any], dep: Job[Any]) -> bool:
    kept = app.queue(dependent.queue)._keys.dep_results(dependent.id)
    member = app.queue(dep.queue)._keys.member(dep.id)
    return bool(await app.redis.hexists(kept, member))


async def test_a_kept_hash_of_the_wrong_type_is_set_aside_and_the_record_read(
    tapp: App,
) -> None:
    """Two dependencies: their results are kept in a hash beside the dependent's record
    (depres); garbage of another type there is set aside and their records read."""
    t = Tasks(tapp)
    a = await t.later.enqueue(13)
    a2 = await t.later.enqueue(14)
    c = await t.join_other.options(depends_on=[a, a2]).enqueue()
    await run_until_empty(tapp, [tapp.default_queue])  # a completes; c, on OTHER, is queued
    await wait_until(lambda: _kept(tapp, c, a), timeout=30, what="the result kept for c")
    kept = tapp.queue(OTHER)._keys.dep_results(c.id)
    await tapp.redis.delete(kept)
    await tapp.redis.set(kept, "garbage")
    await run_until_empty(tapp, [OTHER])
    assert await c.result(timeout=5) == {a.id: 13, a2.id: 14}
    assert not await tapp.redis.exists(kept)  # set aside with its reason
    garbled = await tapp.redis.hgetall(tapp.queue(OTHER)._keys.garbled)
    assert [json.loads(v)["key"] for v in garbled.values()] == [kept]


async def test_a_lone_dependency_keeps_its_result_in_the_record_and_garbage_there_is_not_trusted(
    tapp: App,
) -> None:
    """One dependency (on another queue): its result is kept in the dependent's record (dr),
    no hash beside it; garbage written there is not read as the result (the dependency's
    record is read instead)."""
    t = Tasks(tapp)
    a = await t.later.enqueue(13)
    c = await t.join_other.options(depends_on=[a]).enqueue()
    await run_until_empty(tapp, [tapp.default_queue])  # a completes; c, on OTHER, is queued
    jk = tapp.queue(OTHER)._keys.job(c.id)

    async def released() -> bool:
        return await tapp.redis.hget(jk, "s") == b"queued"

    await wait_until(released, timeout=30, what="c released")
    assert await tapp.redis.hget(jk, "dr") is not None
    assert not await tapp.redis.exists(tapp.queue(OTHER)._keys.dep_results(c.id))
    # read as the results kept for it are (deps.lua 'kept')
    got = await deps_kept(tapp, OTHER, c.id, [(tapp.default_queue, a.id)])
    assert got == {(tapp.default_queue, a.id): await tapp.redis.hget(jk, "dr")}
    await tapp.redis.hset(jk, "dr", "\xffgarbage")
    await run_until_empty(tapp, [OTHER])
    assert await c.result(timeout=5) == {a.id: 13}


async def test_a_parent_run_again_does_not_run_a_child_whose_record_is_gone(tapp: App) -> None:
    """The parent's body runs again from the top when its children are done, and enqueues
    its child by the same id once more: with the child's record gone (``keep_result=False``
    deletes it at completion), that enqueue is a no-op, since the parent keeps the child's
    result; the child ran once."""
    runs_key = f"{tapp.prefix}:child-runs"

    @tapp.task(keep_result=False)
    async def child(x: int) -> int:
        await tapp.redis.incr(runs_key)
        return x * 3

    @tapp.task
    async def parent(x: int) -> int:
        job = current_job()
        kid = await child.options(job_id=f"{job.id}.kid").enqueue(x)
        got = await job.wait_for_children([kid])
        return int(got[kid.id]) + 1

    p = await parent.enqueue(7)
    summary = await run_until_empty(tapp)
    assert summary.failed == 0
    assert await p.result(timeout=5) == 22
    assert int(await tapp.redis.get(runs_key) or 0) == 1
    kid_key = tapp.queue()._keys.job(f"{p.id}.kid")
    assert not await tapp.redis.exists(kid_key)  # not stored again by the parent's second run
