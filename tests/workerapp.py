"""The App that the worker tests run in real worker processes.

    python -m aioqueue worker tests.workerapp:app --url URL ...

Configured by environment variables, read at import:

- ``AIOQUEUE_REDIS_URL``: the server (the CLI's ``--url`` overrides it);
- ``AIOQUEUE_TEST_PREFIX``: the key prefix (each test uses its own);
- ``AIOQUEUE_TEST_LEASE``: the lease in seconds (default 30);
- ``AIOQUEUE_TEST_NAME``: the client name of this worker's connections, so a test can find
  them in ``CLIENT LIST`` (e.g. to see that the worker is blocked, idle, on the server).

Every task records what it does under ``<prefix>:t:*`` (see the ``*_key`` functions), so a test
in another process can count starts and finished bodies per job, and see which process ran
which attempt when, by the server's clock.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

from aioqueue import current_job

from .support.apps import app_from_env

app = app_from_env("aqtest")


def runs_key(prefix: str) -> str:
    """LIST: one JSON record per start of a job body: id, attempt, pid, tag, ms (server)."""
    return f"{{{prefix}:t}}:runs"


def starts_key(prefix: str) -> str:
    """HASH: job id -> how many times its body started."""
    return f"{{{prefix}:t}}:starts"


def done_key(prefix: str) -> str:
    """HASH: job id -> how many times its body ran to the end (its side effect)."""
    return f"{{{prefix}:t}}:done"


async def _started(tag: str) -> None:
    job = current_job()
    redis = job.app.redis
    sec, usec = await redis.time()
    record = {
        "id": job.id,
        "attempt": job.attempt,
        "pid": os.getpid(),
        "tag": tag,
        "ms": int(sec) * 1000 + int(usec) // 1000,
    }
    pipe = redis.pipeline(transaction=True)
    pipe.rpush(runs_key(job.app.prefix), json.dumps(record))
    pipe.hincrby(starts_key(job.app.prefix), job.id, 1)
    await pipe.execute()


async def _finished() -> None:
    job = current_job()
    await job.app.redis.hincrby(done_key(job.app.prefix), job.id, 1)


@app.task
async def record(tag: str = "", duration: float = 0.0) -> int:
    """Record the start, sleep ``duration`` seconds, record the end; returns the pid."""
    await _started(tag)
    if duration > 0:
        await asyncio.sleep(duration)
    await _finished()
    return os.getpid()


@app.task
async def slow(seconds: float, tag: str = "") -> int:
    """A job that runs for ``seconds`` (much longer than the lease in some tests)."""
    await _started(tag)
    await asyncio.sleep(seconds)
    await _finished()
    return os.getpid()


@app.task(max_attempts=3)
async def poison(tag: str = "") -> None:
    """Record the start, then kill the worker process running it."""
    await _started(tag)
    os._exit(1)


@app.task
async def wait_for_key(key: str, tag: str = "", timeout: float = 60.0) -> int:
    """Record the start, then block until ``key`` exists (bounded by ``timeout``)."""
    await _started(tag)
    redis = current_job().app.redis
    async with asyncio.timeout(timeout):
        # the key is set by another process: poll it (nothing to wait on locally)
        while not await redis.exists(key):  # noqa: ASYNC110
            await asyncio.sleep(0.025)
    await _finished()
    return os.getpid()


def _exists(path: str) -> bool:
    return os.path.exists(path)  # one stat of a local file: too quick to need a thread


@app.task
async def wait_for_file(path: str, tag: str = "", timeout: float = 60.0) -> int:
    """Record the start, then block until the file ``path`` exists (bounded by ``timeout``):
    like ``wait_for_key``, with nothing but a sleep to cancel in its loop."""
    await _started(tag)
    async with asyncio.timeout(timeout):
        while not _exists(path):  # noqa: ASYNC110 - created by another process
            await asyncio.sleep(0.01)
    await _finished()
    return os.getpid()


@app.task
async def stubborn(path: str, tag: str = "", timeout: float = 60.0) -> int:
    """Record the start, then wait for the file ``path``, ignoring cancellation."""
    await _started(tag)
    deadline = time.monotonic() + timeout
    while not _exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout} s")
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:  # a misbehaving job: it will not stop
            continue
    await _finished()
    return os.getpid()
