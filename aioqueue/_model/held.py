"""Composition with a flat public surface: a class offers, as methods of its own, the methods of
objects it holds (``held``), instead of inheriting them from mixins.

``Queue`` holds its faces (``QueuePull``, ``QueueAdmin``, ``QueueEvents``) and ``QueueScripts``
holds its reads (``QueueReads``)::

    class Queue(QueueCore):
        def __init__(self, app, name):
            super().__init__(app, name)
            self._admin = QueueAdmin(self)

        purge = held("_admin", QueueAdmin.purge)

``queue.purge(...)`` calls ``queue._admin.purge(...)``. The method keeps its name, docstring and
signature (``functools.update_wrapper``, so ``inspect.signature`` and the API reference see the
held method's), and mypy sees it as a method of the holder with the held method's parameters
(``Concatenate``/``ParamSpec``). ``own_held`` (a class decorator) names the methods after their
holder, as ``Queue.purge`` in ``aioqueue``, so the layout stays out of sight.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from operator import attrgetter
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C", bound=type)

#: marks the functions ``held`` makes (what ``own_held`` renames)
_HELD = "__aioqueue_held__"


def held(attr: str, method: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Any, P], R]:
    """A method that calls ``method`` on the object the instance holds in attribute ``attr``
    (a coroutine function when ``method`` is one, so ``inspect`` and the reference say
    ``async``)."""
    holder = attrgetter(attr)
    call: Callable[..., Any]
    if inspect.iscoroutinefunction(method):

        async def call(self: Any, /, *args: Any, **kwargs: Any) -> Any:
            return await cast(Any, method)(holder(self), *args, **kwargs)

    else:

        def call(self: Any, /, *args: Any, **kwargs: Any) -> Any:
            return method(holder(self), *args, **kwargs)

    functools.update_wrapper(call, method)
    setattr(call, _HELD, attr)
    return cast(Callable[Concatenate[Any, P], R], call)


def own_held(cls: C) -> C:
    """Class decorator: the ``held`` methods of ``cls`` take its module and qualified name
    (``Queue.purge``, not ``QueueAdmin.purge``), so tracebacks, ``help()`` and the API
    reference name the class users hold."""
    for name, value in vars(cls).items():
        if callable(value) and hasattr(value, _HELD):
            value.__qualname__ = f"{cls.__qualname__}.{name}"
            value.__module__ = cls.__module__
    return cls


__all__ = ["held", "own_held"]
