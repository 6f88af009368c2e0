"""The values of hooks: ``State`` (what startup hooks share with tasks), ``EnqueueEvent`` (what
enqueue hooks see) and the hooks' call types. The hooks themselves, and the App's decorators
that register them, are in ``_app/hooks.py`` (docs/hooks.md)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


class State:
    """The objects a worker's startup hooks share with its tasks, one per type.

    A startup hook stores an object (``state.set(pool)``); a task reads it back by its type,
    typed: ``current_job().state.get(Pool)`` is a ``Pool``. One State per worker.
    """

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: dict[type, object] = {}

    def __repr__(self) -> str:
        return f"<State {sorted(t.__qualname__ for t in self._items)}>"

    def set(self, value: T, *, as_type: type[T] | None = None) -> T:
        """Store ``value`` under its type (or ``as_type``, e.g. a base class); returns it."""
        kind = type(value) if as_type is None else as_type
        if not isinstance(value, kind):
            raise TypeError(f"{value!r} is not a {kind.__qualname__}")
        self._items[kind] = value
        return value

    def get(self, kind: type[T]) -> T:
        """The object stored under ``kind``.

        Raises:
            LookupError: nothing was stored under it (no startup hook set one).
        """
        try:
            return self._items[kind]  # type: ignore[return-value]
        except KeyError:
            raise LookupError(
                f"no {kind.__qualname__} in the worker's state: set it in an @app.on_startup hook"
            ) from None

    def __contains__(self, kind: object) -> bool:
        return kind in self._items


@dataclass(frozen=True, slots=True)
class EnqueueEvent:
    """What before- and after-enqueue hooks see of one enqueue call: where the jobs go, of
    which task, and their ids (known before they are stored). Not their arguments, which may
    hold secrets; pass what a hook needs (a trace id) as an argument of the task instead.

    Attributes:
        queue: the queue the jobs go to.
        task: the task name.
        job_ids: one id per job of the call (``enqueue``: one; ``enqueue_many``: many).
    """

    queue: str
    task: str
    job_ids: tuple[str, ...]


#: a startup or shutdown hook: ``async def hook(state: State) -> None``
LifecycleHook = Callable[[State], Awaitable[None]]


class CallNext(Protocol):
    """What a middleware awaits to run the rest of the chain and the task: ``await
    call_next()`` returns the task's result (or raises what it raised)."""

    def __call__(self) -> Awaitable[Any]: ...


#: (``app.sync()``) runs them too
EnqueueHook = Callable[[EnqueueEvent], None]


__all__ = ["CallNext", "EnqueueEvent", "EnqueueHook", "LifecycleHook", "State"]
