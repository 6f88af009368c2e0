"""Declaring periodic schedules in code: ``@app.cron`` and ``app.schedule`` (``App`` inherits
them). No I/O: workers store the declared schedules when they start (``_schedules.py``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from .._model.cron import MissedPolicy
from .._model.exceptions import ConfigurationError
from .schedules import Schedules, make_spec
from .task import Task

TaskT = TypeVar("TaskT", bound=Task[Any, Any])


class ScheduleDecorators:
    """The App's ways to declare schedules in code (``App`` inherits them): ``@app.cron``
    and ``app.schedule``. No I/O: workers store them when they start."""

    schedules: Schedules

    def cron(
        self,
        expression: str,
        *,
        tz: str | None = None,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        missed: MissedPolicy = "skip",
        jitter: float | timedelta | None = None,
        grace: float | timedelta | None = None,
    ) -> Callable[[TaskT], TaskT]:
        """Run a task on a cron schedule; put it above ``@app.task``::

            @app.cron("*/5 * * * *", tz="Europe/Berlin")
            @app.task
            async def report() -> None: ...

        Workers consuming the task's queue store the schedule when they start and enqueue one
        job per tick (see ``app.schedules.add`` for the arguments; docs/scheduling.md).
        Needs the ``aioqueue[cron]`` extra.
        """

        def declare(task: TaskT) -> TaskT:
            if not isinstance(task, Task):
                raise ConfigurationError("@app.cron(...) goes above @app.task, on a task")
            self.schedule(
                task,
                cron=expression,
                tz=tz,
                args=args,
                kwargs=kwargs,
                name=name,
                missed=missed,
                jitter=jitter,
                grace=grace,
            )
            return task

        return declare

    def schedule(
        self,
        task: Task[Any, Any] | str,
        *,
        cron: str | None = None,
        every: float | timedelta | None = None,
        tz: str | None = None,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        missed: MissedPolicy = "skip",
        jitter: float | timedelta | None = None,
        grace: float | timedelta | None = None,
        queue: str | None = None,
    ) -> None:
        """Declare a periodic schedule in code: a cron expression or an interval, and the
        task's arguments. No I/O: workers consuming its queue store it when they start (the
        arguments are those of ``app.schedules.add``).

        Raises:
            ConfigurationError: a bad value, or a schedule of that name already declared.
        """
        self.schedules.declare(
            make_spec(
                self.schedules._app,
                task,
                cron=cron,
                every=every,
                tz=tz,
                args=args,
                kwargs=kwargs,
                name=name,
                missed=missed,
                jitter=jitter,
                grace=grace,
                queue=queue,
                declared=True,
            )
        )
