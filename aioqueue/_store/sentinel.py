"""Redis Sentinel: the ``redis+sentinel://`` URL and a connection pool that asks the
sentinels where the primary is (and asks again after a failover).

The URL form (documented in docs/scaling.md)::

    redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db]
        [?sentinel_password=...&sentinel_username=...]

The credentials before ``@`` are those of the data nodes (primary and replicas); the
sentinels' own, if they need any, go in the query. ``valkey+sentinel://`` is the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote

import redis
import redis.asyncio as aioredis
from redis.asyncio.connection import SSLConnection
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import (
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)
from redis.backoff import NoBackoff
from redis.retry import Retry as SyncRetry
from redis.sentinel import Sentinel as SyncSentinel
from redis.sentinel import SentinelConnectionPool as SyncSentinelConnectionPool
from redis.sentinel import SentinelManagedConnection as SyncSentinelManagedConnection

from .._model.exceptions import ConfigurationError
from .._model.safetext import redact_url, split_userinfo

SCHEMES = ("redis+sentinel", "valkey+sentinel")
_QUERY = ("sentinel_password", "sentinel_username")


@dataclass(frozen=True)
class SentinelURL:
    """A parsed ``redis+sentinel://`` URL."""

    sentinels: list[tuple[str, int]]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    sentinel_username: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)

    def node_options(self) -> dict[str, Any]:
        """The options of connections to the data nodes."""
        opts: dict[str, Any] = {"db": self.db}
        if self.username:
            opts["username"] = self.username
        if self.password:
            opts["password"] = self.password
        return opts

    def sentinel_options(self, retry: Any) -> dict[str, Any]:
        """The options of connections to the sentinels: no retries of their own (redis-py's
        default waits seconds on a dead sentinel before asking the next one; the App's pool
        retries the whole look-up)."""
        opts: dict[str, Any] = {"socket_connect_timeout": 5.0, "socket_timeout": 5.0}
        opts["retry"] = retry(NoBackoff(), 0)
        if self.sentinel_username:
            opts["username"] = self.sentinel_username
        if self.sentinel_password:
            opts["password"] = self.sentinel_password
        return opts


def is_sentinel(url: str) -> bool:
    """Whether ``url`` is a ``redis+sentinel://`` (or ``valkey+sentinel://``) URL."""
    return url.partition("://")[0] in SCHEMES


def parse(url: str) -> SentinelURL:
    """The parts of a sentinel URL.

    Raises:
        ConfigurationError: not a valid sentinel URL (no host, a bad port, no service name,
            a bad db index, an unknown query parameter).
    """

    def bad(why: str) -> ConfigurationError:
        return ConfigurationError(f"invalid Sentinel URL {redact_url(url)!r}: {why}")

    scheme, sep, rest = url.partition("://")
    if scheme not in SCHEMES or not sep:
        raise bad("the scheme must be redis+sentinel://")
    creds, at, rest = split_userinfo(rest)  # a password may hold "/" or "?"
    rest, _, query = rest.partition("?")
    hosts, _, path = rest.partition("/")
    username = password = None
    if at:
        user, colon, pw = creds.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if colon else None
    sentinels: list[tuple[str, int]] = []
    for item in hosts.split(","):
        host, colon, port = item.rpartition(":")
        if not colon:
            host, port = item, "26379"
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise bad(f"{item!r} is not host:port")
        sentinels.append((host.strip("[]"), int(port)))
    service, _, db = path.partition("/")
    if not service:
        raise bad("name the monitored service: redis+sentinel://host:port/service_name")
    db = db.strip("/")
    if db and not db.isdigit():
        raise bad(f"the db index must be a number, not {db!r}")
    extra: dict[str, str] = {}
    for name, values in parse_qs(query, keep_blank_values=True).items():
        if name not in _QUERY:
            raise bad(f"unknown parameter {name!r} (known: {', '.join(_QUERY)})")
        extra[name] = values[-1]
    return SentinelURL(sentinels, unquote(service), int(db or 0), username, password, **extra)


# redis-py's sentinel-managed connection asks the sentinels for the primary only in
# ``connect()``; its other ways in (a send on an unconnected connection, which the App's held
# enqueue connection and redis-py's own retries take) open the socket at the connection's
# default address, localhost:6379. These look the primary up wherever the socket is opened.
class PrimaryConnection(SentinelManagedConnection):
    """A connection to the primary the sentinels name, however it comes to connect."""

    async def connect(self) -> None:
        await self.connect_check_health(check_health=self.connection_pool.check_connection)

    async def _connect(self) -> None:
        self.host, self.port = await self.connection_pool.get_master_address()
        await super()._connect()  # type: ignore[no-untyped-call]


