"""Connecting an App to its server: the Redis URL (argument, environment, default), the
connection pool's options, the first connection with its checks, and the URL without its
password for messages and logs."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, cast
from urllib.parse import urlsplit

import redis
import redis.asyncio as aioredis
import redis.exceptions as rexc
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import ClusterNode as SyncNode
from redis.cluster import RedisCluster as SyncCluster
from redis.exceptions import RedisClusterException

from .._model.exceptions import ConfigurationError, ServerUnavailable
from .._model.safetext import redact_text, redact_url, split_userinfo
from . import sentinel as _sentinel
from .clock import use_virtual_clock
from .cluster import (
    CLUSTER_SCHEMES,
    NODE_OPTIONS,
    blocking_cluster_client,
    cluster_client,
    is_cluster,
    is_cluster_url,
    parse_cluster_url,
)
from .loader import check_script_access, load_everywhere
from .wire import use_fast_packing

DEFAULT_URL = "redis://localhost:6379/0"
URL_ENV = "AIOQUEUE_REDIS_URL"
_SCHEMES = ("redis", "rediss", "unix", "valkey", "valkeys")


def resolve_url(url: str | None) -> str:
    """The Redis URL: the argument, else ``$AIOQUEUE_REDIS_URL``, else localhost."""
    url = url or os.environ.get(URL_ENV) or DEFAULT_URL
    if _sentinel.is_sentinel(url):  # several hosts: urlsplit cannot read it
        _sentinel.parse(url)  # raises ConfigurationError
    elif url.partition("://")[0] in CLUSTER_SCHEMES:
        parse_cluster_url(url)  # raises ConfigurationError for a bad one
    else:
        url = _quote_userinfo(url)
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError for a port out of range
        except ValueError as exc:
            raise ConfigurationError(
                f"invalid Redis URL {redact_url(url)!r}: {why(exc, url)}"
            ) from exc
        if parts.scheme not in _SCHEMES:
            raise ConfigurationError(
                f"invalid Redis URL {redact_url(url)!r}: the scheme must be redis:// (or "
                "valkey://), rediss:// (or valkeys://, TLS), unix://, redis+sentinel:// or "
                "redis+cluster:// (or their valkey+ forms)"
            )
    if url.startswith("valkey"):  # redis-py speaks to Valkey; accept Valkey's own schemes
        url = "redis" + url[len("valkey") :]
    return url


def _quote_userinfo(url: str) -> str:
    """``url`` with the ``/``, ``?``, ``#`` and ``@`` of its credentials percent-encoded (a
    base64 password holds ``/``), which would otherwise end the host part early: the
    password then read as a host or port, and shown in errors."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, tail = split_userinfo(rest)
    if not (sep and at):
        return url
    for char, code in (("/", "%2F"), ("?", "%3F"), ("#", "%23"), ("@", "%40")):
        userinfo = userinfo.replace(char, code)
    return f"{scheme}{sep}{userinfo}{at}{tail}"


def pool_options(
    url: str,
    max_connections: int,
    redis_options: Mapping[str, Any],
    retry: Callable[..., Any],
    socket_timeout: float | None,
) -> dict[str, Any]:
    """A connection pool's options (``redis_options`` override them), with ``retry``, the
    ``Retry`` class of the async client or of the blocking one."""
    opts: dict[str, Any] = {
        "decode_responses": False,
        "socket_connect_timeout": 5.0,
        "socket_timeout": socket_timeout,
        "health_check_interval": 10,
        "max_connections": max_connections,
        "timeout": 30.0,  # longest wait for a free connection of the pool
        # a pooled connection the server closed while idle (its timeout, a proxy, a
        # restart) fails on first use: try again on a fresh one. Safe: every script is
        # idempotent when replayed (acks by token, enqueue by id), or at worst leaves a
        # lease to run out (a claim whose reply was lost)
        "retry": retry(ExponentialWithJitterBackoff(base=0.01, cap=0.5), 3),
        "retry_on_error": [rexc.ConnectionError, rexc.TimeoutError],
    }
    if not url.startswith("unix:"):
        opts["socket_keepalive"] = True  # TCP only: unix sockets take no such option
    opts.update(redis_options)
    return opts


