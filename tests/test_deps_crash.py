"""Dependencies and parked parents under worker crashes (issue 27, Proof): real
``python -m aioqueue worker tests.wfapp:app`` processes killed with SIGKILL while a dependency
runs and completes, during a fan-in, and while a parent is parked. No dependent runs before
its dependencies, every graph ends, the fan-in's sink runs once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from aioqueue import App, JobState

from .support.invariants import check_invariants
from .support.processes import WorkerProcesses
from .support.server import text
from .support.waiting import wait_until
from .wfapp import OTHER, WfTasks, register

LEASE = 1.0  # seconds: a killed worker's jobs come back about this long after it died
QUEUES = ("-q", "default", "-q", OTHER)


@pytest.fixture
def workers(tmp_path: Path, redis_url: str, prefix: str) -> Iterator[WorkerProcesses]:
    procs = WorkerProcesses(tmp_path, redis_url, prefix, lease=LEASE, app="tests.wfapp:app")
    try:
        yield procs
    finally:
        procs.close()
        print(procs.logs())  # shown when the test failed


@pytest.fixture
async def producer(redis_url: str, prefix: str) -> AsyncIterator[App]:
    async with App(redis_url, prefix=prefix, lease=LEASE) as app:
        yield app


@pytest.fixture
def tasks(producer: App) -> WfTasks:
    return register(producer)  # the same tasks as the worker processes run


async def log(redis: Redis, t: WfTasks) -> list[str]:
    return [text(v) for v in await redis.lrange(t.keys.log, 0, -1)]


async def runs(redis: Redis, t: WfTasks) -> dict[str, int]:
    return {text(k): int(v) for k, v in (await redis.hgetall(t.keys.runs)).items()}


async def test_killed_while_a_dependency_runs_then_completes(
    workers: WorkerProcesses, producer: App, tasks: WfTasks, redis: Redis
) -> None:
    t = tasks
    gate = f"{{{producer.prefix}:w}}:gate"
    root = await t.slow.enqueue(0, gate)
    mids = [await t.step.options(depends_on=[root]).enqueue(i) for i in range(20)]
    sink = await t.join.options(depends_on=mids).enqueue("sink")
    w1 = workers.start(concurrency=4, grace=1.0, extra=QUEUES)

    async def root_running() -> bool:
        return (await runs(redis, t)).get(root.id) == 1

    await wait_until(root_running, timeout=30, what="the dependency to start")
    workers.kill(w1)
    assert await sink.state() is JobState.WAITING
    await redis.set(gate, 1)
    w2 = workers.start(concurrency=4, grace=1.0, extra=QUEUES)
    result = await sink.result(timeout=60)
    assert sorted(result["results"].values()) == [i * 10 for i in range(20)]
    await workers.wait_idle(redis, w2)
    order = await log(redis, t)
    assert order[0] == root.id  # nothing ran before the dependency
    assert order[-1] == sink.id
    assert order.count(sink.id) == 1
    r = await runs(redis, t)
    assert r[root.id] == 2
    assert r[sink.id] == 1
    states = await check_invariants(redis, producer.queue()._keys)
    assert set(states.values()) == {"completed"}


async def test_a_fan_in_survives_workers_killed_mid_way(
    workers: WorkerProcesses, producer: App, tasks: WfTasks, redis: Redis
) -> None:
    """root -> 300 naps (on two queues) -> one sink; two of three workers killed while the
    naps run and complete."""
    t = tasks
    root = await t.step.enqueue(0)
    mids = []
    for i in range(300):
        task = t.nap.options(queue=OTHER if i % 2 else None, depends_on=[root])
        mids.append(await task.enqueue(i, 0.02))
    sink = await t.join.options(depends_on=mids).enqueue("sink")
    w1 = workers.start(concurrency=8, grace=1.0, extra=QUEUES)
    w2 = workers.start(concurrency=8, grace=1.0, extra=QUEUES)

    async def ran(n: int) -> bool:
        return len(await log(redis, t)) >= n

    await wait_until(lambda: ran(60), timeout=60, what="60 bodies to end")
    workers.kill(w1)
    w3 = workers.start(concurrency=8, grace=1.0, extra=QUEUES)
    await wait_until(lambda: ran(180), timeout=60, what="180 bodies to end")
    workers.kill(w2)
    result = await sink.result(timeout=90)
    assert len(result["results"]) == 300
    await workers.wait_idle(redis, w3)
    order = await log(redis, t)
    first = {job_id: order.index(job_id) for job_id in set(order)}
    assert all(first[m.id] > first[root.id] for m in mids)  # none before its dependency
    assert all(first[sink.id] > first[m.id] for m in mids)
    assert order.count(sink.id) == 1
    assert (await runs(redis, t))[sink.id] == 1
    for name in ("default", OTHER):
        states = await check_invariants(redis, producer.queue(name)._keys)
        assert set(states.values()) == {"completed"}, name


async def test_killed_while_a_parent_is_parked_and_its_child_runs(
    workers: WorkerProcesses, producer: App, tasks: WfTasks, redis: Redis
) -> None:
    t = tasks
    gate = f"{{{producer.prefix}:w}}:gate"
    p = await t.parent.enqueue(4, -1, gate)
    w1 = workers.start(concurrency=8, grace=1.0, extra=QUEUES)

    async def parked() -> bool:
        return await p.state() is JobState.WAITING

    await wait_until(parked, timeout=30, what="the parent to park")
    workers.kill(w1)  # its children are held by the gate; the parent holds no lease
    await redis.set(gate, 1)
    w2 = workers.start(concurrency=8, grace=1.0, extra=QUEUES)
    assert await p.result(timeout=60) == [0, 10, 20, 30]
    await workers.wait_idle(redis, w2)
    r = await runs(redis, t)
    assert r[p.id] == 2  # the park and the run after it: the kill did not add one
    assert (await p.info()).attempts == 1
    assert (await log(redis, t)).count(p.id) == 1
    states = await check_invariants(redis, producer.queue()._keys)
    assert set(states.values()) == {"completed"}
