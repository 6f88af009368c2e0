"""Apps for the tests: on a unique prefix, or configured by the environment of a worker
process running one of the test apps (``tests.workerapp``, ``tests.batchapp``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

from aioqueue import App, Backoff
from aioqueue.testing import unique_prefix as unique_prefix  # re-exported for the tests


@contextlib.asynccontextmanager
async def open_app(url: str, **options: Any) -> AsyncIterator[App]:
    """An open App on ``url`` with a unique prefix unless ``prefix=`` is given."""
    options.setdefault("prefix", unique_prefix())
    async with App(url, **options) as app:
        yield app


def app_from_env(default_prefix: str) -> App:
    """The App of a test app that worker processes run (``tests.workerapp``,
    ``tests.batchapp``), configured by the environment ``WorkerProcesses`` sets:
    ``AIOQUEUE_TEST_PREFIX`` (key prefix), ``AIOQUEUE_TEST_LEASE`` (seconds, default 30) and
    ``AIOQUEUE_TEST_NAME`` (client name of its connections, to find them in ``CLIENT LIST``)
    and ``AIOQUEUE_TEST_HEARTBEAT`` (seconds; default: the App's, from the lease).
    Up to 10 attempts, and failures caused by the tests' own faults retry quickly."""
    name = os.environ.get("AIOQUEUE_TEST_NAME")
    heartbeat = os.environ.get("AIOQUEUE_TEST_HEARTBEAT")
    return App(
        prefix=os.environ.get("AIOQUEUE_TEST_PREFIX", default_prefix),
        lease=float(os.environ.get("AIOQUEUE_TEST_LEASE", "30")),
        heartbeat=float(heartbeat) if heartbeat else None,
        max_attempts=10,
        backoff=Backoff(base=0.05, factor=2.0, max=0.5, jitter=0.0),
        redis_options={"client_name": name} if name else None,
    )


async def drop_keys(redis: Any, prefix: str) -> int:
    """Delete every key of ``prefix`` (a unique prefix: ``*prefix*``); how many.

    The tests of scale call it at their end: the 100,000 jobs one of them leaves on the shared
    server would make every later SCAN there (the invariant checks scan the key space) walk
    them all, for the rest of the run.
    """
    dropped = 0
    batch: list[Any] = []
    async for key in redis.scan_iter(match=f"*{prefix}*", count=5000):
        batch.append(key)
        if len(batch) >= 1000:
            dropped += await _unlink(redis, batch)
            batch = []
    if batch:
        dropped += await _unlink(redis, batch)
    return dropped


async def _unlink(redis: Any, keys: list[Any]) -> int:
    pipe = redis.pipeline(transaction=False)  # one key a command: a Cluster's keys span slots
    for key in keys:
        pipe.execute_command("UNLINK", key)  # (a Cluster pipeline's unlink() is a coroutine)
    return sum(await pipe.execute())
