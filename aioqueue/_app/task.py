"""Tasks: ``Task[P, R]`` made by ``@app.task``, the ``.options()`` builder, and retry backoff."""

from __future__ import annotations

import asyncio
import inspect
import math
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Concatenate, Final, Generic, ParamSpec, Protocol, TypeVar

from .._model.checks import (
    at_to_ms,
    check_attempts,
    check_group,
    check_job_id,
    check_name,
    check_priority,
    expiry_option,
    to_seconds,
)
from .._model.convert import ArgsDecoder, Convert, task_types
from .._model.exceptions import ConfigurationError
from .._model.isolation import Isolation, check_isolation
from .._model.job import Job
from .._model.record import JobOptions, JobRecord
from .._model.retrypolicy import DEFAULT_POLICY, TaskPolicy
from .._model.signature import Signature
from .._queue.deps import (
    DependencyPolicy,
    already_kept,
    check_policy,
    dependency_refs,
    enqueue_dependent,
)
from .._queue.queue import store_jobs, store_run
from .._queue.sharded import on_shard, spread
from .._queue.unique import OnConflict, UniqueScope, derived_key, enqueue_unique, unique_options
from .owners import BatchOwner
from .records import ManyCall, RecordingApp, TaskRecords, split_call

if TYPE_CHECKING:
    from .._model.serialize import Serializer
    from .owners import BlockingProducer
    from .queues import Queues

P = ParamSpec("P")
R = TypeVar("R")
R2 = TypeVar("R2")
P2 = ParamSpec("P2")


