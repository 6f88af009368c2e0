"""Job dependencies and parked parents (issue 27, points 1 and 3): ``depends_on=`` keeps a job
``waiting`` until each dependency completed, on its queue or another (another Cluster slot);
a failed or cancelled dependency follows ``on_dependency_failure``; unknown ids are refused
before anything is stored; ``wait_for_children`` parks a running job without a slot or an
attempt, and it runs again once its children ended.

In-process workers here; real worker processes killed with SIGKILL in test_deps_crash.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from aioqueue import (
    App,
    Batch,
    ConfigurationError,
    JobCancelled,
    JobFailed,
    JobState,
    UnknownDependency,
    Worker,
    current_job,
)
from aioqueue._model.exceptions import ServerRefused
from aioqueue._model.limits import MAX_JOBS_PER_CALL
from aioqueue._queue.deps import deps_run
from aioqueue._queue.depsbox import door

from .support.apps import open_app
from .support.invariants import check_invariants
from .support.server import text
from .support.waiting import wait_until
from .wfapp import OTHER, WfTasks, register

# also on a local Valkey Cluster (tests/conftest.py): there the two queues are two slots
pytestmark = pytest.mark.cluster


@pytest.fixture
async def wapp(redis_url: str, prefix: str) -> AsyncIterator[App]:
    async with open_app(redis_url, prefix=prefix, lease=2.0) as opened:
        yield opened


@pytest.fixture
def tasks(wapp: App) -> WfTasks:
    return register(wapp)


async def log(redis: Redis, t: WfTasks) -> list[str]:
    return [text(v) for v in await redis.lrange(t.keys.log, 0, -1)]


async def runs(redis: Redis, t: WfTasks) -> dict[str, int]:
    return {text(k): int(v) for k, v in (await redis.hgetall(t.keys.runs)).items()}


def both(app: App) -> list[str]:
    return [app.default_queue, OTHER]


async def test_a_dependent_waits_for_every_dependency_then_reads_their_results(
    wapp: App, tasks: WfTasks, redis: Redis
) -> None:
    t = tasks
    gate = f"{{{wapp.prefix}:w}}:gate"
    a = await t.slow.enqueue(1, gate)
    b = await t.step_other.enqueue(2)  # another queue (another slot on a cluster)
    c = await t.join.options(depends_on=[a, b]).enqueue("c")
    assert await c.state() is JobState.WAITING
    page = await wapp.queue().jobs("waiting")
    assert [j.id for j in page.items] == [c.id]
    async with Worker(wapp, queues=both(wapp), concurrency=4):
        await b.result(timeout=30)
        assert await c.state() is JobState.WAITING  # a still holds it
        await redis.set(gate, 1)
        out = await c.result(timeout=30)
    assert out == {"tag": "c", "results": {a.id: 10, b.id: 20}}
    order = await log(redis, t)
    assert order.index(c.id) > order.index(a.id)
    assert order.index(c.id) > order.index(b.id)
    assert (await wapp.queue().jobs("waiting")).items == ()
    assert sorted((await check_invariants(redis, wapp.queue()._keys)).values()) == [
        "completed",
        "completed",
    ]


async def test_a_dependency_that_completed_already_counts_at_once(
    wapp: App, tasks: WfTasks
) -> None:
    t = tasks
    a = await t.step.enqueue(3)
    async with Worker(wapp, concurrency=2):
        assert await a.result(timeout=30) == 30
        c = await t.join.options(depends_on=[a.id]).enqueue("late")
        assert (await c.result(timeout=30))["results"] == {a.id: 30}


async def test_a_first_dependent_kept_in_the_record_and_later_ones_in_a_set_are_each_told(
    wapp: App, tasks: WfTasks, redis: Redis
) -> None:
    """A dependency's lone dependent is kept in its record (dd), no set; the next ones, one
    of them on another queue (another slot on a cluster), move it to the set of dependents.
    Each is told once, with the result."""
    t = tasks
    gate = f"{{{wapp.prefix}:w}}:gate"
    a = await t.slow.enqueue(1, gate)
    keys, other = wapp.queue()._keys, wapp.queue(OTHER)._keys
    c1 = await t.join.options(depends_on=[a]).enqueue("c1")
    assert text(await redis.hget(keys.job(a.id), "dd")) == keys.member(c1.id)
    assert not await redis.exists(keys.dependents(a.id))
    c2 = await t.join.options(depends_on=[a], queue=OTHER).enqueue("c2")
    c3 = await t.join.options(depends_on=[a]).enqueue("c3")
    assert text(await redis.hget(keys.job(a.id), "dd")) == "1"
    members = {text(m) for m in await redis.smembers(keys.dependents(a.id))}
    assert members == {keys.member(c1.id), other.member(c2.id), keys.member(c3.id)}
    async with Worker(wapp, queues=both(wapp), concurrency=4):
        await redis.set(gate, 1)
        for job, tag in ((c1, "c1"), (c2, "c2"), (c3, "c3")):
            assert await job.result(timeout=30) == {"tag": tag, "results": {a.id: 10}}
    assert await runs(redis, t) == {a.id: 1, c1.id: 1, c2.id: 1, c3.id: 1}
    assert not await redis.exists(keys.dependents(a.id))
    await check_invariants(redis, keys)
    await check_invariants(redis, other)


async def test_a_lone_dependency_is_kept_in_the_record_and_its_result_too(
    wapp: App, tasks: WfTasks, redis: Redis
) -> None:
    """A job with one dependency (a step of a chain or a fan-out) keeps it in its record
    (d1), no set of dependencies; released, it keeps the result there (dr), no hash beside
    it; ``why`` names the dependency; the result reaches the task."""
    t = tasks
    gate = f"{{{wapp.prefix}:w}}:gate"
    a = await t.slow.enqueue(1, gate)
    keys = wapp.queue()._keys
    c = await t.join.options(depends_on=[a]).enqueue("c")
    assert text(await redis.hget(keys.job(c.id), "d1")) == keys.member(a.id)
    assert await redis.hget(keys.job(c.id), "dl") is None  # d1 is the list
    assert not await redis.exists(keys.deps(c.id))
    why = await c.why()
    assert why.rows[-1].reason.value == "dependencies"
    assert why.rows[-1].waits_for == ((wapp.default_queue, a.id),)
    assert "1 job(s)" in why.sentence()
    async with Worker(wapp, concurrency=2):
        await redis.set(gate, 1)
        assert await c.result(timeout=30) == {"tag": "c", "results": {a.id: 10}}
    assert await redis.hget(keys.job(c.id), "dr") is not None
    assert not await redis.exists(keys.dep_results(c.id))
    assert not await redis.exists(keys.deps(c.id))
    await check_invariants(redis, keys)
    # a results hash beside it (only an earlier job of its id could leave one) is not read
    await redis.hset(keys.dep_results(c.id), keys.member(a.id), "step\x00666")
    d = door(wapp, wapp.default_queue)
    (kept,) = await deps_run(d, "kept", c.id, keys.member(a.id))
    assert kept == await redis.hget(keys.job(c.id), "dr")


async def test_a_lone_dependency_joins_the_set_when_more_are_added(
    wapp: App, tasks: WfTasks, redis: Redis
) -> None:
    """``extend`` (a workflow's node with more dependencies than one call holds) on a job
    waiting for a lone dependency: both go in the set, and the job waits for both."""
    t = tasks
    gate = f"{{{wapp.prefix}:w}}:gate"
    a = await t.step.enqueue(1)
    b = await t.slow.enqueue(2, gate)
    keys = wapp.queue()._keys
    c = await t.join.options(depends_on=[a]).enqueue("c")
    assert (
        await deps_run(door(wapp, wapp.default_queue), "extend", c.id, "", keys.member(b.id)) == 1
    )
    assert await redis.hget(keys.job(c.id), "d1") is None
    members = {text(m) for m in await redis.smembers(keys.deps(c.id))}
    assert members == {keys.member(a.id), keys.member(b.id)}
    dl = json.loads(text(await redis.hget(keys.job(c.id), "dl")))
    assert dl == [keys.member(a.id), keys.member(b.id)]
    async with Worker(wapp, concurrency=2):
        assert await a.result(timeout=30) == 10
        assert await c.state() is JobState.WAITING  # b still holds it
        await redis.set(gate, 1)
        assert await c.result(timeout=30) == {"tag": "c", "results": {a.id: 10, b.id: 20}}
    await check_invariants(redis, keys)


async def test_a_dependent_that_parks_keeps_its_lone_dependency_result(
    wapp: App, tasks: WfTasks, redis: Redis
) -> None:
    """A job released by a lone dependency (its result in the record) that then waits for
    children: the dependency's result joins its children's in the hash kept for it (what it
    waits for is now its children: ``dependency_results`` reads theirs)."""
    t = tasks

    gate = f"{{{wapp.prefix}:w}}:gate"

    @wapp.task
    async def gathers() -> dict[str, Any]:
        job = current_job()
        # (held by the gate: the parent parks every time, rather than finding it done)
        kid = await t.slow.options(job_id=f"{job.id}.kid").enqueue(7, gate)
        kids = await job.wait_for_children([kid])
        return {"deps": await job.dependency_results(), "kids": kids}

    a = await t.step.enqueue(4)
    c = await gathers.options(depends_on=[a]).enqueue()
    keys = wapp.queue()._keys
    async with Worker(wapp, concurrency=2):
        assert await a.result(timeout=30) == 40

        async def parked() -> bool:
            return (
                await c.state() is JobState.WAITING
                and await redis.exists(keys.job(f"{c.id}.kid")) == 1
            )

        await wait_until(parked, timeout=30, what="the parent parked")
        await redis.set(gate, 1)
        out = await c.result(timeout=30)
    assert out == {"deps": {f"{c.id}.kid": 70}, "kids": {f"{c.id}.kid": 70}}
    assert await redis.hmget(keys.job(c.id), ["d1", "dr"]) == [None, None]  # moved at the park
    kept = await redis.hgetall(keys.dep_results(c.id))
    assert set(kept) == {keys.member(a.id).encode(), keys.member(f"{c.id}.kid").encode()}
    await check_invariants(redis, keys)


async def test_unknown_dependencies_are_refused_and_nothing_is_stored(
    wapp: App, tasks: WfTasks, redis: Redis
) -> None:
    t = tasks
    a = await t.step.enqueue(1)
    with pytest.raises(UnknownDependency) as e:
        await t.join.options(depends_on=[a, "no-such-job"], job_id="j1").enqueue("x")
    assert e.value.job_id == "no-such-job"
    with pytest.raises(UnknownDependency):  # on another queue
        await t.join.options(depends_on=[a, wapp.queue(OTHER).job("nope")]).enqueue("x")
    assert not await redis.exists(wapp.queue()._keys.job("j1"))
    states = await check_invariants(redis, wapp.queue()._keys)
    assert states == {a.id: "queued"}
    with pytest.raises(ConfigurationError):
        t.join.options(depends_on=[])
    with pytest.raises(ConfigurationError):
        t.join.options(depends_on=["x"] * 2 + [str(i) for i in range(MAX_JOBS_PER_CALL)])
    with pytest.raises(ConfigurationError):
        t.join.options(depends_on=[a], on_dependency_failure="ignore")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        await t.join.options(depends_on=[a], delay=5).enqueue("x")


def _adds(d: Any, templates: list[list[Any]], steps: list[list[Any]]) -> list[Any]:
    """The arguments of one ``adds`` call: policy, retention, the templates, the steps."""
    out: list[Any] = ["adds", "cancel", 0, len(templates)]
    for t in templates:
        out += t
    for st in steps:
        out += st
    return out


@pytest.mark.parametrize(
    "case",
    [
        "negative-k",
        "fraction-k",
        "text-k",
        "no-template",
        "template-0",
        "templates-over-cap",
        "work-over-cap",
        "count-text",
    ],
)
async def test_a_workflow_store_call_with_garbage_sizes_is_refused_before_any_write(
    wapp: App, tasks: WfTasks, redis: Redis, case: str
) -> None:
    """``deps.lua 'adds'`` (a workflow's steps in one call, sharing templates) refuses
    arguments that do not add up, before it writes anything: a dependency count that is
    negative, not whole or not a number (a negative one walked the arguments backwards),
    a template number it was not given, more templates or more work than one call may
    take."""
    d = door(wapp, wapp.default_queue)
    a = await tasks.step.enqueue(1)
    dep = d.keys.member(a.id)
    tpl = ["step", 3, 0, "", ""]
    good = ["x1", b"[[1],{}]", 1, "", "", 1, dep]
    args = {
        "negative-k": _adds(d, [tpl], [["x1", b"p", 1, "", "", -6, dep]]),
        "fraction-k": _adds(d, [tpl], [["x1", b"p", 1, "", "", 0.5, dep]]),
        "text-k": _adds(d, [tpl], [["x1", b"p", 1, "", "", "one", dep]]),
        "no-template": _adds(d, [tpl], [["x1", b"p", 2, "", "", 1, dep]]),
        "template-0": _adds(d, [tpl], [["x1", b"p", 0, "", "", 1, dep]]),
        "templates-over-cap": _adds(d, [tpl] * (MAX_JOBS_PER_CALL + 1), [good]),
        "work-over-cap": _adds(
            d, [tpl], [[f"x{i}", b"p", 1, "", "", 1, dep] for i in range(MAX_JOBS_PER_CALL)]
        ),
        "count-text": ["adds", "cancel", 0, "many", *tpl, *good],
    }[case]
    with pytest.raises(ServerRefused, match=r"not a count|no template|jobs a call"):
        await deps_run(d, *args)
    assert not await redis.exists(d.keys.job("x1"), d.keys.job("x0"))
    assert await check_invariants(redis, d.keys) == {a.id: "queued"}
    assert await deps_run(d, *_adds(d, [tpl], [good])) == 1  # the same call, sane, stores it


@pytest.mark.parametrize("where", ["same", "other"])
async def test_a_failed_dependency_cancels_its_dependents_down_the_graph(
    wapp: App, tasks: WfTasks, redis: Redis, where: str
) -> None:
    t = tasks
    bad = await t.boom.options(queue=OTHER if where == "other" else None).enqueue(1)
    ok = await t.step.enqueue(2)
    mid = await t.join.options(depends_on=[bad, ok]).enqueue("mid")
    low = await t.join.options(depends_on=[mid]).enqueue("low")
    async with Worker(wapp, queues=both(wapp), concurrency=4):
        with pytest.raises(JobCancelled):
            await low.result(timeout=30)
    for job in (mid, low):
        info = await job.info()
        assert info.state is JobState.CANCELLED
        assert info.error is not None
        assert info.error.type == "DependencyFailed"
    assert mid.id not in await runs(redis, t)
    assert low.id not in await runs(redis, t)


async def test_policy_run_runs_anyway_and_fail_dead_letters(
    wapp: App, tasks: WfTasks, redis: Redis
) -> None:
    t = tasks
    bad = await t.boom.enqueue(1)
    ok = await t.step.enqueue(2)
    anyway = await t.join.options(depends_on=[bad, ok], on_dependency_failure="run").enqueue("r")
    dead = await t.join.options(depends_on=[bad], on_dependency_failure="fail").enqueue("f")
    async with Worker(wapp, concurrency=4):
        assert await anyway.result(timeout=30) == {"tag": "r", "results": {ok.id: 20}}
        with pytest.raises(JobFailed) as e:
            await dead.result(timeout=30)
    assert e.value.error_type == "DependencyFailed"


@pytest.mark.parametrize("dead_ttl", ["default", "forever"])
async def test_a_dependents_policy_and_retention_are_stored_only_when_not_the_default(
    redis_url: str, redis: Redis, dead_ttl: str
) -> None:
    """A waiting dependent's record holds its policy (dp) and the retention of its end (dt)
    only when they differ from what a reader takes for them absent (cancel; the App's
    default dead_ttl, 7 days): its cancelled end is kept as long either way."""
    options: dict[str, Any] = {} if dead_ttl == "default" else {"dead_ttl": None}
    async with open_app(redis_url, lease=2.0, **options) as app:
        t = register(app)
        keys = app.queue()._keys
        bad = await t.boom.enqueue(1)
        c = await t.join.options(depends_on=[bad]).enqueue("c")
        fields = {text(f) for f in await redis.hkeys(keys.job(c.id))}
        assert "dp" not in fields
        assert ("dt" in fields) is (dead_ttl == "forever")
        async with Worker(app, concurrency=2):
            await wait_until(lambda: _cancelled(c), timeout=30, what="the dependent cancelled")
        ttl = await redis.pttl(keys.job(c.id))
        if dead_ttl == "default":
            assert 7 * 86_400_000 - 60_000 < ttl <= 7 * 86_400_000
        else:
            assert ttl == -1


async def _cancelled(job: Any) -> bool:
    return (await job.info()).state is JobState.CANCELLED


async def test_cancelling_a_dependency_cancels_its_dependents(wapp: App, tasks: WfTasks) -> None:
    t = tasks
    a = await t.step.enqueue(1)
    c = await t.join.options(depends_on=[a]).enqueue("c")
    assert await a.cancel()
    assert await c.state() is JobState.CANCELLED
    # and a waiting dependent can itself be cancelled: it leaves the waiting listing
    b = await t.step.enqueue(2)
    d = await t.join.options(depends_on=[b]).enqueue("d")
    assert await d.cancel()
    assert (await wapp.queue().jobs("waiting")).items == ()


@pytest.mark.no_cover  # a test of scale: coverage paused (tests/conftest.py, "Coverage")
async def test_more_dependents_than_one_call_tells_are_all_released(
    wapp: App, tasks: WfTasks, redis: Redis
) -> None:
    """I13: one script call tells at most 1,000 dependents; the rest go on through the
    outbox (continuation entries) and the forwarder."""
    t = tasks
    gate = f"{{{wapp.prefix}:w}}:gate"
    root = await t.slow.enqueue(0, gate)
    n = 2 * MAX_JOBS_PER_CALL + 300
    deps = [await t.step.options(depends_on=[root]).enqueue(i) for i in range(n)]
    assert await redis.scard(wapp.queue()._keys.dependents(root.id)) == n
    await redis.set(gate, 1)
    async with Worker(wapp, concurrency=32):
        await root.result(timeout=30)
        for job in deps:
            await job.result(timeout=120)
    assert len(await log(redis, t)) == n + 1


async def test_a_parent_waits_for_its_children_without_a_slot_and_resumes(
    wapp: App, tasks: WfTasks, redis: Redis
) -> None:
    t = tasks
    p = await t.parent.enqueue(5, -1, "")
    # one slot: the children can only run because the parent gave its slot back
    async with Worker(wapp, concurrency=1):
        assert await p.result(timeout=60) == [0, 10, 20, 30, 40]
    r = await runs(redis, t)
    assert r[p.id] == 2  # parked once, ran again from the top
    assert all(r[f"{p.id}.c{i}"] == 1 for i in range(5))  # children enqueued once each
    info = await p.info()
    assert info.attempts == 1  # the park spent no attempt
    order = await log(redis, t)
    assert order[-1] == p.id
    assert len(order) == 6
    assert json.loads((await redis.hget(t.keys.seen, p.id)) or b"{}") == {
        f"{p.id}.c{i}": i * 10 for i in range(5)
    }


async def test_a_failed_child_cancels_its_parent(wapp: App, tasks: WfTasks, redis: Redis) -> None:
    t = tasks
    p = await t.parent.enqueue(3, 1, "")
    async with Worker(wapp, concurrency=2):
        with pytest.raises(JobCancelled):
            await p.result(timeout=60)
    info = await p.info()
    assert info.error is not None
    assert info.error.type == "DependencyFailed"
    assert p.id not in await log(redis, t)


async def test_a_cancelled_batch_ends_the_dependents_of_its_sub_jobs(
    wapp: App, tasks: WfTasks
) -> None:
    t = tasks
    batch: Batch[Any] = await wapp.batch([t.step.call(1)])
    (member,) = [item async for item in _members(wapp, batch.id)]
    c = await t.join.options(depends_on=[member]).enqueue("c")
    assert await batch.cancel() == 1
    info = await c.info()
    assert info.state is JobState.CANCELLED
    assert info.error is not None
    assert info.error.type == "DependencyFailed"


async def _members(app: App, batch_id: str) -> AsyncIterator[str]:
    for m in await app.queue()._scripts.batch_members(batch_id):
        yield text(m)