class PrimarySSLConnection(PrimaryConnection, SSLConnection):
    """The same over TLS."""


class SyncPrimaryConnection(SyncSentinelManagedConnection):
    """``PrimaryConnection`` for redis-py's blocking client."""

    def connect(self) -> None:
        self.connect_check_health(check_health=self.connection_pool.check_connection)

    def _connect(self) -> Any:
        self.host, self.port = self.connection_pool.get_master_address()
        return super()._connect()  # type: ignore[no-untyped-call]


class SyncPrimarySSLConnection(SyncPrimaryConnection, redis.SSLConnection):
    """The same over TLS."""


class BlockingSentinelPool(SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """A sentinel-managed pool that, like the App's standalone pool, makes a burst of
    callers wait for a free connection rather than fail."""

    async def aclose(self) -> None:
        """Close the pool's connections and the connections to the sentinels."""
        await super().aclose()
        await self.sentinel_manager.aclose()


class SyncBlockingSentinelPool(SyncSentinelConnectionPool, redis.BlockingConnectionPool):
    """The same for the blocking producer (``app.sync()``)."""

    def close(self) -> None:
        """Close the pool's connections and the connections to the sentinels."""
        super().close()
        self.sentinel_manager.close()


def async_pool(url: str, opts: dict[str, Any]) -> BlockingSentinelPool:
    """A pool on the primary the sentinels of ``url`` name (``opts``: the App's pool
    options)."""
    parsed = parse(url)
    kwargs = parsed.sentinel_options(AsyncRetry)
    manager = Sentinel(parsed.sentinels, sentinel_kwargs=kwargs)  # type: ignore[no-untyped-call]
    options = {**opts, **parsed.node_options()}
    tls = options.pop("ssl", False)
    options["connection_class"] = PrimarySSLConnection if tls else PrimaryConnection
    return BlockingSentinelPool(parsed.service, manager, **options)  # type: ignore[no-untyped-call]


def sync_pool(url: str, opts: dict[str, Any]) -> SyncBlockingSentinelPool:
    """The same as ``async_pool``, for redis-py's blocking client."""
    parsed = parse(url)
    kwargs = parsed.sentinel_options(SyncRetry)
    manager = SyncSentinel(parsed.sentinels, sentinel_kwargs=kwargs)  # type: ignore[no-untyped-call]
    options = {**opts, **parsed.node_options()}
    tls = options.pop("ssl", False)
    options["connection_class"] = SyncPrimarySSLConnection if tls else SyncPrimaryConnection
    return SyncBlockingSentinelPool(parsed.service, manager, **options)  # type: ignore[no-untyped-call]


def adopt_pool(pool: Any) -> None:
    """Make a given client's Sentinel pool (``App(client=...)`` on redis-py's
    ``Sentinel.master_for``) look the primary up wherever its connections connect, as the
    App's own do: its stock connection classes are swapped for these subclasses."""
    if isinstance(pool, SentinelConnectionPool) and pool.is_master:
        swap: dict[type[Any], type[Any]] = {
            SentinelManagedConnection: PrimaryConnection,
            SentinelManagedSSLConnection: PrimarySSLConnection,
        }
        pool.connection_class = swap.get(pool.connection_class, pool.connection_class)


def sync_pool_like(pool: SentinelConnectionPool, opts: dict[str, Any]) -> SyncBlockingSentinelPool:
    """A blocking pool on the primary that ``pool``'s sentinels name (``app.sync()`` of an
    App given a Sentinel client): the same sentinels, service and node credentials."""
    manager = pool.sentinel_manager
    addresses = []
    for sentinel in manager.sentinels:
        kwargs = sentinel.connection_pool.connection_kwargs
        addresses.append((kwargs["host"], kwargs["port"]))
    given: dict[str, Any] = manager.sentinel_kwargs
    own = {k: v for k, v in given.items() if k in ("username", "password")}
    kwargs = SentinelURL([], "").sentinel_options(SyncRetry) | own
    sync_manager = SyncSentinel(addresses, sentinel_kwargs=kwargs)  # type: ignore[no-untyped-call]
    node: dict[str, Any] = pool.connection_kwargs
    options: dict[str, Any] = dict(opts)
    options.update((k, node[k]) for k in ("db", "username", "password") if k in node)
    if issubclass(pool.connection_class, SSLConnection):
        options |= {k: v for k, v in node.items() if k.startswith("ssl_")}
        options["connection_class"] = SyncPrimarySSLConnection
    else:
        options["connection_class"] = SyncPrimaryConnection
    return SyncBlockingSentinelPool(pool.service_name, sync_manager, **options)  # type: ignore[no-untyped-call]
