"""Durable steps and waits through real worker processes killed with SIGKILL (issue 27, Proof):
between steps, while the job is parked in a durable sleep or a wait for a signal, and right
after it resumed. Each step body counts its executions in a side channel (``tests.stepapp``):
no step that completed runs again, and every job ends."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from aioqueue import App, Job, JobState
from aioqueue._model.keys import QueueKeys

from .stepapp import Keys, register
from .support.invariants import check_invariants
from .support.processes import WorkerProcesses, worker_processes
from .support.server import text
from .support.waiting import wait_until

LEASE = 1.0  # seconds: a dead worker's jobs come back about this long after it died


@pytest.fixture
def workers(tmp_path: Path, redis_url: str, prefix: str) -> Iterator[WorkerProcesses]:
    with worker_processes(
        tmp_path, redis_url, prefix, lease=LEASE, app="tests.stepapp:app"
    ) as procs:
        yield procs


@pytest.fixture
async def producer(redis_url: str, prefix: str) -> AsyncIterator[App]:
    async with App(redis_url, prefix=prefix, lease=LEASE) as app:
        register(app)  # the same tasks as the worker processes run
        yield app


async def _reached(redis: Redis, app: App, job: Job[object], place: str, attempt: int) -> bool:
    at = {text(x) for x in await redis.lrange(Keys(app.prefix).at, 0, -1)}
    return f"{job.id}:{place}:{attempt}" in at


async def _execs(redis: Redis, app: App) -> dict[str, int]:
    raw = await redis.hgetall(Keys(app.prefix).execs)
    return {text(k): int(v) for k, v in raw.items()}


@pytest.mark.parametrize("hold_after", ["reserve", "charge"])
async def test_a_worker_killed_between_steps(
    workers: WorkerProcesses, producer: App, redis: Redis, hold_after: str
) -> None:
    w1 = workers.start(concurrency=2, grace=1.0)
    job = await producer.tasks["order"].enqueue("o-7", hold_after)

    async def held() -> bool:
        return await _reached(redis, producer, job, hold_after, 1)

    await wait_until(held, timeout=30, what=f"the first run past step {hold_after}")
    workers.kill(w1)
    workers.start(concurrency=2, grace=1.0)
    assert await job.result(timeout=60) == "reserve:o-7 charge:o-7 notify:o-7"
    execs = await _execs(redis, producer)
    assert execs == {f"{job.id}:{s}": 1 for s in ("reserve", "charge", "notify")}
    assert (await job.info()).attempts == 2  # the killed run counted, as any lost run does
    states = await check_invariants(redis, QueueKeys(producer.prefix, "default"))
    assert states[job.id] == "completed"


async def test_a_worker_killed_while_its_job_sleeps_and_after_it_resumed(
    workers: WorkerProcesses, producer: App, redis: Redis
) -> None:
    w1 = workers.start(concurrency=2, grace=1.0)
    job = await producer.tasks["napper"].enqueue(1.5, True)

    async def parked() -> bool:
        return await job.state() is JobState.SCHEDULED and await _reached(
            redis, producer, job, "parking", 1
        )

    await wait_until(parked, timeout=30, what="the job parked")
    workers.kill(w1)  # it holds nothing: the parked job waits in the delayed set
    assert await job.state() is JobState.SCHEDULED
    w2 = workers.start(concurrency=2, grace=1.0)

    async def resumed() -> bool:
        at = {text(x) for x in await redis.lrange(Keys(producer.prefix).at, 0, -1)}
        return any(a.startswith(f"{job.id}:resumed:") for a in at)

    await wait_until(resumed, timeout=60, what="the job resumed after its sleep")
    await wait_until(
        lambda: _held_once(redis, producer, job.id), timeout=30, what="the resumed run holding"
    )
    workers.kill(w2)  # killed after the resume, before the second step
    workers.start(concurrency=2, grace=1.0)
    assert await job.result(timeout=60) == "ba"
    execs = await _execs(redis, producer)
    assert execs[f"{job.id}:before"] == 1
    assert execs[f"{job.id}:after"] == 1


async def _held_once(redis: Redis, app: App, job_id: str) -> bool:
    return await redis.hget(Keys(app.prefix).execs, f"{job_id}:held") is not None


async def test_a_job_waiting_for_a_signal_survives_worker_restarts(
    workers: WorkerProcesses, producer: App, redis: Redis
) -> None:
    w1 = workers.start(concurrency=2, grace=1.0)
    job = await producer.tasks["waiter"].enqueue("paid:o-9", 600)

    async def parked() -> bool:
        return await job.state() is JobState.SCHEDULED and await _reached(
            redis, producer, job, "waiting", 1
        )

    await wait_until(parked, timeout=30, what="the waiter parked")
    workers.kill(w1)
    workers.start(concurrency=2, grace=1.0)
    assert await producer.signal("paid:o-9", {"amount": 12}) == 1
    assert await job.result(timeout=60) == {"amount": 12}
    assert (await _execs(redis, producer))[f"{job.id}:before"] == 1
