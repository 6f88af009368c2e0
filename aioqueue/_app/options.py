"""The App's options that depend on each other, checked: the lease and the heartbeat, the
retention of results and dead jobs, the socket timeout, pickle's need of a signing key, the
client it was given."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import redis.asyncio as aioredis

from .._model.checks import lease_ms, to_ms, to_seconds
from .._model.exceptions import ConfigurationError
from .._model.serialize import PickleSerializer, Serializer


def lease_and_heartbeat(
    lease: float | timedelta, heartbeat: float | timedelta | None
) -> tuple[float, float]:
    """Seconds of the lease and between heartbeats (default: 2, or a third of the lease if
    that is shorter; at most half the lease)."""
    seconds = lease_ms(lease, minimum_ms=100) / 1000
    hb = to_seconds(heartbeat, "heartbeat")
    if hb is None:
        hb = min(2.0, seconds / 3)
    elif not 0.05 <= hb <= seconds / 2:
        raise ConfigurationError("heartbeat must be at least 0.05 s and at most half the lease")
    return seconds, hb


def retention_ms(
    result_ttl: float | timedelta | None, dead_ttl: float | timedelta | None
) -> tuple[int, int]:
    """Milliseconds results (-1: forever) and dead-lettered jobs (0: forever) are kept."""
    rt = to_seconds(result_ttl, "result_ttl")
    dt = to_seconds(dead_ttl, "dead_ttl")
    return (
        -1 if rt is None else to_ms(rt, "result_ttl"),
        0 if dt is None else max(to_ms(dt, "dead_ttl"), 1),
    )


def socket_timeout_s(redis_options: Mapping[str, Any], socket_timeout: float | timedelta) -> float:
    """Seconds a reply may take (``redis_options``' own ``socket_timeout`` wins): at least 1."""
    st = to_seconds(redis_options.get("socket_timeout", socket_timeout), "socket_timeout")
    if st is None or st < 1:
        raise ConfigurationError("socket_timeout must be at least 1 s")
    return st


def check_pickle(serializer: Serializer, signed: bool, allow_unsigned: bool) -> None:
    """Refuse pickle without a signing key unless explicitly allowed."""
    if isinstance(serializer, PickleSerializer) and not signed and not allow_unsigned:
        raise ConfigurationError(
            "serializer='pickle' without a signing_key lets anyone who can write to "
            "Redis run code in your workers and producers: give signing_key=..., or "
            "allow_unsigned_pickle=True if only trusted code can reach Redis"
        )


def given_client(
    client: aioredis.Redis | aioredis.RedisCluster | aioredis.ConnectionPool | None,
) -> aioredis.Redis | None:
    """The client an App was given (``App(client=...)``), a client on it if it is a pool (the
    pool stays the user's)."""
    if isinstance(client, aioredis.ConnectionPool):
        client = aioredis.Redis(connection_pool=client)
    return client  # type: ignore[return-value]  # a RedisCluster serves as one
