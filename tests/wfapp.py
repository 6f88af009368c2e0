"""The tasks of the workflow tests (dependencies, parked parents), for in-process workers and
real worker processes (``python -m aioqueue worker tests.wfapp:app``, configured by the
environment like ``tests.batchapp``).

Every task records what it does under ``{<prefix>:w}:*`` (see ``Keys``): the order in which
job bodies ended (``log``), so a test can check that no dependent ran before its
dependencies, and how many times each body ran (``runs``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aioqueue import App, Task, current_job

from .support.apps import app_from_env

OTHER = "wf_other"  # the queue of ``step_other``


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str

    @property
    def log(self) -> str:
        """LIST: ``<job id>`` of every body that ended, in order (RPUSH)."""
        return f"{{{self.prefix}:w}}:log"

    @property
    def runs(self) -> str:
        """HASH: job id -> how many times its body started (HINCRBY)."""
        return f"{{{self.prefix}:w}}:runs"

    @property
    def seen(self) -> str:
        """HASH: job id -> JSON of what ``dependency_results`` gave it."""
        return f"{{{self.prefix}:w}}:seen"


@dataclass(frozen=True, slots=True)
class WfTasks:
    step: Task[[int], int]
    step_other: Task[[int], int]
    slow: Task[[int, str], int]
    boom: Task[[int], int]
    join: Task[[str], dict[str, Any]]
    parent: Task[[int, int, str], list[int]]
    nap: Task[[int, float], int]
    keys: Keys


def register(app: App) -> WfTasks:
    keys = Keys(app.prefix)

    async def record(value: Any = None) -> None:
        job = current_job()
        pipe = job.app.redis.pipeline(transaction=True)
        pipe.rpush(keys.log, job.id)
        if value is not None:
            pipe.hset(keys.seen, job.id, app.codec.json.dumps(value))
        await pipe.execute()

    async def started() -> None:
        await current_job().app.redis.hincrby(keys.runs, current_job().id, 1)

    @app.task
    async def step(x: int) -> int:
        await started()
        await record()
        return x * 10

    @app.task(name="step_other", queue=OTHER)
    async def step_other(x: int) -> int:
        await started()
        await record()
        return x * 10

    @app.task
    async def slow(x: int, key: str) -> int:
        """Blocks until ``key`` exists (at most 60 s)."""
        await started()
        redis = current_job().app.redis
        async with asyncio.timeout(60):
            while not await redis.exists(key):  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        await record()
        return x * 10

    @app.task(max_attempts=1)
    async def boom(x: int) -> int:
        await started()
        raise ValueError(f"boom {x}")

    @app.task
    async def join(tag: str) -> dict[str, Any]:
        """A dependent: records what its dependencies returned."""
        await started()
        results = await current_job().dependency_results()
        await record(results)
        return {"tag": tag, "results": results}

    @app.task
    async def parent(n: int, fail_at: int, gate: str = "") -> list[int]:
        """Spawns n children (ids derived from its own: enqueueing them again on the run
        after the park is a no-op; ``boom`` at ``fail_at``; with a ``gate``, ``slow`` ones
        held until it exists), waits for them without a slot, returns their results."""
        await started()
        job = current_job()
        children = []
        for i in range(n):
            jid = f"{job.id}.c{i}"
            if i == fail_at:
                child = await boom.options(job_id=jid).enqueue(i)
            elif gate:
                child = await slow.options(job_id=jid).enqueue(i, gate)
            else:
                child = await step.options(job_id=jid).enqueue(i)
            children.append(child)
        results = await job.wait_for_children(children)
        await record(results)
        return sorted(results.values())

    @app.task
    async def nap(x: int, seconds: float) -> int:
        """Takes ``seconds`` (so that a worker killed meanwhile holds it)."""
        await started()
        await asyncio.sleep(seconds)
        await record()
        return x * 10

    return WfTasks(step, step_other, slow, boom, join, parent, nap, keys)


app = app_from_env("aqwf")
tasks = register(app)
