"""``current_job()``: what a running task can know about its job, and progress reporting."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._model.hooks import State

if TYPE_CHECKING:
    from .app import App
    from .batch import Batch


@dataclass(frozen=True, slots=True)
class JobContext:
    """The job a task is running for, from ``current_job()``.

    Attributes:
        id: the job id.
        queue: its queue.
        task: the task name.
        attempt: this run's attempt number, from 1.
        max_attempts: attempts allowed before the job is dead-lettered.
        app: the App the worker runs for (its connection pool is usable from the task).
        batch: for a batch's callback, its batch (``await batch.results()``); else None.
    """

    id: str
    queue: str
    task: str
    attempt: int
    max_attempts: int
    app: App
    batch: Batch[Any] | None = None

    @property
    def state(self) -> State:
        """The worker's shared objects, set by its startup hooks (``@app.on_startup``):
        ``current_job().state.get(Pool)``. (A context variable the worker sets once, so that
        a job's run pays nothing for it.)"""
        try:
            return _worker_state.get()
        except LookupError:  # a JobContext made outside a worker
            return State()

    async def progress(self, value: Any) -> None:
        """Record the job's progress (any JSON value, e.g. a fraction or a dict); readable
        from ``Job.info()`` in any process."""
        data = self.app.codec.json.dumps(value)
        await self.app.queue(self.queue)._scripts.set_progress(self.id, data)


_current: contextvars.ContextVar[JobContext] = contextvars.ContextVar("aioqueue_current_job")
#: the running worker's State: set in ``Worker.run`` before it starts any task, so every task
#: it starts (and so every job's run) inherits it
_worker_state: contextvars.ContextVar[State] = contextvars.ContextVar("aioqueue_worker_state")


def current_job() -> JobContext:
    """The job the calling task is running for.

    Raises:
        RuntimeError: called outside a job run by a worker.
    """
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError("current_job() called outside a job run by an aioqueue worker") from None
