"""Declaring periodic schedules in code: what ``@app.cron`` does (the App's method delegates
here, to ``app.schedule``). No I/O: workers store the declared schedules when they start
(``schedules.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from .._model.exceptions import ConfigurationError
from .task import Task

TaskT = TypeVar("TaskT", bound=Task[Any, Any])


def cron_decorator(
    declare: Callable[..., None], expression: str, **options: Any
) -> Callable[[TaskT], TaskT]:
    """``@app.cron(expression, ...)``: a decorator that declares the task's schedule with
    ``declare`` (``app.schedule``) and returns the task."""

    def decorate(task: TaskT) -> TaskT:
        if not isinstance(task, Task):
            raise ConfigurationError("@app.cron(...) goes above @app.task, on a task")
        declare(task, cron=expression, **options)
        return task

    return decorate
