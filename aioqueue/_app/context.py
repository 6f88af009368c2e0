"""``current_job()``: what a running task can know about its job, and progress reporting."""

from __future__ import annotations

import contextvars
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._model.hooks import State
from .._model.job import Job, JobState
from .._queue.deps import DependencyPolicy, dependency_jobs, outcomes, park

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
        token: the lease token of this run (fences what it writes to its job).
    """

    id: str
    queue: str
    task: str
    attempt: int
    max_attempts: int
    app: App
    batch: Batch[Any] | None = None
    token: str = ""

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

    async def dependency_results(self) -> dict[str, Any]:
        """The results of the jobs this job waited for (``depends_on=``, or the children of
        ``wait_for_children``), by id, each read by its task's return annotation (verified on
        a signing App); dependencies that failed or were cancelled are left out."""
        refs = await dependency_jobs(self.app, self.queue, self.id)
        return await outcomes(self.app, self.queue, refs, only_done=False) or {}

    async def wait_for_children(
        self, children: Iterable[Job[Any] | str], *, on_failure: DependencyPolicy = "cancel"
    ) -> dict[str, Any]:
        """Wait for ``children`` (jobs this task enqueued; ids on its queue) without holding
        a worker slot: once they all ended, their results by id (as ``dependency_results``).
        If one has not ended, the job is parked (lease given back, attempt not spent) and
        this call does not return: the task runs again **from the top** on any worker once
        the last child ended (give children ids derived from ``self.id`` so that enqueueing
        them again is a no-op; docs/workflows.md). A child that fails follows ``on_failure``
        as ``on_dependency_failure`` does.

        Raises:
            UnknownDependency: a child is no job.
            ConfigurationError: no children, or more than 1,000.
        """
        children = list(children)
        refs = [(j.queue, j.id) if isinstance(j, Job) else (self.queue, j) for j in children]
        done = await outcomes(self.app, self.queue, refs, only_done=True)
        if done is not None:
            states = [await self.app.queue(q).job(i).state() for q, i in refs]
            if on_failure == "run" or all(s == JobState.COMPLETED for s in states):
                return done
            # a child failed: parking applies the policy at once (cancel or dead-letter)
        await park(self.app, self.queue, self.id, self.token, children, on_failure)


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
