"""The suite's own fixtures and helpers work as the other tests assume."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from aioqueue import App
from aioqueue._store.embedded import EmbeddedServer

from .support.waiting import wait_until


async def test_redis_fixture_reaches_the_shared_server(redis: Redis, redis_url: str) -> None:
    assert await redis.ping()
    assert redis_url.startswith(("redis://", "rediss://", "unix://"))


async def test_app_fixture_is_open_with_a_unique_prefix(app: App) -> None:
    assert isinstance(app, App)
    assert app.prefix.startswith("t")
    assert await app.redis.ping()


def test_fresh_server_is_private_and_persistent(
    fresh_server: EmbeddedServer, valkey_server: EmbeddedServer | None
) -> None:
    assert fresh_server.running
    assert valkey_server is None or fresh_server.url != valkey_server.url


async def test_wait_until_returns_once_true() -> None:
    calls = 0

    async def third_time() -> bool:
        nonlocal calls
        calls += 1
        return calls >= 3

    await wait_until(third_time, what="third call")
    assert calls == 3
    await wait_until(lambda: True)


async def test_wait_until_names_what_it_waited_for() -> None:
    with pytest.raises(AssertionError, match="the moon"):
        await wait_until(lambda: False, timeout=0.05, what="the moon")
