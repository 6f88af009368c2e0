"""The run of one leased job: decode it, call its task (with its timeout, its context, in a
thread for a sync task) and say how it went. Knows nothing of the pool that runs it; the pool
(``_worker.py``) records the outcome, renews the lease meanwhile and decides about shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from .._app.batch import Batch
from .._app.context import JobContext, _current, capture_logs
from .._app.hooks import run_through
from .._app.steps import JobParked, JobRun, flush_log
from .._model.checks import MAX_SECONDS, to_seconds
from .._model.codec import Unrunnable, corrupt
from .._model.exceptions import AioQueueError, BadSignature, RateLimited, Retry
from .._queue.deps import Parked, running
from .isolation import ChildPool, ProcessIsolation, default_processes

logger = logging.getLogger(__name__)

#: the scope of a run without a timeout (reusable: it holds no state)
_NO_TIMEOUT: Final = contextlib.nullcontext()

if TYPE_CHECKING:
    from .._app.app import App
    from .._app.task import Task
    from .._model.record import Claimed
    from .._queue.leases import Leases

#: a run that succeeded: the ack to send (id, lease token, result, result_ttl_ms)
Ack = tuple[str, str, bytes, int]
#: a job as read: (args, kwargs, options, timeout, result_ttl_ms, batch)
_Loaded = tuple[
    tuple[Any, ...], dict[str, Any], dict[str, Any], float | None, int, "Batch[Any] | None"
]


@dataclass(frozen=True, slots=True)
class Failure:
    """A run that failed: the error to record; retried after ``retry_ms`` while attempts are
    left, or (None) dead-lettered at once."""

    error: BaseException
    retry_ms: int | None = None
    #: no task of that name here (the pool may hand the job back for a worker that has it)
    unknown_task: bool = False
    #: not a failure: the job parked itself (a durable wait, ``wait_for_children``): given
    #: back already, nothing to record
    parked: bool = False


class Runner:
    """Runs jobs of an App's tasks, one call of ``run`` per leased job.

    Args:
        app: whose tasks run.
        threads: size of the thread pool for sync tasks (made on first use), and of the
            pool of child processes for isolated tasks unless ``isolation`` says.
        isolation: how isolated tasks run (None: the defaults of ``ProcessIsolation``).
    """

    def __init__(self, app: App, threads: int, isolation: ProcessIsolation | None = None) -> None:
        self.app = app
        self.threads = threads
        # the App's middleware (_hooks.py), as registered when the worker was made
        self._middleware = tuple(app.hooks.middleware)
        self._executor: ThreadPoolExecutor | None = None
        self.isolation = isolation or ProcessIsolation()
        self._children: ChildPool | None = None

    def close(self) -> None:
        """Stop the thread pool (threads still running a job are left to finish) and the
        idle child processes."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        if self._children is not None:
            self._children.close()

    def isolated(self, task: Task[Any, Any]) -> bool:
        """Whether the task runs in a child process."""
        return task.isolation == "process" or self.isolation.every_task

    def _timing(self, task: Task[Any, Any], timeout: float | None) -> tuple[bool, float | None]:
        """Whether the task runs isolated, and the timeout the run's own scope enforces: an
        isolated run's is its child's (a wait for a free child and the child's start do not
        count), enforced by the pool, which kills the child."""
        isolated = self.isolated(task)
        return isolated, None if isolated else timeout

    @property
    def children(self) -> ChildPool:
        """The pool of child processes (made on first use)."""
        if self._children is None:
            n = self.isolation.processes or default_processes(self.threads)
            self._children = ChildPool(self.app.serializer, self.isolation, n)
        return self._children

    async def run(self, leases: Leases, c: Claimed) -> Ack | Failure:
        """Run the leased job ``c`` of ``leases``' queue to its outcome. Cancelling it
        cancels the job's body; the caller decides what the cancellation means."""
        app = self.app
        task = app.tasks.get(c.task)
        if task is None:
            return _unknown(c.task, app.tasks)
        loaded = await self._load(task, leases, c)
        if isinstance(loaded, Failure):
            return loaded
        args, kwargs, opts, timeout, ttl_ms, batch = loaded
        # each job runs in its own asyncio task, hence its own context: no reset needed
        run = JobRun(c.token, task.policy.capture_logs)
        job = JobContext(
            c.id, leases.name, c.task, c.attempt, c.max_attempts, app, batch, c.token, run
        )
        _current.set(job)
        running.set((leases.name, c.id))
        if run.capture is not None:
            capture_logs()
        outcome = await self._outcome(task, c, job, args, kwargs, opts, timeout)
        if run.lines:  # its log, written while the lease is still this run's (_app/steps.py)
            try:
                await flush_log(leases.scripts, c.id, run)
            except AioQueueError as exc:
                logger.warning("job %s: its log lines were not kept: %s", c.id, exc)
        if isinstance(outcome, Failure):
            return outcome
        try:
            data = app.codec.dump_result(
                outcome, queue=leases.name, job_id=c.id, task=c.task, options=opts
            )
            return (c.id, c.token, data, ttl_ms)
        except AioQueueError as exc:
            return Failure(exc)

    async def _outcome(
        self,
        task: Task[Any, Any],
        c: Claimed,
        job: JobContext,
        args: tuple[Any, ...],
        kwargs: Any,
        opts: dict[str, Any],
        timeout: float | None,
    ) -> Any:
        """The task's result, or the Failure of its run."""
        isolated, own = self._timing(task, timeout)
        # no scope without a timeout: asyncio.timeout(None) costs a run about 2 µs for nothing
        scope: contextlib.nullcontext[None] | asyncio.Timeout
        scope = _NO_TIMEOUT if own is None else asyncio.timeout(own)
        try:
            chain = job.batch if opts.get("chain") else None
            if _prepares_arguments(task, chain, isolated):
                given = await _arguments(task, chain, args, kwargs, decode=not isolated)
                if isinstance(given, Failure):
                    return given
                args, kwargs = given
            async with scope:  # the one timeout of the run, middleware included
                if self._middleware:  # around the body (_app/hooks.py)
                    body = functools.partial(self._body, task, args, kwargs, timeout, isolated)
                    return await run_through(self._middleware, job, body)
                if isolated:
                    return await self._run_isolated(task, args, kwargs, timeout)
                return await (
                    task.fn(*args, **kwargs)
                    if task.is_async
                    else self._run_sync(task.fn, args, kwargs)
                )
        except RateLimited as r:  # back uncharged, its limits backing off (Leases.fail)
            return Failure(r, int((r.retry_after or 0.0) * 1000))
        except Retry as r:
            return _retry(task, c, r)
        except (JobParked, Parked) as parked:  # a durable wait, wait_for_children: given back
            return Failure(parked, parked=True)
        except BadSignature as exc:  # a tampered input (a chain step's) does not heal on retry
            return Failure(exc)
        except Exception as exc:
            if not task.policy.retries(exc):  # NonRetryable, dont_retry_on, not in retry_on
                return Failure(exc)
            # (a run without a timeout has no scope to expire)
            expired = isinstance(scope, asyncio.Timeout) and scope.expired()
            if isinstance(exc, TimeoutError) and expired:
                exc = Unrunnable("JobTimeout", f"job exceeded its timeout of {timeout} s")
            return Failure(exc, int(task.backoff.delay(c.attempt) * 1000))

    async def _load(self, task: Task[Any, Any], leases: Leases, c: Claimed) -> _Loaded | Failure:
        """Read the leased job ``c``: its arguments, options, timeout, result retention and
        batch (a batch's callback, a chain's step), or the Failure that ends it."""
        app = self.app
        blob = None
        if app.codec.claim is not None:  # no payload store: no blob to look for
            try:  # a claim-checked payload's blob (_model/claimcheck.py); its trouble: a retry
                blob = await app.codec.fetch_blob(leases.name, c.id, c.payload)
            except Exception as exc:
                return Failure(exc, int(task.backoff.delay(c.attempt) * 1000))
        try:
            # everything read from the record is checked here: garbage dead-letters the job
            # with signing on, payload and options are verified together before either is used
            args, kwargs, opts = app.codec.load_job(
                leases.name, c.id, c.task, c.payload, c.options, blob
            )
            timeout = to_seconds(opts["timeout"]) if "timeout" in opts else task.timeout
            ttl_ms = app.codec.result_ttl_ms(opts, task.result_ttl)
            batch: Batch[Any] | None = None
            if "batch" in opts:  # a batch's callback (or a chain's second step)
                batch = Batch(app.queue(str(opts["bq"])), str(opts["batch"]))
        except (BadSignature, Unrunnable) as exc:
            return Failure(exc)
        except Exception as exc:
            return Failure(corrupt(exc))
        return args, kwargs, opts, timeout, ttl_ms, batch

    async def _body(
        self,
        task: Task[Any, Any],
        args: tuple[Any, ...],
        kwargs: Any,
        timeout: float | None,
        isolated: bool,
    ) -> Any:
        """The task's body, as the innermost middleware calls it."""
        if isolated:
            return await self._run_isolated(task, args, kwargs, timeout)
        if task.is_async:
            return await task.fn(*args, **kwargs)
        return await self._run_sync(task.fn, args, kwargs)

    async def _run_sync(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run a blocking task in the thread pool (a thread cannot be stopped: on a timeout
        the job fails and its thread is left to finish)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="aioqueue")
        ctx = contextvars.copy_context()
        call = functools.partial(ctx.run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def _run_isolated(
        self,
        task: Task[Any, Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        timeout: float | None,
    ) -> Any:
        """Run the task in a child process (``isolation.py``) that its timeout kills: the
        arguments, as the job stored them, and the result cross as the serializer's bytes."""
        serializer = self.app.serializer
        fn = task.fn
        payload = serializer.dumps([list(args), kwargs])
        data = await self.children.run(fn.__module__, fn.__qualname__, payload, timeout)
        return serializer.loads(data)


def _unknown(name: str, tasks: dict[str, Task[Any, Any]]) -> Failure:
    """The outcome of a job of a task this worker does not have."""
    known = ", ".join(sorted(tasks)) or "none"
    msg = f"no task named {name!r} in this worker (known: {known})"
    # a name no deploy can bring (empty, or not UTF-8) is dead-lettered at once
    named = bool(name) and "\ufffd" not in name
    return Failure(Unrunnable("UnknownTask", msg), unknown_task=named)


def _prepares_arguments(task: Task[Any, Any], chain: Batch[Any] | None, isolated: bool) -> bool:
    """Whether a run's arguments need ``_arguments``: a chain's step, or hints to decode (an
    isolated task's child decodes its own: they cross as the serializer's bytes)."""
    return chain is not None or (task.args_decoder is not None and not isolated)


async def _arguments(
    task: Task[Any, Any],
    chain: Batch[Any] | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    decode: bool = True,
) -> tuple[tuple[Any, ...], dict[str, Any]] | Failure:
    """The arguments the task is called with: a chain's second step gets the result of the
    first (verified, with signing on, as made by a member for this very batch) as its first
    argument; then the task's hints convert them. Or the Failure of arguments that cannot be.
    """
    if chain is not None:
        items = await chain.results()
        if not items or not items[0].ok:
            # released only once the first step succeeded: its result was removed
            why = f"chain step: batch {chain.id!r} holds no result of the first step"
            return Failure(Unrunnable("MissingInput", why))
        args = (items[0].result, *args[1:])
    decoder = task.args_decoder if decode else None  # None: JSON already answers its hints
    if decoder is None:
        return args, kwargs
    try:
        return decoder(args, kwargs)
    except Exception as exc:  # arguments that cannot fit do not fit on retry
        return Failure(Unrunnable("InvalidArguments", str(exc)))


def _retry(task: Task[Any, Any], c: Claimed, r: Retry) -> Failure:
    """The outcome of a job that raised ``Retry``: run again after its delay (a negative one
    means now), unless this was its last attempt; a non-finite delay, or one over 100 years,
    fails the attempt."""
    backoff = task.backoff.delay(c.attempt)
    if r.delay is not None and not (math.isfinite(r.delay) and r.delay <= MAX_SECONDS):
        why = (
            f"Retry(delay={r.delay!r}): the delay must be a finite number of seconds, "
            f"at most {MAX_SECONDS} (100 years)"
        )
        return Failure(Unrunnable("InvalidRetry", why), int(backoff * 1000))
    if c.attempt >= c.max_attempts:
        why = f"retry requested on the last attempt ({c.attempt} of {c.max_attempts})"
        if r.args:
            why += f": {r}"
        return Failure(Unrunnable("Retry", why))
    if r.delay is None:
        return Failure(r, int(backoff * 1000))
    return Failure(r, int(max(r.delay, 0.0) * 1000))
