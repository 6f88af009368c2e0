"""DAG workflows (issue 27, point 2): ``app.workflow(name)`` with steps and edges, refused
before anything is stored when it cannot run, enqueued gated (nothing runs before the whole
graph is stored), with a handle giving its state, its steps' states, the sink's result and
``cancel()``; fan-out / fan-in of 10,000 steps; across queues (two Cluster slots).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from aioqueue import App, JobCancelled, Worker, WorkflowError, WorkflowHandle, WorkflowState
from aioqueue._queue.deps import deps_run
from aioqueue._queue.depsbox import door

from .support.apps import open_app
from .support.clirun import aioqueue_cli
from .support.invariants import check_invariants
from .support.server import text
from .wfapp import OTHER, WfTasks, register

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


async def test_a_diamond_across_queues_runs_in_order_and_gives_the_sink_s_result(
    wapp: App, tasks: WfTasks, redis: Redis, backend: str
) -> None:
    t = tasks
    if backend == "cluster":  # the two queues live on two primaries
        keys = [wapp.queue(q)._keys.stats for q in (wapp.default_queue, OTHER)]
        assert len({redis.get_node_from_key(k).name for k in keys}) == 2  # type: ignore[attr-defined]
    wf = wapp.workflow("diamond")
    a = wf.step("a", t.step.call(1))
    b = wf.step("b", t.step.call(2), after=[a])
    c = wf.step("c", t.step_other.call(3), after=[a])  # another queue (slot)
    wf.step("d", t.join.call("d"), after=[b, c])
    handle = await wf.enqueue()
    async with Worker(wapp, queues=[wapp.default_queue, OTHER], concurrency=4):
        out = await handle.result(timeout=60)
    graph = await handle.graph()
    ids = {n: v["id"] for n, v in graph["steps"].items()}
    assert out == {"tag": "d", "results": {ids["b"]: 20, ids["c"]: 30}}
    assert await handle.state() is WorkflowState.COMPLETED
    assert await handle.nodes() == dict.fromkeys("abcd", "completed")
    order = await log(redis, t)
    assert order.index(ids["a"]) < order.index(ids["b"]) < order.index(ids["d"])
    assert order.index(ids["a"]) < order.index(ids["c"]) < order.index(ids["d"])
    again = WorkflowHandle(wapp, handle.id)
    assert (await again.graph())["name"] == "diamond"


async def test_a_graph_that_cannot_run_is_refused_before_anything_is_stored(
    wapp: App, tasks: WfTasks, redis: Redis
) -> None:
    t = tasks
    wf = wapp.workflow("cycle")
    wf.step("a", t.step.call(1), after=["c"])
    wf.step("b", t.step.call(2), after=["a"])
    wf.step("c", t.step.call(3), after=["b"])
    with pytest.raises(WorkflowError, match="cycle"):
        await wf.enqueue()
    missing = wapp.workflow("missing")
    missing.step("a", t.step.call(1), after=["nope"])
    with pytest.raises(WorkflowError, match="no step"):
        await missing.enqueue()
    with pytest.raises(WorkflowError, match="twice"):
        missing.step("a", t.step.call(1))
    with pytest.raises(WorkflowError):
        await wapp.workflow("empty").enqueue()
    for q in (wapp.default_queue, OTHER):
        assert await check_invariants(redis, wapp.queue(q)._keys) == {}


async def test_a_failed_step_cancels_what_follows_and_the_workflow_fails(
    wapp: App, tasks: WfTasks, redis: Redis
) -> None:
    t = tasks
    wf = wapp.workflow("fails")
    wf.step("a", t.step.call(1))
    wf.step("b", t.boom.call(2), after=["a"])
    wf.step("c", t.join.call("c"), after=["b"])
    wf.step("d", t.join.call("d"), after=["c"])
    handle = await wf.enqueue()
    async with Worker(wapp, concurrency=4):
        with pytest.raises(JobCancelled):
            await handle.result(timeout=60)
    assert await handle.nodes() == {
        "a": "completed",
        "b": "failed",
        "c": "cancelled",
        "d": "cancelled",
    }
    assert await handle.state() is WorkflowState.FAILED


async def test_a_closed_graph_never_runs_and_cancel_removes_it(
    wapp: App, tasks: WfTasks, redis: Redis
) -> None:
    """A producer that died before the last call: its graph stays closed (pending)."""
    t = tasks
    q = door(wapp, wapp.default_queue)
    step = {"q": "default", "id": "half-a", "after": []}
    graph = json.dumps({"name": "half", "steps": {"a": step}, "sinks": ["a"]})
    assert await deps_run(q, "gate", "wf-half", "half", graph) == 1
    rec = t.step.record_of(t.step.call(1), "default", "half-a")
    tpl = rec.template
    values = (tpl.task, rec.payload, tpl.max_attempts, tpl.priority, tpl.group, tpl.options)
    assert await deps_run(q, "add", "half-a", *values, "cancel", 0, q.keys.member("wf-half")) == 1
    handle = WorkflowHandle(wapp, "wf-half")
    async with Worker(wapp, concurrency=2):
        probe = await t.step.enqueue(99)  # the worker runs what is runnable
        assert await probe.result(timeout=30) == 990
        assert await handle.state() is WorkflowState.PENDING
        assert await handle.nodes() == {"a": "waiting"}
        await handle.cancel()
    assert await handle.state() is WorkflowState.CANCELLED
    assert await handle.nodes() == {"a": "cancelled"}
    assert await log(redis, t) == [probe.id]


@pytest.mark.no_cover  # a test of scale: coverage paused (tests/conftest.py, "Coverage")
async def test_a_fan_out_fan_in_of_ten_thousand_steps(
    wapp: App, tasks: WfTasks, redis: Redis, backend: str
) -> None:
    if backend == "cluster":
        pytest.skip(
            "the 10,000-step graph runs on the standalone server (the diamond covers slots)"
        )
    t = tasks
    n = 10_000
    wf = wapp.workflow("wide")
    root = wf.step("root", t.step.call(0))
    leaves = [wf.step(f"l{i}", t.step.call(i), after=[root]) for i in range(n - 2)]
    wf.step("sink", t.step.call(-1), after=leaves)
    started = time.monotonic()
    handle = await wf.enqueue()
    stored = time.monotonic() - started
    async with Worker(wapp, concurrency=64):
        assert await handle.result(timeout=300) == -10
    assert await handle.state() is WorkflowState.COMPLETED
    order = await log(redis, t)
    assert len(order) == n
    assert order[-1] == (await handle.graph())["steps"]["sink"]["id"]
    print(f"stored 10,000 steps in {stored:.2f} s; ran in {time.monotonic() - started:.2f} s")


async def test_the_cli_shows_a_workflow_as_a_tree_with_states(
    wapp: App, tasks: WfTasks, redis_url: str, backend: str
) -> None:
    t = tasks
    wf = wapp.workflow("shown")
    wf.step("a", t.step.call(1))
    wf.step("b", t.step.call(2), after=["a"])
    wf.step("c", t.step.call(3), after=["a", "b"])
    handle = await wf.enqueue()
    async with Worker(wapp, concurrency=2):
        assert await handle.result(timeout=60) == 30
    out = await asyncio.to_thread(aioqueue_cli, redis_url, wapp.prefix, "workflow", handle.id)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"workflow {handle.id}  shown  completed")
    assert [line.split()[0] for line in lines[1:]] == ["a", "b", "c"]
    assert lines[3].startswith("    c  completed")  # under a, its first dependency
    assert "(also after b)" in lines[3]
    js = await asyncio.to_thread(
        aioqueue_cli, redis_url, wapp.prefix, "workflow", handle.id, "--json"
    )
    data = json.loads(js.stdout)
    assert data["state"] == "completed"
    assert {r["step"]: r["depth"] for r in data["rows"]} == {"a": 0, "b": 1, "c": 1}
    missing = await asyncio.to_thread(aioqueue_cli, redis_url, wapp.prefix, "workflow", "wf-x")
    assert missing.returncode != 0
    assert "no workflow" in missing.stderr


async def test_the_dashboard_shows_a_workflow_tree_linked_to_each_job(
    wapp: App, tasks: WfTasks
) -> None:
    httpx = pytest.importorskip("httpx")
    from aioqueue.dashboard import create_app

    t = tasks
    wf = wapp.workflow("<shown>")
    wf.step("a", t.step.call(1))
    wf.step("b", t.step_other.call(2), after=["a"])
    handle = await wf.enqueue()
    async with Worker(wapp, queues=[wapp.default_queue, OTHER], concurrency=2):
        assert await handle.result(timeout=60) == 20
    web = create_app(wapp, auth=None)
    transport = httpx.ASGITransport(app=web)
    async with httpx.AsyncClient(transport=transport, base_url="http://dash.test") as c:
        page = await c.get(f"/queues/default/workflows/{handle.id}")
        missing = await c.get("/queues/default/workflows/wf-none")
    assert page.status_code == 200, page.text
    steps = (await handle.graph())["steps"]
    assert f'/queues/default/jobs/{steps["a"]["id"]}"' in page.text
    assert f'/queues/{OTHER}/jobs/{steps["b"]["id"]}"' in page.text
    assert "&lt;shown&gt;" in page.text  # escaped
    assert page.text.count(">completed<") == 3  # the workflow and its two steps
    assert missing.status_code == 404
