"""``current_job()``: what a running task can know about its job, and what it can do with it:
report progress, run durable steps, wait durably (``_app/steps.py``), keep log lines."""

from __future__ import annotations

import contextvars
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

from .._model.hooks import State
from .._model.job import Job
from .._queue.deps import DependencyPolicy, dependency_jobs, outcomes, park
from .steps import JobRun, add_line, durable_wait, log_line, run_step, step_key

if TYPE_CHECKING:
    from .._store.scripts import QueueScripts
    from .app import App
    from .batch import Batch

P = ParamSpec("P")
T = TypeVar("T")


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
        run: its step names, waits and unwritten log lines (internal).
    """

    id: str
    queue: str
    task: str
    attempt: int
    max_attempts: int
    app: App
    batch: Batch[Any] | None = None
    token: str = ""
    run: JobRun = field(default_factory=lambda: JobRun(""), repr=False)

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
        await self._scripts().set_progress(self.id, data)

    @overload
    async def step(
        self, name: str, fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs
    ) -> T: ...

    @overload
    async def step(self, name: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T: ...

    async def step(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` (sync or async) once for this job, across its runs:
        its result is recorded under the job, and when the job runs again (a retry, a
        recovery after a crash, a resume after ``sleep``) the recorded result is returned
        without calling ``fn``. Only the current lease holder records (docs/workflows.md).

        Args:
            name: the step's identity within the job (1 to 200 characters), the same in every
                run; two steps of one run must not share it.

        Returns:
            ``fn``'s result as the serializer gives it back (JSON: a tuple comes back a list),
            the same in every run.

        Raises:
            DuplicateStep: ``name`` was already used in this run.
            LeaseLost: the job is no longer this run's (its lease ran out): stop.
            SerializationError: the result cannot be serialised, or is over the payload limit.
        """
        call = functools.partial(fn, *args, **kwargs)
        return await run_step(self._scripts(), self.app.codec, self._where(), self.run, name, call)

    def step_key(self, name: str) -> str:
        """A stable idempotency key for step ``name`` of this job (64 hex characters; the same
        in every run): give it to the service the step calls (a payment API's idempotency
        key) to cover a step that ran but whose result was not recorded."""
        return step_key(self.app.prefix, self.queue, self.id, name)

    async def sleep(self, seconds: float | timedelta) -> None:
        """A durable sleep: the job is parked until then (its lease given back, its attempt
        not charged, no worker holding it, nobody polling) and runs again from the top on any
        worker, its completed steps and earlier waits returning at once; this sleep then
        returns. Sleeps and waits are numbered in the order a run makes them.

        Raises:
            LeaseLost: the job is no longer this run's (its lease ran out): stop.
        """
        await durable_wait(self._scripts(), self.app, self._where(), self.run, seconds, "")

    async def wait_for_event(self, key: str, *, timeout: float | timedelta) -> Any:
        """A durable wait for ``app.signal(key, payload)`` (or ``aioqueue signal KEY``): the
        job is parked like ``sleep`` until a signal or the timeout, then runs again from the
        top; this call then returns the signal's payload (verified on a signing app).

        Raises:
            WaitTimedOut: no signal came within ``timeout`` (also a ``TimeoutError``).
            LeaseLost: the job is no longer this run's: stop.
        """
        if not isinstance(key, str) or not 0 < len(key) <= 200:
            raise ValueError(f"an event key is a string of 1 to 200 characters: {key!r}")
        return await durable_wait(self._scripts(), self.app, self._where(), self.run, timeout, key)

    def _scripts(self) -> QueueScripts:
        return self.app.queue(self.queue).door

    def _where(self) -> tuple[str, str, str]:
        return (self.queue, self.id, self.task)

    def log(self, msg: object, level: int = logging.INFO) -> None:
        """Keep a line in the job's log (``aioqueue job ID``, the dashboard's job page):
        written before the run's outcome, each step and each durable wait; the newest 500
        lines and 64 KiB are kept, longer lines cut to 2,000 bytes."""
        add_line(self.run, log_line(msg, level))

    async def dependency_results(self) -> dict[str, Any]:
        """The results of the jobs this job waited for (``depends_on=``, or the children of
        ``wait_for_children``), by id, each read by its task's return annotation (verified on
        a signing App); dependencies that failed or were cancelled are left out."""
        refs = await dependency_jobs(self.app, self.queue, self.id)
        return await outcomes(self.app, self.queue, refs, only_done=False, holder=self.id) or {}

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
        done = await outcomes(self.app, self.queue, refs, only_done=True, holder=self.id)
        # every child ended (done); those left out of done failed or were cancelled
        if done is not None and (on_failure == "run" or all(i in done for _, i in refs)):
            return done
        # a child failed (parking applies the policy at once: cancel or dead-letter), or one
        # has not ended
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


class CaptureHandler(logging.Handler):
    """Keeps the logging records of a job's run in its log (``@app.task(capture_logs=level)``):
    one handler on the root logger, installed by the first worker that runs such a task; a
    record goes to the log of the job whose run emitted it (the context variable), if that
    job's task captures its level."""

    def emit(self, record: logging.LogRecord) -> None:
        job = _current.get(None)
        if job is not None and job.run.capture is not None and record.levelno >= job.run.capture:
            add_line(job.run, log_line(record.getMessage(), record.levelno, record.created))


_capture: list[CaptureHandler] = []


def capture_logs() -> None:
    """Install the CaptureHandler on the root logger (once per process)."""
    if not _capture:
        _capture.append(CaptureHandler())
        logging.getLogger().addHandler(_capture[0])