async def connect(
    url: str, opts: dict[str, Any], socket_timeout: float, probe_key: str, testing: bool = False
) -> aioredis.Redis:
    """A client on a blocking pool made with ``opts``, once the server answered, loaded the
    scripts (their test build with ``testing``, see clock.py) and let them run on ``probe_key``
    (a key of the App's).

    Raises:
        ServerUnavailable: the server cannot be reached, or is loading its data (retry).
        ConfigurationError: the server refused: bad credentials, a DB index out of range,
            an ACL user without a command aioqueue needs (retrying cannot help).
    """
    if is_cluster_url(url):
        client = cast(aioredis.Redis, cluster_client(url, opts))
    else:
        # a blocking pool: a burst of callers waits for a free connection instead of failing
        pool: aioredis.BlockingConnectionPool
        if _sentinel.is_sentinel(url):  # the sentinels name the primary (again after a failover)
            pool = _sentinel.async_pool(url, opts)
        else:
            pool = aioredis.BlockingConnectionPool.from_url(url, **opts)
        client = aioredis.Redis.from_pool(pool)  # the client owns (and closes) the pool
    use_fast_packing(client, socket_timeout)
    try:
        await _prepare(client, probe_key, testing)
    except BaseException as exc:
        await client.aclose()
        wrapped = _refused(exc, url)
        if wrapped is exc:
            raise
        raise wrapped from exc
    return client


async def adopt(
    client: aioredis.Redis, socket_timeout: float, probe_key: str, testing: bool = False
) -> None:
    """Make ready a client the user configured (``App(client=...)``): the same checks and
    script loading as ``connect``; the client stays the user's (never closed here).

    Raises:
        ServerUnavailable: the server cannot be reached, or is loading its data (retry).
        ConfigurationError: the server refused (see ``connect``).
    """
    pool = getattr(client, "connection_pool", None)
    # the time limit of aioqueue's calls only: the user's connections are left as they are
    (client if pool is None else pool).aioqueue_timeout = socket_timeout  # type: ignore[union-attr]
    _sentinel.adopt_pool(pool)  # a Sentinel pool's connections: to the primary, always
    try:
        await _prepare(client, probe_key, testing)
    except BaseException as exc:
        wrapped = _refused(exc, "the given client")
        if wrapped is exc:
            raise
        raise wrapped from exc


async def _prepare(client: aioredis.Redis, probe_key: str, testing: bool) -> None:
    if testing:
        use_virtual_clock(client)
    await client.ping()
    # load every script once (on a cluster, on every primary), so that pipelines
    # (enqueue_many, batches) run in order rather than replaying the calls that met
    # NOSCRIPT after the others
    # (functions where the server has them; on a cluster, EVALSHA's scripts on each primary)
    await load_everywhere(client)
    # an ACL user that may load scripts but not run them on this app's keys would
    # otherwise fail only later, in every call of a worker that retries forever
    await check_script_access(client, probe_key)


def why(exc: BaseException, url: str) -> str:
    """An error's message for a message of ours, any secret of ``url`` in it hidden."""
    return redact_text(str(exc), url)


def _refused(exc: BaseException, where: str) -> BaseException:
    """What a failed connect raises: refused (bad credentials, a DB index out of range, an
    ACL user without a command aioqueue needs: retrying cannot help) is a
    ConfigurationError, unreachable (or LOADING) a ServerUnavailable; anything else as is."""
    shown = redact_url(where)
    if isinstance(exc, rexc.AuthenticationError | rexc.ResponseError):
        reply = str(exc).rpartition("caused error: ")[2].strip("()',\"")  # a pipeline's
        return ConfigurationError(f"Redis at {shown} refused: {redact_text(reply, where)}")
    if isinstance(exc, rexc.ConnectionError | rexc.TimeoutError | OSError | RedisClusterException):
        return ServerUnavailable(f"cannot reach Redis at {shown}: {why(exc, where)}")
    return exc


