"""Chains of any length (issue 19 §6): ``a.call(x).then(b).then(c)...`` runs each step once
with the result of the step before; a step that fails for good cancels every step after it;
steps may be on different queues; a worker process killed while it runs a step mid-chain does
not make any step complete twice.

In-process workers, and real ``python -m aioqueue worker tests.batchapp:app`` processes for the
crash. The tasks are those of ``tests.batchapp`` (``work(x)`` returns ``10 * x``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from aioqueue import App, ConfigurationError, JobCancelled, JobState, Worker
from aioqueue._app.task import MAX_CHAIN_STEPS
from aioqueue._store.loader import SCRIPTS

from .batchapp import BatchTasks, register
from .support.apps import open_app
from .support.invariants import check_invariants
from .support.processes import WorkerProcesses
from .support.waiting import wait_until

# also on a local Valkey Cluster (tests/conftest.py)
pytestmark = pytest.mark.cluster

OTHER = "other"  # the queue of ``work_other``
LEASE = 1.0  # seconds: a killed worker's job comes back about this long after it died


@pytest.fixture
async def capp(redis_url: str, prefix: str) -> AsyncIterator[App]:
    async with open_app(redis_url, prefix=prefix, lease=LEASE) as opened:
        # see test_batch.py's test_first_batch_on_a_server_that_does_not_know_the_batch_script
        for script in SCRIPTS.values():
            await opened.redis.script_load(script.source)
        yield opened


@pytest.fixture
def tasks(capp: App) -> BatchTasks:
    return register(capp, other_queue=OTHER)


async def runs(redis: Redis, t: BatchTasks) -> list[int]:
    return [int(x) for x in await redis.lrange(t.keys.runs, 0, -1)]


async def chained(redis: Redis, t: BatchTasks) -> list[list[object]]:
    return [json.loads(v) for v in await redis.lrange(t.keys.chained, 0, -1)]


async def states(redis: Redis, app: App, *queues: str) -> list[str]:
    """The states of every job on these queues (after checking the invariants on each)."""
    out: list[str] = []
    for name in queues or (app.default_queue,):
        out += (await check_invariants(redis, app.queue(name)._keys)).values()
    return sorted(out)


async def test_a_three_step_chain_feeds_each_result_to_the_next_step(
    capp: App, tasks: BatchTasks, redis: Redis
) -> None:
    t = tasks
    job = await t.work.call(2).then(t.work).then(t.describe, "!").enqueue()
    assert await job.state() is JobState.WAITING
    async with Worker(capp, concurrency=4):
        assert await job.result(timeout=30) == "200!"
    assert await runs(redis, t) == [2, 20]
    assert await chained(redis, t) == [[200, "!"]]
    assert await states(redis, capp) == ["completed"] * 3


async def test_a_five_step_chain_runs_its_steps_in_order_once_each(
    capp: App, tasks: BatchTasks, redis: Redis
) -> None:
    t = tasks
    chain = t.work.call(1).then(t.work).then(t.work).then(t.work).then(t.describe, "x")
    assert len(chain.calls) == 5
    job = await chain.enqueue()
    async with Worker(capp, concurrency=8):
        assert await job.result(timeout=30) == "10000x"
    assert await runs(redis, t) == [1, 10, 100, 1000]
    assert await chained(redis, t) == [[10000, "x"]]
    assert await states(redis, capp) == ["completed"] * 5


async def test_a_step_that_fails_mid_chain_cancels_every_step_after_it(
    capp: App, tasks: BatchTasks, redis: Redis
) -> None:
    t = tasks
    # work(-1) = -10, then maybe_fail(-10) fails for good (one attempt)
    chain = t.work.call(-1).then(t.maybe_fail).then(t.work).then(t.describe, "?")
    job = await chain.enqueue()
    async with Worker(capp, concurrency=4):
        with pytest.raises(JobCancelled):
            await job.result(timeout=30)
    assert await job.state() is JobState.CANCELLED
    assert await runs(redis, t) == [-1]  # the step after the failed one never ran
    assert await chained(redis, t) == []
    assert await states(redis, capp) == ["cancelled", "cancelled", "completed", "failed"]
    # each cancelled step says why: the first the failure before it, the next that cancel
    q = capp.queue()
    errors = []
    for job_id, state in (await check_invariants(redis, q._keys)).items():
        if state == "cancelled":
            error = (await q.job_info(job_id)).error
            assert error is not None, "a cancelled step without a reason"
            assert error.type == "Cancelled"
            errors.append(error.message)
    assert any("ValueError: negative input -10" in m for m in errors), errors
    assert any("the step before it failed: Cancelled" in m for m in errors), errors


async def test_cancelling_a_chain_s_pending_steps_stops_it(
    capp: App, tasks: BatchTasks, redis: Redis
) -> None:
    t = tasks
    job = await t.work.call(3).then(t.work).then(t.describe, "-").enqueue()
    ids = await check_invariants(redis, capp.queue()._keys)
    # cancel the first step before any worker runs it: the two after it are cancelled too
    queued = [i for i, state in ids.items() if state == "queued"]
    assert len(queued) == 1
    assert await capp.queue().cancel_jobs(queued) == 1
    assert await job.state() is JobState.CANCELLED
    assert await states(redis, capp) == ["cancelled"] * 3


async def test_a_chain_across_queues(capp: App, tasks: BatchTasks, redis: Redis) -> None:
    t = tasks
    # default -> other -> default -> other -> default
    chain = t.work.call(1).then(t.work_other).then(t.work).then(t.work_other).then(t.describe, ".")
    job = await chain.enqueue()
    async with Worker(capp, queues=[capp.default_queue, OTHER], concurrency=4):
        assert await job.result(timeout=60) == "10000."
    assert await runs(redis, t) == [1, 10, 100, 1000]
    assert await states(redis, capp, capp.default_queue, OTHER) == ["completed"] * 5


async def test_a_failure_on_another_queue_cancels_the_rest_of_the_chain(
    capp: App, tasks: BatchTasks, redis: Redis
) -> None:
    t = tasks
    chain = t.work_other.call(-1).then(t.maybe_fail).then(t.work_other).then(t.describe, "?")
    job = await chain.enqueue()
    async with Worker(capp, queues=[capp.default_queue, OTHER], concurrency=4):
        with pytest.raises(JobCancelled):
            await job.result(timeout=60)
    assert await runs(redis, t) == [-1]
    got = await states(redis, capp, capp.default_queue, OTHER)
    assert got == ["cancelled", "cancelled", "completed", "failed"]


async def test_a_chain_has_a_bounded_length(tasks: BatchTasks) -> None:
    t = tasks
    chain = t.work.call(1)
    longest = chain.then(t.work)
    for _ in range(MAX_CHAIN_STEPS - 2):
        longest = longest.then(t.work)
    assert len(longest.calls) == MAX_CHAIN_STEPS
    with pytest.raises(ConfigurationError, match=f"at most {MAX_CHAIN_STEPS} steps"):
        longest.then(t.work)


# ---------------------------------------------------------------------------- crash mid-chain
@pytest.fixture
def workers(tmp_path: Path, redis_url: str, prefix: str) -> Iterator[WorkerProcesses]:
    procs = WorkerProcesses(tmp_path, redis_url, prefix, lease=LEASE, app="tests.batchapp:app")
    try:
        yield procs
    finally:
        procs.close()
        print(procs.logs())  # shown when the test failed


async def test_a_worker_killed_mid_chain_leaves_each_step_completed_exactly_once(
    workers: WorkerProcesses, capp: App, redis: Redis
) -> None:
    t = register(capp)  # the tasks the worker processes run (work_other on "other")
    release = f"{capp.prefix}:t:release"
    # work(1) = 10, then hold(10) blocks until released (= 100), then work(100), describe
    chain = t.work.call(1).then(t.hold, release).then(t.work).then(t.describe, "!")
    job = await chain.enqueue()
    w1 = workers.start(concurrency=4, grace=1.0)

    async def holding() -> bool:
        return await redis.lrange(t.keys.started, 0, -1) == [b"10"]

    await wait_until(holding, timeout=30, what="the second step running")
    workers.kill(w1)  # SIGKILL while it runs the second step
    assert await job.state() is JobState.WAITING
    await redis.set(release, 1)
    w2 = workers.start(concurrency=4, grace=1.0)  # runs it again once its lease ran out
    assert await job.result(timeout=60) == "1000!"
    await workers.wait_idle(redis, w2)
    assert await redis.lrange(t.keys.started, 0, -1) == [b"10", b"10"]  # run again, once
    assert await runs(redis, t) == [1, 10, 100]  # each step's body finished once
    assert await chained(redis, t) == [[1000, "!"]]
    assert await states(redis, capp) == ["completed"] * 4
    assert (await capp.queue().stats())["completed"] == 4


async def test_an_explicitly_cancelled_chain_step_says_cancelled(
    capp: App, tasks: BatchTasks, redis: Redis
) -> None:
    t = tasks
    await t.work.call(3).then(t.work).enqueue()
    q = capp.queue()
    ids = await check_invariants(redis, q._keys)
    queued = [i for i, state in ids.items() if state == "queued"]
    assert await q.cancel_jobs(queued) == 1
    first = await q.job_info(queued[0])
    assert first.error is not None
    assert first.error.type == "Cancelled"
    (second,) = [i for i in ids if i not in queued]
    after = await q.job_info(second)
    assert after.state is JobState.CANCELLED
    assert after.error is not None
    assert after.error.type == "Cancelled"
    assert "the step before it failed: Cancelled" in after.error.message
