"""The server's view of things: its clock, its clients, its replies.

- ``server_ms``: the server's clock, the one clock leases and due times are judged by (I6);
- ``clients_named`` / ``blocked_in``: find an App's connections (``client_name``) in
  ``CLIENT LIST``, to see that a consumer is blocked on the server rather than polling;
- ``RoundTrips``: count the commands (or pipelines) an App writes to its server;
- ``text``: a reply of the tests' raw clients (bytes) as a str;
- ``retrying``: redis-py options for the tests' own raw clients in fault tests.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis.exceptions as rexc
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff


def text(value: object) -> str:
    """A reply (bytes, as the fixtures' clients return) as a str (bytes that are not UTF-8,
    such as a garbled job id, with their bytes escaped)."""
    return value.decode(errors="backslashreplace") if isinstance(value, bytes) else str(value)


async def server_ms(redis: Redis) -> int:
    """The server's clock in epoch milliseconds, computed the way the scripts compute it."""
    sec, usec = await redis.time()
    return int(sec) * 1000 + int(usec) // 1000


class RoundTrips:
    """Count the writes of every redis-py asyncio connection (a command, or a pipeline, each
    one round trip) while ``with RoundTrips(monkeypatch) as trips:`` runs: ``trips.n``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.n = 0

    def __enter__(self) -> RoundTrips:
        send = AbstractConnection.send_packed_command

        async def counting(conn: AbstractConnection, *args: Any, **kwargs: Any) -> None:
            self.n += 1
            await send(conn, *args, **kwargs)

        self.monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
        return self

    def __exit__(self, *exc: object) -> None:
        self.monkeypatch.undo()


async def clients_named(redis: Redis, name: str) -> list[dict[str, str]]:
    """The server's view (``CLIENT LIST``) of the connections called ``name`` (on a
    cluster client: every node's)."""
    if isinstance(redis, RedisCluster):
        found = await redis.client_list(target_nodes=RedisCluster.ALL_NODES)
        listed = [c for cs in found.values() for c in cs] if isinstance(found, dict) else found
    else:
        listed = await redis.client_list()
    return [c for c in listed if c.get("name") == name]


async def blocked_in(redis: Redis, name: str, command: str = "") -> bool:
    """Whether a connection called ``name`` is blocked on the server in ``command`` (default:
    in an idle wait, a worker's BLMPOP or a pull-API consumer's BLPOP)."""
    commands = (command,) if command else ("blpop", "blmpop")
    return any("b" in c["flags"] and c["cmd"] in commands for c in await clients_named(redis, name))


def retrying() -> dict[str, Any]:
    """redis-py options for the tests' own raw clients in fault tests (Apps retry by
    themselves): retry a command on a fresh connection after the server closed one."""
    return {"retry": Retry(NoBackoff(), 2), "retry_on_error": [rexc.ConnectionError]}
