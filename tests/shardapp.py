"""The App of the sharded-queue worker-process tests: ``hot``, a queue of three shards, and
a task that records which process ran which job (configured like ``tests.workerapp``)."""

from __future__ import annotations

import os

from aioqueue import current_job

from .support.apps import app_from_env

app = app_from_env("aqshard")
hot = app.queue("hot", shards=3)


def ran_key(prefix: str) -> str:
    """HASH: job id -> the pid of the process that last ran it to the end."""
    return f"{prefix}:t:ran"


@app.task(queue="hot")
async def mark(i: int) -> int:
    """Record that this job ran (by whom); returns ``i``."""
    job = current_job()
    await job.app.redis.hset(ran_key(job.app.prefix), job.id, os.getpid())
    return i
