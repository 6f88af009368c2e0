"""Helpers shared by the test suite."""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Awaitable, Callable

from aioqueue import App, Backoff


async def wait_until(
    predicate: Callable[[], Awaitable[bool] | bool],
    timeout: float = 10.0,
    interval: float = 0.01,
    what: str = "condition",
) -> None:
    """Wait until ``predicate()`` is true, checking every ``interval`` seconds.

    Use this instead of sleeping then asserting: it returns as soon as the condition holds and
    fails with a clear message when it never does.

    Args:
        predicate: a function, sync or async, returning whether the condition holds.
        timeout: seconds to wait before giving up.
        interval: seconds between checks.
        what: a description of the condition for the failure message.

    Raises:
        AssertionError: the condition did not hold within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)


def app_from_env(default_prefix: str) -> App:
    """The App of a test app that worker processes run (``tests.workerapp``,
    ``tests.batchapp``), configured by the environment ``WorkerProcesses`` sets:
    ``AIOQUEUE_TEST_PREFIX`` (key prefix), ``AIOQUEUE_TEST_LEASE`` (seconds, default 30) and
    ``AIOQUEUE_TEST_NAME`` (client name of its connections, to find them in ``CLIENT LIST``).
    Up to 10 attempts, and failures caused by the tests' own faults retry quickly."""
    name = os.environ.get("AIOQUEUE_TEST_NAME")
    return App(
        prefix=os.environ.get("AIOQUEUE_TEST_PREFIX", default_prefix),
        lease=float(os.environ.get("AIOQUEUE_TEST_LEASE", "30")),
        max_attempts=10,
        backoff=Backoff(base=0.05, factor=2.0, max=0.5, jitter=0.0),
        redis_options={"client_name": name} if name else None,
    )
