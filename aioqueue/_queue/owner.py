"""What a queue needs of the App that owns it, as Protocols that an ``App`` satisfies: the queue
folder types its owner against these instead of importing ``App`` from the floor above (the
pattern of redis-py's ``CommandsProtocol``). ``mypy`` checks ``App`` against them where an App
makes its queues."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Protocol, TypeVar

from .._model.job import JobHome

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from .._model.codec import Codec
    from .._model.convert import ArgsDecoder
    from .._model.hooks import EnqueueEvent
    from .._store.scripts import QueueScripts
    from .coalesce import Coalescer

T = TypeVar("T")


class OwnedTask(Protocol):
    """What a queue reads of a task its App declares (its defaults, how to decode its
    arguments)."""

    @property
    def queue(self) -> str: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def priority(self) -> int: ...
    @property
    def timeout(self) -> float | None: ...
    @property
    def result_ttl(self) -> float | None: ...
    @property
    def args_decoder(self) -> ArgsDecoder | None: ...


class RetryDelay(Protocol):
    """A task's or the App's backoff: seconds to wait after a failed attempt."""

    def delay(self, attempt: int) -> float: ...


class ResultWaiting(Protocol):
    """The App's waiter for results over pub/sub (``_app/results.py``)."""

    async def wait(
        self,
        channel: str,
        key: str,
        check: Callable[[], Awaitable[tuple[bool, T]]],
        timeout: float | None,
        what: str,
    ) -> T: ...


class EnqueueHooks(Protocol):
    """The App's before- and after-enqueue hooks, as a producer runs them."""

    @property
    def on_enqueue(self) -> bool: ...
    def before(self, queue: str, task: str, job_ids: tuple[str, ...]) -> EnqueueEvent: ...
    def after(self, event: EnqueueEvent) -> None: ...


class QueueOwner(Protocol):
    """The App of a queue, as the queue folder sees it."""

    @property
    def prefix(self) -> str: ...
    @property
    def redis(self) -> aioredis.Redis: ...
    @property
    def codec(self) -> Codec: ...
    @property
    def hooks(self) -> EnqueueHooks: ...
    @property
    def tasks(self) -> Mapping[str, OwnedTask]: ...
    @property
    def lease(self) -> float: ...
    @property
    def socket_timeout(self) -> float: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def dead_ttl_ms(self) -> int: ...
    @property
    def backoff(self) -> RetryDelay: ...
    @property
    def result_waiter(self) -> ResultWaiting: ...
    @property
    def max_payload_bytes(self) -> int: ...
    def queue(self, name: str | None = None) -> OwnedQueue: ...


class QueueParts(Protocol):
    """What every object of a queue has (``QueueCore`` and so a ``Queue``): its App, its
    name, and the door to its keys on the App's current client."""

    @property
    def app(self) -> QueueOwner: ...
    @property
    def name(self) -> str: ...
    @property
    def door(self) -> QueueScripts: ...


class OwnedQueue(QueueParts, JobHome, Protocol):
    """A queue of an App as the producers below ``Queue`` use one (``app.queue(name)``): its
    parts, its enqueue coalescer, and what a ``Job`` handle asks of its queue."""

    @property
    def coalescer(self) -> Coalescer: ...


__all__ = [
    "EnqueueHooks",
    "OwnedQueue",
    "OwnedTask",
    "QueueOwner",
    "QueueParts",
    "ResultWaiting",
    "RetryDelay",
]
