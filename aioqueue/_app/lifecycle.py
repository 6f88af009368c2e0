"""An App's lifecycle (``State``: unopened, open, closed) and ``Rebinding``, the part of App
that gives a closed or unopened App a new server, prefix and mode (``App.rebind``): what the
testing kit's ``bind`` lends a module-level App to one test with."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Protocol, cast

from .._model.checks import check_prefix
from .._model.exceptions import ConfigurationError
from .._queue.owner import QueueOwner
from .._queue.sharded import ShardedQueue
from .._store.connect import resolve_url

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from .._queue.queue import Queue


class State(enum.Enum):
    UNOPENED = 1
    OPEN = 2
    CLOSED = 3


class _Closable(Protocol):
    def close(self) -> None: ...


class Rebinding:
    """``App.rebind`` (a part of App: the attributes below are App's)."""

    url: str
    prefix: str
    testing: bool
    _state: State
    _redis: aioredis.Redis | None
    _results: object | None
    _sync: _Closable | None
    _queues: dict[str, Queue]
    _sharded: dict[str, ShardedQueue]

    def rebind(self, url: str, prefix: str, *, testing: bool) -> None:
        """Make this App, unopened or closed, a new unopened App on ``url`` under ``prefix``
        in that mode (``testing``: see App), keeping its tasks, hooks, schedules declared in
        code and sharded queues (made again on the new prefix); its codec keeps the settings
        it was made with. For tests (``aioqueue.testing.bind``); no I/O.

        Raises:
            ConfigurationError: the App is open.
        """
        if self._state is State.OPEN:
            raise ConfigurationError(f"{self!r} is open: close it before rebinding it")
        if self._sync is not None:
            self._sync.close()
        self.url, self.prefix, self.testing = resolve_url(url), check_prefix(prefix), testing
        self._state = State.UNOPENED
        self._redis = self._results = self._sync = None
        self._queues.clear()
        for name, sharded in list(self._sharded.items()):
            self._sharded[name] = ShardedQueue(cast(QueueOwner, self), name, sharded.shards)
