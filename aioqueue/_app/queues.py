"""The queues of an App by name: plain ones made on first use, sharded ones as declared
(``app.queue(name, shards=K)``). No I/O."""

from __future__ import annotations

from .._model.exceptions import ConfigurationError
from .._queue.owner import QueueOwner
from .._queue.queue import Queue
from .._queue.sharded import ShardedQueue, shard_names


class Queues:
    """An App's queues: one ``Queue`` (of ``kind``) per plain name, one ``ShardedQueue`` per
    name declared sharded."""

    __slots__ = ("kind", "owner", "plain", "sharded")

    def __init__(self, owner: QueueOwner) -> None:
        self.owner = owner
        #: the class of the plain queues (``aioqueue.otel.instrument`` swaps in one that traces)
        self.kind: type[Queue] = Queue
        self.plain: dict[str, Queue] = {}
        self.sharded: dict[str, ShardedQueue] = {}

    def get(self, name: str, shards: int | None) -> Queue | ShardedQueue:
        """The queue ``name``, declared sharded with ``shards`` (see ``App.queue``)."""
        sharded = self.sharded.get(name)
        if sharded is None and shards is not None:
            if name in self.plain:
                raise ConfigurationError(f"queue {name!r} is in use unsharded: declare it first")
            sharded = self.sharded[name] = ShardedQueue(self.owner, name, shards)
        if sharded is not None:
            if shards != sharded.shards:
                raise ConfigurationError(
                    f"queue {name!r} is sharded: use app.queue({name!r}, shards={sharded.shards})"
                )
            return sharded
        q = self.plain.get(name)
        if q is None:
            q = self.plain[name] = self.kind(self.owner, name)
        return q

    def consumed(self, name: str) -> list[str]:
        """The queues a worker consuming ``name`` takes from: its shards, or itself."""
        return shard_names(self.sharded, name)

    def remake(self) -> None:
        """Its owner moved (``App.rebind``): plain queues are made again on first use, sharded
        ones at once, on the owner's new prefix."""
        self.plain.clear()
        for name, sharded in list(self.sharded.items()):
            self.sharded[name] = ShardedQueue(self.owner, name, sharded.shards)

    def retype(self, kind: type[Queue]) -> None:
        """Make plain queues of ``kind`` from now on (those made before are dropped)."""
        self.kind = kind
        self.plain.clear()
