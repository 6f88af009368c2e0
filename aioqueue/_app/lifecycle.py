"""An App's connection and its life (``Lifecycle``): unopened, open or closed (``State``), the
shared client, the blocking producer and the result waiter, which ``App``'s ``open``,
``aclose``, ``sync``, ``rebind``, ``redis`` and ``result_waiter`` delegate to. ``rebind`` makes a
closed or unopened App unopened again, on a new server and prefix: what the testing kit's
``bind`` lends a module-level App to one test with."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry

from .._model.checks import check_prefix
from .._model.exceptions import ClosedError, ConfigurationError
from .._model.keys import QueueKeys
from .._store.connect import adopt, connect, pool_options, resolve_url
from .._store.durable import set_durability
from .._store.hot import close_hot_connection
from .results import ResultWaiter
from .sync import SyncClient

if TYPE_CHECKING:
    from .owners import ProducingApp


class State(enum.Enum):
    UNOPENED = 1
    OPEN = 2
    CLOSED = 3


class Lifecycle:
    """The connection side of one App (see the module's docstring)."""

    def __init__(self, app: ProducingApp, given: aioredis.Redis | None) -> None:
        self.app = app
        #: a client of the user's own (``App(client=...)``): used, never closed
        self.given = given
        self.state = State.UNOPENED
        self.client: aioredis.Redis | None = None
        self.results: ResultWaiter | None = None
        self.blocking: SyncClient | None = None

    async def open(self) -> None:
        app = self.app
        if self.state is State.OPEN:
            return
        if self.state is State.CLOSED:
            raise ClosedError("this App was closed; create a new App to connect again")
        # None: see App's socket_timeout; our calls carry their own asyncio timeout
        opts = pool_options(app.url, app.max_connections, app.redis_options, Retry, None)
        probe = QueueKeys(app.prefix, app.default_queue).seq
        if self.given is not None:
            await adopt(self.given, app.socket_timeout, probe, app.testing)
            self.client = self.given
        else:
            self.client = await connect(app.url, opts, app.socket_timeout, probe, app.testing)
        set_durability(self.client, app.durability)
        self.state = State.OPEN

    def sync(self) -> SyncClient:
        client = self.blocking
        if client is None or client.closed:
            client = self.blocking = SyncClient(self.app, self.given)
        return client

    async def aclose(self) -> None:
        if self.results is not None:
            await self.results.aclose()
            self.results = None
        if self.client is not None:
            await close_hot_connection(self.client)
            if self.client is not self.given:
                await self.client.aclose()
            self.client = None
        self.state = State.CLOSED

    def rebind(self, url: str, prefix: str, testing: bool) -> None:
        app = self.app
        if self.state is State.OPEN:
            raise ConfigurationError(f"{app!r} is open: close it before rebinding it")
        if self.blocking is not None:
            self.blocking.close()
        app.url, app.prefix, app.testing = resolve_url(url), check_prefix(prefix), testing
        self.state = State.UNOPENED
        self.client = self.results = self.blocking = None
        app.queues.remake()

    @property
    def redis(self) -> aioredis.Redis:
        if self.client is None:
            if self.state is State.CLOSED:
                raise ClosedError("this App is closed")
            raise ClosedError("this App is not open: use `async with app:` or `await app.open()`")
        return self.client

    @property
    def result_waiter(self) -> ResultWaiter:
        if self.results is None:
            self.results = ResultWaiter(self.redis)  # ClosedError unless open
        return self.results
