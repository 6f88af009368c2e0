"""Declaring tasks in code: what ``@app.task`` does (the App's method delegates here): name
the function, check its options against the App's defaults, and keep it in ``app.tasks``."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any, ParamSpec, Protocol, TypeVar, overload

from .._model.checks import check_name, check_task_name, retention_seconds, to_seconds
from .._model.exceptions import ConfigurationError
from .task import Backoff, Task, check_backoff

P = ParamSpec("P")
R = TypeVar("R")


class TaskDefaults(Protocol):
    """What registering a task reads of its App: the defaults and the registry."""

    @property
    def default_queue(self) -> str: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def timeout(self) -> float | None: ...
    @property
    def backoff(self) -> Backoff: ...
    @property
    def tasks(self) -> dict[str, Task[Any, Any]]: ...


def register_task(
    app: TaskDefaults,
    make: Callable[..., Task[Any, Any]],
    name: str | None,
    queue: str | None,
    max_attempts: int | None,
    timeout: float | timedelta | None,
    backoff: Backoff | None,
    result_ttl: float | timedelta | None,
    keep_result: float | timedelta | bool | None,
    priority: int,
    fn: Callable[..., Any],
) -> Task[Any, Any]:
    """Make ``fn`` a task of ``app`` with ``make`` (``Task`` bound to the App); the options
    are ``App.task``'s, in its order."""
    task_name = name if name is not None else getattr(fn, "__name__", None)
    if not task_name:
        raise ConfigurationError(f"cannot name task {fn!r}: pass name=")
    check_task_name(task_name)
    if task_name in app.tasks:
        raise ConfigurationError(
            f"a task named {task_name!r} is already registered; pass name= to tell them apart"
        )
    t = make(
        fn,
        name=task_name,
        queue=check_name("queue name", app.default_queue if queue is None else queue),
        max_attempts=app.max_attempts if max_attempts is None else max_attempts,
        timeout=app.timeout if timeout is None else to_seconds(timeout, "timeout"),
        backoff=check_backoff(backoff) or app.backoff,
        result_ttl=retention_seconds(result_ttl, keep_result),
        priority=priority,
    )
    app.tasks[task_name] = t
    return t


class TaskDecorator:
    """What ``@app.task(...)`` returns: apply it to a function to register it."""

    __slots__ = ("_register",)

    def __init__(self, register: Callable[[Callable[..., Any]], Task[Any, Any]]) -> None:
        self._register = register

    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> Task[P, R]: ...

    @overload
    def __call__(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    def __call__(self, fn: Callable[..., Any], /) -> Task[Any, Any]:
        return self._register(fn)
