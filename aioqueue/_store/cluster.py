"""Redis/Valkey Cluster: the cluster URL and client, what differs on a cluster client.

A cluster URL names one or more seed nodes: ``redis+cluster://[user:password@]host:port[,host:
port...]`` (``rediss+cluster://`` for TLS; ``valkey+cluster://`` and ``valkeys+cluster://``
too). redis-py's ``RedisCluster`` finds the other nodes, routes each command to the node that
serves its key's slot and follows ``MOVED`` / ``ASK`` redirections. Every script call touches
the keys of one queue, which share one hash tag (``{queue}``), so each is one slot on one node.

What differs on a cluster client, and is decided here:

- scripts are loaded on every primary (``on_each_primary``);
- a pipeline's calls on different slots run on different nodes at once, so calls whose order
  matters are run one slot's run after another (``slot_runs``);
- the errors of a slot on the move (``TRYAGAIN``, ``CLUSTERDOWN``, a redirection redis-py
  gave up on) are transient: the call did not run and is safe to run again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast
from urllib.parse import parse_qsl, unquote

import redis.asyncio as aioredis
import redis.exceptions as rexc
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.cluster import ClusterNode as SyncNode
from redis.cluster import RedisCluster as SyncCluster
from redis.crc import key_slot

from .._model.exceptions import ConfigurationError
from .._model.safetext import redact_url, split_userinfo
from .clock import SHIFTED_TIME, virtual_clock_on

T = TypeVar("T")

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster", "valkey+cluster", "valkeys+cluster")

# the pool options of a standalone client that a cluster client takes, per node
NODE_OPTIONS = (
    "decode_responses",
    "socket_connect_timeout",
    "socket_timeout",
    "health_check_interval",
    "max_connections",
    "socket_keepalive",
    "retry",
    "retry_on_error",
)

#: the errors of a slot on the move or of a cluster mid-failover: the command did not run
MOVING_ERRORS = (
    rexc.TryAgainError,
    rexc.ClusterDownError,
    rexc.ClusterError,
    rexc.MovedError,
    rexc.AskError,
    rexc.SlotNotCoveredError,
)


def is_cluster_url(url: str) -> bool:
    return url.partition("://")[0] in CLUSTER_SCHEMES


def is_cluster(client: object) -> bool:
    """Whether ``client`` is a cluster client (redis-py's ``RedisCluster``, async or
    blocking)."""
    return isinstance(client, RedisCluster | SyncCluster)


def parse_cluster_url(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """A cluster URL's seed nodes and its client options (credentials, TLS, query options).

    Raises:
        ConfigurationError: no seed node, a port that is not a number, a database index
            other than 0 (a cluster has only database 0) or a unix socket.
    """
    scheme, _, rest = url.partition("://")
    userinfo, at, rest = split_userinfo(rest)  # a password may hold "/" or "?"
    hosts, _, query = rest.partition("?")
    hosts, _, path = hosts.partition("/")
    if path.strip("/") not in ("", "0"):
        raise ConfigurationError(
            f"invalid cluster URL: a cluster has only database 0 ({redact_url(url)!r})"
        )
    opts: dict[str, Any] = {"ssl": scheme.startswith(("rediss", "valkeys"))}
    if at:
        user, colon, password = userinfo.partition(":")
        if colon:
            opts["password"] = unquote(password)
        if user:
            opts["username"] = unquote(user)
    seeds = []
    for seed in filter(None, hosts.split(",")):
        host, colon, port = seed.rpartition(":")
        if not colon:
            host, port = seed, "6379"
        host = host.strip("[]")
        if not port.isdigit() or not 0 < int(port) < 65536 or not host:
            raise ConfigurationError(f"invalid cluster URL: bad seed node {seed!r}")
        seeds.append((host, int(port)))
    if not seeds:
        raise ConfigurationError(f"invalid cluster URL: no seed node in {redact_url(url)!r}")
    for key, value in parse_qsl(query):
        opts[key] = value
    return seeds, opts


def cluster_client(url: str, pool_opts: dict[str, Any]) -> RedisCluster:
    """A ``RedisCluster`` on the URL's seed nodes, with the pool options that apply per node
    (``max_connections`` is per node)."""
    seeds, opts = parse_cluster_url(url)
    for key in NODE_OPTIONS:
        if key in pool_opts:
            opts[key] = pool_opts[key]
    extra = set(pool_opts) - set(NODE_OPTIONS) - {"timeout"}
    opts.update({k: pool_opts[k] for k in extra})
    nodes = [ClusterNode(host, port) for host, port in seeds]
    try:
        return WaitingCluster(startup_nodes=nodes, **opts)
    except TypeError as exc:
        raise ConfigurationError(f"invalid cluster client option: {exc}") from exc


class WaitingCluster(RedisCluster):
    """A ``RedisCluster`` whose callers wait for a free connection, as the standalone
    client's blocking pool makes them, rather than fail with ``MaxConnectionsError``: at most
    ``max_connections`` commands and pipelines are in flight at once (each node keeps a few
    connections more, for the pub/sub listener)."""

    def __init__(self, *args: Any, max_connections: int = 100, **kwargs: Any) -> None:
        kwargs["max_connections"] = max_connections + 8
        super().__init__(*args, **kwargs)
        self._in_flight = asyncio.Semaphore(max_connections)

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        async with self._in_flight:
            return await super().execute_command(*args, **kwargs)

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> ClusterPipeline:
        pipe = super().pipeline(transaction, shard_hint)
        run = pipe.execute

        async def execute(raise_on_error: bool = True, allow_redirections: bool = True) -> Any:
            async with self._in_flight:
                return await run(raise_on_error, allow_redirections)

        pipe.execute = execute  # type: ignore[method-assign]
        return pipe


class _NodePipeline:
    """A non-transactional pipeline of plain commands bound to one node of a cluster."""

    def __init__(self, client: RedisCluster, node: ClusterNode) -> None:
        self._client = client
        self._node = node
        self._commands: list[tuple[Any, ...]] = []

    def execute_command(self, *args: Any) -> None:
        self._commands.append(args)

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        out = []
        for args in self._commands:
            try:
                out.append(await self._client.execute_command(*args, target_nodes=self._node))
            except rexc.ResponseError as exc:
                if raise_on_error:
                    raise
                out.append(exc)
        return out


class _NodeDoor:
    """A cluster client seen as a standalone client of one of its nodes (for loaders that
    run plain commands and pipelines, such as ``_lua.load_scripts``)."""

    def __init__(self, client: RedisCluster, node: ClusterNode) -> None:
        self._client = client
        self._node = node

    def pipeline(self, transaction: bool = False) -> _NodePipeline:
        return _NodePipeline(self._client, self._node)

    async def execute_command(self, *args: Any) -> Any:
        return await self._client.execute_command(*args, target_nodes=self._node)


async def on_each_primary(
    client: aioredis.Redis, load: Callable[[aioredis.Redis], Awaitable[None]]
) -> None:
    """Run ``load`` (a loader written for a standalone client, e.g. ``load_scripts``) on the
    client, or, on a cluster, on each of its primaries."""
    if not is_cluster(client):
        await load(client)
        return
    cluster = cast(RedisCluster, client)
    for node in cluster.get_primaries():
        await load(cast(aioredis.Redis, _NodeDoor(cluster, node)))


def slot_runs(calls: Sequence[T], keys_of: Callable[[T], Sequence[str]]) -> list[list[T]]:
    """Split ``calls`` into runs of consecutive calls on one slot (by their first key), so
    that a cluster pipeline, which sends each node's calls at once, keeps their order."""
    runs: list[list[T]] = []
    last = -1
    for call in calls:
        keys = keys_of(call)
        slot = key_slot(keys[0].encode()) if keys else -1
        if runs and slot == last:
            runs[-1].append(call)
        else:
            runs.append([call])
            last = slot
    return runs


