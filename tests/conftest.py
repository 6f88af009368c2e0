"""Fixtures for a suite that talks to a real Valkey/Redis server, never a fake.

One embedded server serves the whole session; each test is isolated by a unique key prefix,
so the suite can run in parallel (``pytest -n auto``). Set ``AIOQUEUE_TEST_REDIS_URL`` to
run it against another server instead.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING
from uuid import uuid4

import pytest
from redis.asyncio import Redis

from aioqueue._embedded import EmbeddedServer

if TYPE_CHECKING:
    from aioqueue import App

REDIS_URL_ENV = "AIOQUEUE_TEST_REDIS_URL"


@pytest.fixture(scope="session")
def valkey_server() -> Iterator[EmbeddedServer | None]:
    """The session's embedded server (no AOF, for speed); ``None`` when
    ``AIOQUEUE_TEST_REDIS_URL`` names an external server."""
    if os.environ.get(REDIS_URL_ENV):
        yield None
        return
    with EmbeddedServer(appendonly=False) as server:
        yield server


@pytest.fixture(scope="session")
def redis_url(valkey_server: EmbeddedServer | None) -> str:
    """The URL of the server the tests share."""
    if valkey_server is None:
        return os.environ[REDIS_URL_ENV]
    return valkey_server.url


@pytest.fixture
async def app(redis_url: str) -> AsyncIterator[App]:
    """An open ``App`` whose keys live under a prefix unique to this test."""
    from aioqueue import App  # imported here so the embedded-server tests need only that module

    async with App(redis_url, prefix=f"t{uuid4().hex[:12]}") as opened:
        yield opened


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
