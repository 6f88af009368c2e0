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