def blocking_client(url: str, given: Any, opts: dict[str, Any]) -> redis.Redis:
    """The blocking producer's client (``app.sync()``): like ``given``, the client the App
    was given, else on ``url`` (standalone, through Sentinel, or a cluster)."""
    if given is not None:
        return blocking_twin(given, opts)
    if is_cluster_url(url):
        return cast(redis.Redis, blocking_cluster_client(url, opts))
    if _sentinel.is_sentinel(url):
        return redis.Redis(connection_pool=_sentinel.sync_pool(url, opts))
    return redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(url, **opts))


# ------------------------------------------------------------------ connections of their own
# (every one derived from the App's client: I11, docs/guarantees.md)
def own_client(client: Any, key: str, name: str) -> aioredis.Redis:
    """A client with one connection of its own (never one of ``client``'s pool), to the same
    server as ``client``: on a cluster, to the node that holds ``key``. ``name``: the
    connection's CLIENT SETNAME suffix."""
    if is_cluster(client):
        node = client.get_node_from_key(key)
        kwargs = dict(node.connection_kwargs)
        connection_class = node.connection_class
    else:
        pool = client.connection_pool
        kwargs = dict(pool.connection_kwargs)
        connection_class = pool.connection_class
    kwargs["client_name"] = f"{kwargs.get('client_name') or 'aioqueue'}:{name}"
    own = aioredis.ConnectionPool(connection_class=connection_class, max_connections=1, **kwargs)
    return aioredis.Redis.from_pool(own)


# what a blocking connection takes from an async one of a client the user gave
_BLOCKING_KEYS = ("host", "port", "path", "db", "username", "password", "client_name")


def blocking_twin(client: Any, opts: dict[str, Any]) -> redis.Redis:
    """A blocking client (``app.sync()``) on the server of ``client``, a client the user gave
    (``App(client=...)``), with the pool options ``opts``: never the default address.

    Raises:
        ConfigurationError: a client whose connections cannot be made blocking (a
            connection class of the user's): give the App a URL for ``app.sync()``.
    """
    if is_cluster(client):
        kwargs = client.connection_kwargs
        nodes = [SyncNode(n.host, n.port) for n in client.get_nodes()]  # type: ignore[no-untyped-call]
        extra = {k: v for k, v in kwargs.items() if k in _BLOCKING_KEYS or k.startswith("ssl_")}
        for key in ("host", "port", "db", "path"):
            extra.pop(key, None)
        tls = issubclass(
            kwargs.get("connection_class", aioredis.Connection), aioredis.SSLConnection
        )
        node_opts = {k: opts[k] for k in NODE_OPTIONS if k in opts}
        return cast(redis.Redis, SyncCluster(startup_nodes=nodes, ssl=tls, **extra, **node_opts))
    pool = client.connection_pool
    if isinstance(pool, SentinelConnectionPool):
        return redis.Redis(connection_pool=_sentinel.sync_pool_like(pool, opts))
    kwargs = pool.connection_kwargs
    blocking = _blocking_class(pool)
    if blocking is None:
        raise ConfigurationError(
            "app.sync() cannot make a blocking client like the given one "
            f"({type(pool).__name__}, {pool.connection_class.__name__}): give the App a URL "
            "(App(url, ...)) to use app.sync()"
        )
    options = {**opts, **{k: kwargs[k] for k in _BLOCKING_KEYS if k in kwargs}}
    if blocking is redis.SSLConnection:
        options.update({k: v for k, v in kwargs.items() if k.startswith("ssl_")})
    if blocking is redis.UnixDomainSocketConnection:
        options.pop("socket_keepalive", None)
        options.pop("host", None)
        options.pop("port", None)
    return redis.Redis(
        connection_pool=redis.BlockingConnectionPool(connection_class=blocking, **options)  # type: ignore[no-untyped-call]
    )


def _blocking_class(pool: Any) -> type[Any] | None:
    """The blocking connection class like ``pool``'s (not a Sentinel pool's), or None."""
    for async_class, blocking in (
        (aioredis.UnixDomainSocketConnection, redis.UnixDomainSocketConnection),
        (aioredis.SSLConnection, redis.SSLConnection),
        (aioredis.Connection, redis.Connection),
    ):
        if issubclass(pool.connection_class, async_class):
            return blocking
    return None
