"""What the App's parts use of the App, as Protocols that ``App`` satisfies: the modules of this
folder that ``app.py`` imports type their App against these instead of importing ``App`` back
(no cycle at type level either; the pattern of ``_queue/owner.py``). ``mypy`` checks ``App``
against them where the App hands itself to its parts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .._queue.owner import QueueOwner

if TYPE_CHECKING:
    from .._model.codec import Codec
    from .._queue.owner import EnqueueHooks
    from .._queue.queue import Queue
    from .._store.durable import Durability
    from .queues import Queues


class ConnectedApp(Protocol):
    """What the App's connection (``lifecycle.py``) reads of it; ``rebind`` sets the first
    three."""

    url: str
    prefix: str
    testing: bool

    @property
    def default_queue(self) -> str: ...
    @property
    def max_connections(self) -> int: ...
    @property
    def redis_options(self) -> Mapping[str, Any]: ...
    @property
    def socket_timeout(self) -> float: ...
    @property
    def durability(self) -> Durability | None: ...
    @property
    def queues(self) -> Queues: ...


class ProducingApp(ConnectedApp, Protocol):
    """What a producer outside the App's queues (the blocking one, ``sync.py``) reads of it:
    its connection settings, codec, enqueue hooks and job defaults."""

    @property
    def codec(self) -> Codec: ...
    @property
    def hooks(self) -> EnqueueHooks: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def dead_ttl_ms(self) -> int: ...


class BlockingProducer(Protocol):
    """The App's blocking producer (``app.sync()``, ``sync.py``), as a task's owner gives it."""

    def enqueue(self, task: Any, /, *args: Any, **kwargs: Any) -> Any: ...


class BatchOwner(QueueOwner, Protocol):
    """What batches and chains use of the App (``app.App``; a protocol: no import cycle)."""

    @property
    def result_ttl_default_ms(self) -> int: ...
    def queue(self, name: str | None = None) -> Queue: ...


__all__ = ["BatchOwner", "BlockingProducer", "ConnectedApp", "ProducingApp"]
