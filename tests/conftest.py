"""Fixtures for a suite that talks to a real Valkey/Redis server, never a fake.

The server comes from the ``aioqueue.testing`` pytest plugin (registered by the installed
package): one embedded server serves the whole session, or the server named by
``AIOQUEUE_TEST_REDIS_URL``. Each test is isolated by a unique key prefix, so the suite can run
in parallel (``pytest -n auto``). The names below are the suite's own for the plugin's fixtures.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from uuid import uuid4

import pytest
from redis.asyncio import Redis

from aioqueue import App
from aioqueue._embedded import EmbeddedServer

from .support.processes import WorkerProcesses

pytest_plugins = ["pytester"]


@pytest.fixture(scope="session")
def valkey_server(aioqueue_server: EmbeddedServer | None) -> EmbeddedServer | None:
    """The session's embedded server; ``None`` when ``AIOQUEUE_TEST_REDIS_URL`` names an
    external server (the plugin's ``aioqueue_server``)."""
    return aioqueue_server


@pytest.fixture(scope="session")
def redis_url(aioqueue_url: str) -> str:
    """The URL of the server the tests share (the plugin's ``aioqueue_url``)."""
    return aioqueue_url


@pytest.fixture
def app(aioqueue_app: App) -> App:
    """An open ``App`` whose keys live under a prefix unique to this test (the plugin's
    ``aioqueue_app``)."""
    return aioqueue_app


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    """A raw redis-py client (bytes responses) on the shared server, for inspecting keys."""
    client = Redis.from_url(redis_url, socket_timeout=None)  # see App(socket_timeout=)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def fresh_server() -> Iterator[EmbeddedServer]:
    """A private server with an AOF, for tests that kill or restart it."""
    with EmbeddedServer(appendonly=True) as server:
        yield server


# ---------------------------------------------------------------- real worker processes
# (a test file with other needs, e.g. workers on a private server, defines its own)
@pytest.fixture
def prefix() -> str:
    """A key prefix of its own for a test with worker processes."""
    return f"t{uuid4().hex[:12]}"


@pytest.fixture
def workers(tmp_path: Path, redis_url: str, prefix: str) -> Iterator[WorkerProcesses]:
    """Real worker processes of the suite's server on ``prefix`` (their logs printed after)."""
    procs = WorkerProcesses(tmp_path, redis_url, prefix)
    try:
        yield procs
    finally:
        procs.close()
        print(procs.logs())  # shown when the test failed


@pytest.fixture
async def producer(redis_url: str, prefix: str) -> AsyncIterator[App]:
    """An open App on ``prefix``, to enqueue for the worker processes."""
    async with App(redis_url, prefix=prefix) as app:
        yield app
