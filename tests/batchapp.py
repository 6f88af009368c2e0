"""The tasks of the batch tests, for in-process workers and real worker processes.

    python -m aioqueue worker tests.batchapp:app --url URL ...

Configured by environment variables, read at import (worker processes only; the same as
``tests.workerapp``'s, set by ``tests.support.processes.WorkerProcesses``):

- ``AIOQUEUE_REDIS_URL``: the server (the CLI's ``--url`` overrides it);
- ``AIOQUEUE_TEST_PREFIX``: the key prefix (each test uses its own);
- ``AIOQUEUE_TEST_LEASE``: the lease in seconds (default 30);
- ``AIOQUEUE_TEST_NAME``: the client name of this worker's connections (``CLIENT LIST``).

In-process tests call ``register(app)`` on their own App to get the same tasks. Every task
records what it does under ``<prefix>:t:*`` (see ``Keys``), so a test in another process can
count executions of sub-jobs and runs of callbacks.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from aioqueue import App, Task, current_job

from .support.apps import app_from_env


@dataclass(frozen=True, slots=True)
class Keys:
    """Where the tasks of one App (by its key prefix) record what they did (one hash tag:
    the callback writes two of them in a transaction, on a cluster too)."""

    prefix: str

    @property
    def runs(self) -> str:
        """LIST: the argument of every finished run of a sub-job body (RPUSH)."""
        return f"{{{self.prefix}:t}}:runs"

    @property
    def started(self) -> str:
        """LIST: the argument of every started run of ``hold`` (RPUSH)."""
        return f"{{{self.prefix}:t}}:started"

    @property
    def running(self) -> str:
        """STRING: sub-jobs of ``tracked`` running right now."""
        return f"{{{self.prefix}:t}}:running"

    @property
    def peaks(self) -> str:
        """LIST: the value of ``running`` seen by each ``tracked`` run as it started."""
        return f"{{{self.prefix}:t}}:peaks"

    @property
    def cb_count(self) -> str:
        """STRING: how many times a callback (``collect``) ran (INCR)."""
        return f"{{{self.prefix}:t}}:cb"

    @property
    def cb_runs(self) -> str:
        """LIST: one JSON summary of ``current_job().batch.results()`` per callback run."""
        return f"{{{self.prefix}:t}}:cb_runs"

    @property
    def chained(self) -> str:
        """LIST: the arguments of every run of the chain's second step (JSON)."""
        return f"{{{self.prefix}:t}}:chained"


@dataclass(frozen=True, slots=True)
class BatchTasks:
    """The tasks ``register`` adds to an App."""

    work: Task[[int], int]
    work_other: Task[[int], int]
    maybe_fail: Task[[int], int]
    hold: Task[[int, str], int]
    tracked: Task[[int, float], int]
    collect: Task[[], dict[str, Any]]
    describe: Task[[int, str], str]
    keys: Keys


def register(app: App, *, other_queue: str = "other") -> BatchTasks:
    """Register the batch tests' tasks on ``app``; ``work_other`` is ``work`` on
    ``other_queue``."""
    keys = Keys(app.prefix)

    @app.task
    async def work(x: int) -> int:
        """A sub-job: records its argument, returns ten times it."""
        await current_job().app.redis.rpush(keys.runs, x)
        return x * 10

    @app.task(name="work_other", queue=other_queue)
    async def work_other(x: int) -> int:
        await current_job().app.redis.rpush(keys.runs, x)
        return x * 10

    @app.task(max_attempts=1)
    async def maybe_fail(x: int) -> int:
        """Fails for good (one attempt) for a negative argument; else like ``work``."""
        if x < 0:
            raise ValueError(f"negative input {x}")
        await current_job().app.redis.rpush(keys.runs, x)
        return x * 10

    @app.task
    async def hold(x: int, key: str) -> int:
        """Records its start, blocks until ``key`` exists (at most 60 s), then like ``work``."""
        redis = current_job().app.redis
        await redis.rpush(keys.started, x)
        async with asyncio.timeout(60):
            while not await redis.exists(key):  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        await redis.rpush(keys.runs, x)
        return x * 10

    @app.task
    async def tracked(x: int, seconds: float) -> int:
        """Counts itself as running for ``seconds`` (so a test sees how many run at once)."""
        redis = current_job().app.redis
        now = await redis.incr(keys.running)
        await redis.rpush(keys.peaks, now)
        try:
            await asyncio.sleep(seconds)
        finally:
            await redis.decr(keys.running)
        await redis.rpush(keys.runs, x)
        return x

    @app.task
    async def collect() -> dict[str, Any]:
        """A batch's callback: counts its runs and records what ``results()`` gave it."""
        job = current_job()
        assert job.batch is not None, "collect runs as a batch's callback"
        items = await job.batch.results()
        summary: dict[str, Any] = {
            "batch": job.batch.id,
            "ok": sum(1 for i in items if i.ok),
            "failed": sum(1 for i in items if not i.ok),
            "values": [i.result for i in items if i.ok],
            "errors": [i.error.type for i in items if i.error is not None],
            "order": [i.job.id for i in items],
        }
        redis = job.app.redis
        pipe = redis.pipeline(transaction=True)
        pipe.incr(keys.cb_count)
        pipe.rpush(keys.cb_runs, json.dumps(summary))
        await pipe.execute()
        return {k: summary[k] for k in ("ok", "failed")}

    @app.task
    async def describe(value: int, suffix: str) -> str:
        """A chain's second step: gets the first step's result as ``value``."""
        await current_job().app.redis.rpush(keys.chained, json.dumps([value, suffix]))
        return f"{value}{suffix}"

    return BatchTasks(work, work_other, maybe_fail, hold, tracked, collect, describe, keys)


app = app_from_env("aqbatch")
tasks = register(app)