class TaskOwner(BatchOwner, RecordingApp, Protocol):
    """What a task uses of its App (``app.App``; a protocol: no import cycle): its queues,
    codec and limiters, its serializer, and its blocking producer."""

    @property
    def queues(self) -> Queues: ...
    @property
    def serializer(self) -> Serializer: ...
    def sync(self) -> BlockingProducer: ...
    async def enqueue_chain(self, calls: list[Call[Any]]) -> Job[Any]: ...


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff between attempts: ``base * factor**(attempt-1)`` seconds, capped at
    ``max``, then scaled by a random factor in ``[1 - jitter, 1]`` so retries spread out.
    ``base`` and ``max`` are seconds or timedeltas (stored as seconds)."""

    base: float | timedelta = 1.0
    factor: float = 2.0
    max: float | timedelta = 300.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        for name in ("base", "max"):  # durations: finite, >= 0, at most 100 years
            object.__setattr__(self, name, to_seconds(getattr(self, name), f"Backoff {name}"))
        values = (self.factor, self.jitter)
        if not all(isinstance(v, int | float) and math.isfinite(v) for v in values):
            raise ConfigurationError(f"invalid {self!r}: every value must be a finite number")
        if self.factor < 1 or not 0 <= self.jitter <= 1:
            raise ConfigurationError(f"invalid {self!r}: factor>=1, 0<=jitter<=1")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        d = min(_secs(self.max), _secs(self.base) * self.factor ** max(attempt - 1, 0))
        return d * (1.0 - self.jitter * random.random())


def _secs(value: float | timedelta) -> float:
    """Seconds of a Backoff field (a timedelta is converted when the Backoff is made)."""
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


class Task(Generic[P, R]):
    """A registered job function. ``await task.enqueue(...)`` is checked against its signature.

    Calling the task object itself (``task(...)``) runs the function directly, in-process.
    """

    def __init__(
        self,
        app: TaskOwner,
        fn: Callable[P, Awaitable[R]] | Callable[P, R],
        *,
        name: str,
        queue: str,
        max_attempts: int,
        timeout: float | timedelta | None,
        backoff: Backoff,
        result_ttl: float | timedelta | None,
        priority: int,
        isolation: Isolation = None,
        policy: TaskPolicy = DEFAULT_POLICY,
    ) -> None:
        self.app = app
        #: which failures are retried, which logging records are kept (_model/retrypolicy.py)
        self.policy = policy
        self.fn = fn
        self.name = name
        self.queue = queue
        self.max_attempts = check_attempts(max_attempts)
        self.timeout = to_seconds(timeout, "timeout")
        self.backoff = backoff
        #: seconds its results are kept (-1.0: for good; None: the App's default)
        self.result_ttl = -1.0 if result_ttl == -1.0 else to_seconds(result_ttl, "result_ttl")
        self.priority = check_priority(priority)
        self.is_async = inspect.iscoroutinefunction(fn)
        self.isolation = check_isolation(isolation, fn, name, self.timeout, self.is_async)
        #: the records of its jobs: signature check, default options, templates (records.py)
        self.builder = TaskRecords(self, Signature(fn, name))
        # the decoders of its typed arguments and result (_convert.py), found on first use so
        # a hint may name a class defined after the task; None: JSON gives the right values
        self._types: tuple[ArgsDecoder | None, Convert | None] | None = None
        self.limits: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"<Task {self.name!r} queue={self.queue!r}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Awaitable[R] | R:
        return self.fn(*args, **kwargs)

    def _resolve_types(self) -> tuple[ArgsDecoder | None, Convert | None]:
        types = self._types
        if types is None:
            if self.app.serializer.name != "json":  # pickle and custom serializers keep types
                types = (None, None)
            else:
                types = task_types(self.fn, f"task {self.name!r}")
            self._types = types
        return types

    @property
    def args_decoder(self) -> ArgsDecoder | None:
        """Turns a job's JSON arguments into the types its parameters' annotations ask for
        (None: JSON already gives them, or the serializer is not JSON)."""
        return (self._types or self._resolve_types())[0]

    @property
    def result_converter(self) -> Convert | None:
        """Turns a job's JSON result into its return annotation's type (None: nothing to do)."""
        return (self._types or self._resolve_types())[1]

    def options(
        self,
        *,
        delay: float | timedelta | None = None,
        at: datetime | float | None = None,
        job_id: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        timeout: float | timedelta | None = None,
        result_ttl: float | timedelta | None = None,
        queue: str | None = None,
        group: str | None = None,
        expires: datetime | float | timedelta | None = None,
        unique: bool = False,
        unique_key: str | None = None,
        unique_for: float | timedelta | None = None,
        unique_scope: UniqueScope | None = None,
        on_conflict: OnConflict | None = None,
        depends_on: Iterable[Job[Any] | str] | None = None,
        on_dependency_failure: DependencyPolicy | None = None,
    ) -> BoundTask[P, R]:
        """Enqueue options for the next call: ``await task.options(delay=5).enqueue(...)``.

        Args:
            delay: run no earlier than this many seconds from now (by the server's clock).
            at: run no earlier than this absolute time (aware datetime or POSIX seconds).
            job_id: an explicit id; enqueueing an id that exists does nothing (idempotent).
            priority: -100..100, higher first (default: the task's, normally 0).
            group: the fairness group (a tenant, a customer, a request): groups are served
                round-robin and can have concurrency and rate limits.
            max_attempts: overrides the task's default.
            timeout: overrides the task's default.
            result_ttl: overrides the task's default.
            queue: overrides the task's default.
            expires: discard the job, recorded as cancelled with the reason ``Expired``, if
                no run of it has started by then: seconds (or a timedelta) from its enqueue,
                by the server's clock, or an aware datetime. A retry due after it is
                discarded too.
            unique: at most one job of this task with these arguments at a time (its key: the
                task name and a hash of the arguments' canonical JSON); see docs/unique.md.
            unique_key: at most one job with this key at a time (implies ``unique``).
            unique_for: the lock's TTL (default one hour), independent of result retention.
            unique_scope: how long the lock is held: ``"queued"`` while the job waits,
                ``"running"`` (default) while it waits or runs, ``"ttl"`` until the TTL ends.
            on_conflict: when the key is held by another job: ``"existing"`` (default)
                returns that job; ``"replace"`` gives it this call's arguments while it
                still waits; ``"debounce"`` also pushes its due time to this call's delay
                from now (needs ``delay=`` or ``at=``).
            depends_on: jobs (or ids on its queue) to wait for (docs/workflows.md).
            on_dependency_failure: ``"cancel"`` (default), ``"run"`` or ``"fail"`` (same).
        """
        opts = JobOptions(
            delay=to_seconds(delay, "delay"),
            at=at,
            job_id=None if job_id is None else check_job_id(job_id),
            priority=None if priority is None else check_priority(priority),
            max_attempts=None if max_attempts is None else check_attempts(max_attempts),
            timeout=to_seconds(timeout, "timeout"),
            result_ttl=to_seconds(result_ttl, "result_ttl"),
            queue=None if queue is None else check_name("queue name", queue),
            group=None if group is None else check_group(group),
            expires=_expires(expires),
            unique=unique_options(
                unique,
                unique_key,
                unique_for,
                unique_scope,
                on_conflict,
                delay is not None or at is not None,
            ),
            depends_on=dependency_refs(depends_on),
            on_dependency_failure=check_policy(on_dependency_failure),
        )
        if opts.delay is not None and opts.at is not None:
            raise ConfigurationError("give delay= or at=, not both")
        exp, delay_s = opts.expires, opts.delay
        if isinstance(exp, float) and delay_s is not None and exp <= delay_s:
            raise ConfigurationError("expires= must be later than delay=: the job could never run")
        if opts.at is not None:
            at_to_ms(opts.at)
        return BoundTask(self, opts)

    def call(self, *args: P.args, **kwargs: P.kwargs) -> Call[R]:
        """This task with its arguments bound, for batches and chains (checked like enqueue)."""
        return Call(self, args, dict(kwargs), self.builder.defaults)

    async def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job[R]:
        """Enqueue one job; returns once it is stored.

        Raises:
            TypeError: the arguments do not fit the function's signature.
            SerializationError / PayloadTooLarge: the arguments cannot be stored.
            ServerUnavailable: Redis could not be reached.
        """
        return await enqueue_one(self, self.builder.defaults, args, kwargs)

    async def enqueue_many(
        self, calls: Iterable[Mapping[str, Any] | tuple[tuple[Any, ...], Mapping[str, Any]]]
    ) -> list[Job[R]]:
        """Enqueue many jobs of this task in one round trip.

        Args:
            calls: for each job, a mapping of keyword arguments, or an ``(args, kwargs)`` pair.
        """
        return await enqueue_calls(self, self.builder.defaults, calls)

    def record_of(self, call: Call[R], queue: str, job_id: str) -> JobRecord:
        """The record ``call`` (of this task) is stored as, on ``queue`` with id ``job_id``
        (a workflow's steps are stored by ``lua/deps.lua``, not by ``enqueue``)."""
        return self.builder.record(call.opts, call.args, call.kwargs, queue, None, job_id)


def _expires(value: datetime | float | timedelta | None) -> datetime | float | None:
    """``expires=`` as stored in JobOptions (hashable): seconds, or an aware datetime."""
    if value is None or isinstance(value, datetime):
        if value is not None:
            expiry_option(value)  # checks it is aware
        return value
    return to_seconds(value, "expires")


async def enqueue_one(
    task: Task[P, R], opts: JobOptions, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> Job[R]:
    """Enqueue one job of ``task`` with ``opts`` (``task.enqueue``, ``BoundTask.enqueue``)."""
    builder, app = task.builder, task.app
    builder.sig.check(args, kwargs)
    sharded = app.queues.sharded.get(opts.queue or task.queue)
    if sharded is not None:  # a sharded queue: the job's shard (docs/scaling.md)
        opts = on_shard(sharded, opts, task.name, args, kwargs)
    queue = app.queue(opts.queue or task.queue)
    if opts.depends_on:
        record = builder.record(opts, args, kwargs, queue.name)
        conv = task.result_converter
        job: Job[R] = await enqueue_dependent(app, queue.name, record, opts, conv)
        return job
    if opts.unique is not None:
        return (await _enqueue_unique(task, opts, [(args, kwargs)], queue.name))[0]
    if opts.job_id is not None and await already_kept(app, queue.name, opts.job_id):
        # a parent run again from the top enqueues a child it has the result of: not again
        return Job(queue, opts.job_id, task.result_converter)
    record = builder.record(opts, args, kwargs, queue.name)
    return (await store_jobs(queue, [record], task.result_converter))[0]


async def _enqueue_unique(
    task: Task[P, R],
    opts: JobOptions,
    calls: Sequence[tuple[tuple[Any, ...], Mapping[str, Any]]],
    queue_name: str,
) -> list[Job[R]]:
    """Enqueue unique jobs in order (see ``_queue/unique.enqueue_unique``)."""
    spec = opts.unique
    assert spec is not None
    keys = [spec.key or derived_key(task.name, a, kw) for a, kw in calls]

    def record(i: int, job_id: str | None = None) -> JobRecord:
        args, kwargs = calls[i]
        r = task.builder.record(opts, args, kwargs, queue_name, job_id=job_id)
        return JobRecord(r.id, r.payload, r.template, keys[i])

    records = [record(i) for i in range(len(calls))]
    return await enqueue_unique(
        task.app.queue(queue_name), records, spec, record, task.result_converter
    )


async def enqueue_calls(
    task: Task[P, R], opts: JobOptions, calls: Iterable[ManyCall]
) -> list[Job[R]]:
    """Enqueue many jobs of ``task`` with ``opts`` (``enqueue_many``), in one round trip per
    queue."""
    sharded = task.app.queues.sharded.get(opts.queue or task.queue)
    if sharded is not None:  # each shard's calls in one round trip of their own
        split = [split_call(call) for call in calls]
        parts = spread(sharded, opts, task.name, split)
        done = await asyncio.gather(
            *(enqueue_calls(task, o, [split[i] for i in idx]) for o, idx in parts)
        )
        jobs: list[Job[R]] = [None] * len(split)  # type: ignore[list-item]
        for (_, idx), part in zip(parts, done, strict=True):
            for i, job in zip(idx, part, strict=True):
                jobs[i] = job
        return jobs
    queue = task.app.queue(opts.queue or task.queue)
    builder = task.builder
    if opts.unique is not None:
        pairs = [split_call(call) for call in calls]
        for args, kwargs in pairs:
            builder.sig.check(args, kwargs)
        return await _enqueue_unique(task, opts, pairs, queue.name)
    if task.limits:  # a template per job (its limit keys); coalesced in one round trip
        one = [enqueue_one(task, opts, *split_call(c)) for c in calls]
        return list(await asyncio.gather(*one))
    template = builder.template(opts)
    pairs = builder.pairs(queue.name, template.options, calls)
    return await store_run(queue, template, pairs, task.result_converter)


class BoundTask(Generic[P, R]):
    """A task with enqueue options bound, from ``task.options(...)``."""

    __slots__ = ("opts", "task")

    def __init__(self, task: Task[P, R], opts: JobOptions) -> None:
        self.task = task
        self.opts = opts

    def call(self, *args: P.args, **kwargs: P.kwargs) -> Call[R]:
        """The task with these options and arguments bound, for batches and chains."""
        return Call(self.task, args, dict(kwargs), self.opts)

    async def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job[R]:
        """Enqueue one job with the bound options (see ``Task.enqueue``)."""
        return await enqueue_one(self.task, self.opts, args, kwargs)

    async def enqueue_many(
        self, calls: Iterable[Mapping[str, Any] | tuple[tuple[Any, ...], Mapping[str, Any]]]
    ) -> list[Job[R]]:
        """Enqueue many jobs with the bound options in one round trip (``job_id`` is not
        allowed here: each job gets its own id)."""
        if self.opts.job_id is not None or self.opts.depends_on:
            raise ConfigurationError("job_id= and depends_on= name one job: use enqueue()")
        return await enqueue_calls(self.task, self.opts, calls)


class Call(Generic[R]):
    """A task call with its arguments bound, from ``task.call(...)``; checked against the
    task's signature like ``enqueue``. Used for batches, callbacks and chains."""

    __slots__ = ("args", "kwargs", "opts", "task")

    def __init__(
        self,
        task: Task[Any, R],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        opts: JobOptions,
    ) -> None:
        task.builder.sig.check(args, kwargs)
        self.task = task
        self.args = args
        self.kwargs = kwargs
        self.opts = opts
        if opts.unique is not None:
            # a batch's members and a chain's steps are stored with the batch, all or none:
            # a lock held elsewhere would leave a hole in it
            raise ConfigurationError(
                "unique jobs cannot be batch members or chain steps: enqueue them on their own"
            )

    def __repr__(self) -> str:
        return f"<Call {self.task.name}(*{self.args!r}, **{self.kwargs!r})>"

    def then(
        self, task: Task[Concatenate[R, P2], R2], *args: P2.args, **kwargs: P2.kwargs
    ) -> Chain[R2]:
        """Run ``task`` with this call's result as its first argument once this call's job
        has succeeded (if it fails for good, ``task`` never runs)."""
        return Chain([self, Call(task, (None, *args), dict(kwargs), JobOptions())])


#: the most steps one chain may have (``Chain.then`` refuses one more): storing a chain is one
#: round trip of about three script calls per step, and a failure cancels the steps after it
#: in one script
MAX_CHAIN_STEPS: Final = 100


class Chain(Generic[R]):
    """Calls run one after another, each fed the result of the one before:
    ``a.call(x).then(b).then(c)``; ``R`` is the last call's result type.

    Each link between two steps is a batch (``on_failure="fail"``) whose one sub-job is the
    earlier step and whose callback is the later one, so a step runs exactly once after the
    step before it succeeded, and a step that fails for good cancels every step after it.
    """

    __slots__ = ("calls",)

    def __init__(self, calls: list[Call[Any]]) -> None:
        if len(calls) > MAX_CHAIN_STEPS:
            raise ConfigurationError(f"a chain has at most {MAX_CHAIN_STEPS} steps")
        self.calls = calls

    def __repr__(self) -> str:
        return f"<Chain {' -> '.join(c.task.name for c in self.calls)}>"

    def then(
        self, task: Task[Concatenate[R, P2], R2], *args: P2.args, **kwargs: P2.kwargs
    ) -> Chain[R2]:
        """Add a step: ``task`` runs with the last step's result as its first argument once
        that step has succeeded.

        Raises:
            ConfigurationError: the chain would have more than ``MAX_CHAIN_STEPS`` steps.
        """
        return Chain([*self.calls, Call(task, (None, *args), dict(kwargs), JobOptions())])

    async def enqueue(self) -> Job[R]:
        """Store every step in one round trip; returns the handle of the last (its result is
        the chain's; if a step fails for good, the steps after it are cancelled)."""
        job: Job[R] = await self.calls[0].task.app.enqueue_chain(self.calls)
        return job


def check_backoff(backoff: object) -> Backoff | None:
    """A ``backoff=`` option: a ``Backoff`` or None (a bare number would crash the job
    wrapper at the first failure, long after the mistake)."""
    if backoff is not None and not isinstance(backoff, Backoff):
        raise ConfigurationError(
            f"backoff must be a Backoff(base=..., factor=..., max=...), not {backoff!r}"
        )
    return backoff