def server_time(target: Any, client: object, key: str) -> Any:
    """``TIME`` on ``target`` (the client, or a pipeline of it), asked of the server that
    holds ``key``, a queue's ``testclock`` key (on a cluster: the primary that serves its
    slot, the clock its scripts read; redis-py would send a keyless command to any node).
    On a client in test mode, the time shifted by the virtual clock's offset (see clock.py)."""
    if virtual_clock_on(client):
        return target.execute_command("EVAL", SHIFTED_TIME, 1, key)
    if is_cluster(client):
        node = cast(RedisCluster, client).get_node_from_key(key)
        return target.execute_command("TIME", target_nodes=node)
    return target.time()


def every_primary(client: object) -> dict[str, Any]:
    """The keyword arguments that send a keyless command (``SCRIPT LOAD``) to every primary
    of a cluster client (none for a standalone client)."""
    if not is_cluster(client):
        return {}
    return {"target_nodes": cast(RedisCluster, client).get_primaries()}


def blocking_cluster_client(url: str, pool_opts: dict[str, Any]) -> SyncCluster:
    """``cluster_client`` for the blocking producer (``app.sync()``)."""
    seeds, opts = parse_cluster_url(url)
    for key in NODE_OPTIONS:
        if key in pool_opts:
            opts[key] = pool_opts[key]
    nodes = [SyncNode(host, port) for host, port in seeds]  # type: ignore[no-untyped-call]
    try:
        return SyncCluster(startup_nodes=nodes, **opts)
    except TypeError as exc:
        raise ConfigurationError(f"invalid cluster client option: {exc}") from exc
