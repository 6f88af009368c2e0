"""Durability mode: after a write that must survive a failover (an enqueue, a completion),
``WAIT`` (or ``WAITAOF``) on the same connection, in the same round trip, until enough
replicas acknowledged it. Off by default; the setting rides on the client's pool, so that
when it is off the scripts' calls pay one attribute read and nothing else."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from .._model.checks import check_int, to_ms
from .._model.exceptions import ConfigurationError, NotReplicated, ServerRefused
from .cluster import is_cluster
from .loader import (
    ScriptCall,
    bounded,
    load_everywhere,
    pipeline_failures,
    wrap_redis_error,
)
from .wire import evalsha_command

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Durability:
    """How many replicas must acknowledge a write, and how long to wait for them."""

    replicas: int
    timeout_ms: int
    aof: bool = False  # WAITAOF: fsynced to the AOF locally and on the replicas

    def command(self) -> tuple[Any, ...]:
        if self.aof:
            return ("WAITAOF", 1, self.replicas, self.timeout_ms)
        return ("WAIT", self.replicas, self.timeout_ms)

    def acknowledged(self, reply: Any) -> int:
        """How many replicas acknowledged, from WAIT's reply or WAITAOF's (local, replicas)."""
        if self.aof:
            local, replicas = reply
            return int(replicas) if int(local) >= 1 else -1
        return int(reply)


def durability_setting(
    replicas: int, timeout: float | timedelta, aof: bool, socket_timeout: float
) -> Durability | None:
    """The App's ``wait_replicas`` / ``wait_timeout`` / ``wait_aof`` checked (None: off).

    Raises:
        ConfigurationError: a negative count, a timeout not shorter than the socket timeout.
    """
    check_int(replicas, 0, "wait_replicas")
    if not isinstance(aof, bool):
        raise ConfigurationError(f"wait_aof must be True or False, not {aof!r}")
    if not replicas and not aof:
        return None
    ms = to_ms(timeout, "wait_timeout")
    if not 0 < ms < socket_timeout * 1000:
        raise ConfigurationError("wait_timeout must be more than 0 and less than socket_timeout")
    return Durability(replicas, ms, aof)


def set_durability(client: aioredis.Redis, durability: Durability | None) -> None:
    """Turn durability mode on (or off, with None) for every call on ``client``'s pool (on
    a cluster client, on the client)."""
    _holder(client).aioqueue_durability = durability


def durability_of(client: aioredis.Redis) -> Durability | None:
    """The client's durability setting (None: off)."""
    return getattr(_holder(client), "aioqueue_durability", None)


def _holder(client: aioredis.Redis) -> Any:
    """Where a client's setting is kept: its pool, or a cluster client itself (no pool)."""
    pool = getattr(client, "connection_pool", None)
    return client if pool is None else pool


async def durable_calls(
    client: aioredis.Redis, durability: Durability, calls: Sequence[ScriptCall], strict: bool
) -> list[Any]:
    """Run script calls, then WAIT, in one pipeline (so on one connection: WAIT counts only
    that connection's writes; on a cluster, the connection to the node of the calls' slot:
    the calls must all be on one slot, as one queue's are). Returns the calls' results.

    Raises:
        NotReplicated: ``strict`` and fewer replicas than asked acknowledged in time
            (otherwise a WARNING is logged: a worker's completion must not lose the jobs
            its claim leased).
    """
    results, reply = await _run_and_wait(client, durability, calls)
    missed = pipeline_failures(results)
    if missed:  # NOSCRIPT: those calls did not run. Load the scripts, then run them again
        # and WAIT again: WAIT covers the replication offset of the connection's last
        # write, which is past the writes of the calls that did run
        # the library (or each script) again; on a cluster, each script on every primary
        await bounded(client, load_everywhere(client))
        again, reply = await _run_and_wait(client, durability, [calls[i] for i in missed])
        if pipeline_failures(again):  # NOSCRIPT again: the server flushed them meanwhile
            raise ServerRefused("the scripts were flushed while they were being loaded")
        for i, r in zip(missed, again, strict=True):
            results[i] = r
    got = durability.acknowledged(reply)
    if got < durability.replicas:
        what = "fsynced by" if durability.aof else "acknowledged by"
        message = (
            f"write {what} {max(got, 0)} of {durability.replicas} replicas within "
            f"{durability.timeout_ms} ms: it is on the primary but may be lost in a failover"
        )
        if strict:
            raise NotReplicated(message, max(got, 0))
        logger.warning("%s", message)
    return results


async def _run_and_wait(
    client: aioredis.Redis, durability: Durability, calls: Sequence[ScriptCall]
) -> tuple[list[Any], Any]:
    """The calls' results (errors as values) and WAIT's reply, from one pipeline."""
    pipe = client.pipeline(transaction=False)
    for script, keys, args in calls:
        pipe.execute_command(*evalsha_command(client, script, keys, args))
    if is_cluster(client):
        # WAIT on the node of the calls' slot (every call of one durable run is one queue's):
        # a cluster pipeline sends one node its commands in order on one connection
        node = cast(RedisCluster, client).get_node_from_key(calls[0][1][0])
        pipe.execute_command(*durability.command(), target_nodes=node)
    else:
        pipe.execute_command(*durability.command())
    results: list[Any] = await bounded(client, pipe.execute(raise_on_error=False))
    reply = results.pop()
    if isinstance(reply, Exception):  # WAIT refused: e.g. an ACL user without it
        raise wrap_redis_error(reply) from reply
    return results, reply
