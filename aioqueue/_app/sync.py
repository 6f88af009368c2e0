"""The blocking producer, ``app.sync()``: enqueue, results, cancellation and inspection from
code without an event loop (Django and Flask views, scripts, management commands).

It runs the same Lua scripts as the async producer, on redis-py's blocking client, and builds
job records with the same code (the tasks' signature checks and templates, the App's codec),
so a job enqueued here is the same job, with the same guarantees. No event loop runs behind it.
``SyncJob.result()`` waits on the queue's ``done`` channel over a pub/sub connection of its
own (re-checking the record every few seconds, so a lost notification only delays it),
bounded by its timeout.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

import redis
import redis.exceptions as rexc
from redis.retry import Retry

from .._model.checks import check_attempts, check_name, new_job_id, to_seconds
from .._model.exceptions import (
    ClosedError,
    ConfigurationError,
    JobNotFound,
    ResultTimeout,
    ServerUnavailable,
)
from .._model.job import JobInfo, JobState, typed_result
from .._model.keys import QueueKeys
from .._model.record import JobOptions, JobRecord, Template
from .._model.timeutil import Deadline
from .._queue import tasktable as tasktable
from .._queue.core import job_info_from
from .._queue.queue import state_counts, watched_outcome
from .._queue.sharded import on_shard
from .._store.clock import use_virtual_clock
from .._store.cluster import is_cluster
from .._store.connect import blocking_client, pool_options
from .._store.syncdoor import BlockingScripts, blocking_call, load_library_blocking
from .task import BoundTask, Task

if TYPE_CHECKING:
    from .owners import ProducingApp

P = ParamSpec("P")
R = TypeVar("R")

RECHECK_INTERVAL = 5.0  # re-read the record this often while waiting for a result
POLL_INTERVAL = 0.2  # when this ACL user may not subscribe


class SyncClient:
    """A blocking producer for an App, from ``app.sync()``; safe to share between threads.

    Nothing touches the network before the first call; ``close()`` (or ``with``) releases
    its connections. It needs no open App: only the App's settings and tasks.
    """

    def __init__(self, app: ProducingApp, client: object = None) -> None:
        self.app = app
        # the client the App was given, if any (its one endpoint: see blocking_client)
        self._given = client
        self.closed = False
        self._redis: redis.Redis | None = None
        self._doors: dict[str, BlockingScripts] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<SyncClient prefix={self.app.prefix!r}{' closed' if self.closed else ''}>"

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool; the client refuses further calls."""
        with self._lock:
            self.closed = True
            if self._redis is not None:
                self._redis.close()
                pool = getattr(self._redis, "connection_pool", None)  # None: a cluster
                if pool is not None:
                    pool.close()  # and the sentinels', if any
                self._redis = None

    @property
    def redis(self) -> redis.Redis:
        """The blocking client (made on first use)."""
        client = self._redis
        if client is None:
            with self._lock:
                if self.closed:
                    raise ClosedError("this SyncClient was closed; call app.sync() for a new one")
                if self._redis is None:
                    app = self.app
                    opts = pool_options(
                        app.url, app.max_connections, app.redis_options, Retry, app.socket_timeout
                    )
                    # the App's one endpoint: its URL, or the client it was given
                    self._redis = blocking_client(self.app.url, self._given, opts)
                    if self.app.testing:
                        use_virtual_clock(self._redis)
                    if not is_cluster(self._redis):
                        # FCALLs from now on (EVALSHAs if the library cannot be loaded now)
                        with contextlib.suppress(ServerUnavailable):
                            load_library_blocking(self._redis)
                client = self._redis
        return client

    def door(self, queue: str) -> BlockingScripts:
        """The blocking door to ``queue``'s keys on this client (an internal, left out of the
        API reference)."""
        door = self._doors.get(queue)
        if door is None or door.client is not self.redis:
            door = self._doors[queue] = BlockingScripts(
                self.redis, QueueKeys(self.app.prefix, check_name("queue name", queue))
            )
        return door

    # ------------------------------------------------------------------ enqueue
    def enqueue(
        self, task: Task[P, R] | BoundTask[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> SyncJob[R]:
        """Enqueue one job of ``task`` (or of ``task.options(...)``), checked against its
        signature like ``await task.enqueue(...)``; returns once it is stored.

        Raises:
            TypeError: the arguments do not fit the function's signature.
            SerializationError / PayloadTooLarge: the arguments cannot be stored.
            ServerUnavailable: Redis could not be reached.
        """
        t, opts = (
            (task.task, task.opts) if isinstance(task, BoundTask) else (task, task.builder.defaults)
        )
        _no_unique(opts)
        t.builder.sig.check(args, kwargs)
        queue = self._target(opts.queue or t.queue, opts, t.name, args, kwargs)
        record = t.builder.record(opts, args, kwargs, queue)
        self._store(queue, t.name, (record.id,), lambda door: door.enqueue([record]))
        return SyncJob(self, queue, record.id, t.result_converter)

    def enqueue_many(
        self,
        task: Task[P, R] | BoundTask[P, R],
        calls: Iterable[Mapping[str, Any] | tuple[tuple[Any, ...], Mapping[str, Any]]],
    ) -> list[SyncJob[R]]:
        """Enqueue many jobs of ``task`` in one round trip (see ``Task.enqueue_many``)."""
        if isinstance(task, BoundTask):
            if task.opts.job_id is not None:
                raise ConfigurationError(
                    "job_id= names one job; it cannot be used with enqueue_many"
                )
            t, opts = task.task, task.opts
        else:
            t, opts = task, task.builder.defaults
        _no_unique(opts)
        queue = self._target(opts.queue or t.queue, opts, t.name)  # a sharded queue: one shard
        template = t.builder.template(opts)
        pairs = t.builder.pairs(queue, template.options, calls)
        if not pairs:
            return []
        ids = tuple(pairs[::2])
        self._store(queue, t.name, ids, lambda door: door.enqueue_run(template, pairs))
        convert = t.result_converter
        return [SyncJob(self, queue, job_id, convert) for job_id in ids]

    def enqueue_by_name(
        self,
        queue: str,
        task: str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        allow_unknown: bool = False,
    ) -> SyncJob[Any]:
        """Enqueue a job by task name, for producers that do not import the task's code (see
        ``Queue.enqueue``: the task's declared defaults, ``UnknownTask`` unless
        ``allow_unknown``; per-job options are not offered here: give the task its own)."""
        if not isinstance(task, str) or not task:
            raise ConfigurationError(f"task name must be a non-empty string, not {task!r}")
        if not isinstance(args, list | tuple):
            raise ConfigurationError(f"args must be a list or tuple, not {type(args).__name__}")
        queue = self._target(queue, JobOptions(), task)
        door = self.door(queue)
        reply = door.run("tasks", tasktable.get_args(door.base, task))
        known = tasktable.parse(queue, task, reply).check(allow_unknown)
        attempts, priority = (
            (self.app.max_attempts, 0) if known is None else (known.max_attempts, known.priority)
        )
        template = Template(task, check_attempts(attempts), -1, -1, priority, "")
        job_id = new_job_id()
        payload = self.app.codec.dump_args(
            queue, job_id, task, tuple(args), dict(kwargs or {}), template.options
        )
        record = JobRecord(job_id, payload, template)
        self._store(queue, task, (job_id,), lambda door: door.enqueue([record]))
        return SyncJob(self, queue, job_id)

    def _target(
        self,
        queue: str,
        opts: JobOptions,
        task: str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """``queue``, or the shard of it a job goes to if it is sharded (docs/scaling.md)."""
        sharded = self.app.queues.sharded.get(queue)
        if sharded is None:
            return queue
        return on_shard(sharded, opts, task, args, kwargs or {}).queue or queue

    def _store(self, queue: str, task: str, ids: tuple[str, ...], store: Any) -> None:
        claim = self.app.codec.claim
        if claim is not None and claim.pending:  # the store is async: refused (_claimcheck)
            claim.refuse_pending(queue, ids)
        door = self.door(queue)
        hooks = self.app.hooks
        if hooks.on_enqueue:  # the App's before/after-enqueue hooks, as for async producers
            event = hooks.before(queue, task, ids)
            store(door)
            hooks.after(event)
        else:
            store(door)

    # ------------------------------------------------------------------ jobs and queues
    def job(self, job_id: str, queue: str | None = None) -> SyncJob[Any]:
        """A handle on a job by id (no I/O); ``queue`` defaults to the App's."""
        return SyncJob(self, queue or self.app.default_queue, job_id)

    def cancel_jobs(self, job_ids: Sequence[str], queue: str | None = None) -> int:
        """Cancel jobs of a queue (see ``Queue.cancel_jobs``): how many were cancelled at once."""
        if not job_ids:
            return 0
        door = self.door(queue or self.app.default_queue)
        now, _ = door.cancel(list(job_ids), self.app.dead_ttl_ms)
        return now

    def counts(self, queue: str | None = None) -> dict[str, int]:
        """Jobs per state of a queue: scheduled, queued, active, failed (see ``Queue.counts``)."""
        door = self.door(queue or self.app.default_queue)
        return state_counts(door.lane_counts(), door.group_counts())


class SyncJob(Generic[R]):
    """A handle on an enqueued job for blocking code; ``R`` is the task's return type."""

    __slots__ = ("_client", "_convert", "id", "queue")

    def __init__(
        self,
        client: SyncClient,
        queue: str,
        job_id: str,
        convert: Callable[[Any], Any] | None = None,
    ) -> None:
        self._client = client
        self.queue = queue
        self.id = job_id
        self._convert = convert  # the task's result decoder, for jobs its Task enqueued

    def __repr__(self) -> str:
        return f"SyncJob(id={self.id!r}, queue={self.queue!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SyncJob) and (other.id, other.queue) == (self.id, self.queue)

    def __hash__(self) -> int:
        return hash((self.id, self.queue))

    def state(self) -> JobState:
        """The job's current state. Raises JobNotFound when there is no record."""
        state, _, _ = self._client.door(self.queue).watch(self.id, register=False)
        if not state:
            raise JobNotFound(self.id)
        return JobState(state)

    def info(self) -> JobInfo:
        """The job's stored record. Raises JobNotFound when there is none."""
        raw = self._client.door(self.queue).job_record(self.id)
        return job_info_from(self._client.app.codec, self.queue, self.id, raw)

    def cancel(self) -> bool:
        """Cancel the job (see ``Job.cancel``): True if it was cancelled at once."""
        return self._client.cancel_jobs([self.id], self.queue) == 1

    def result(self, timeout: float | timedelta | None = None) -> R:
        """Block until the job finishes and return its result, woken by the queue's ``done``
        notifications (not polling), for at most ``timeout`` seconds.

        Raises:
            JobFailed / JobCancelled: the job was dead-lettered or cancelled.
            ResultTimeout: it did not finish in time.
            JobNotFound: no record of the job.
            SerializationError: the result does not fit the task's return annotation (read
                by it for a job its Task enqueued).
        """
        remaining = Deadline(to_seconds(timeout, "timeout"), f"job {self.id!r}").remaining
        client = self._client
        door = client.door(self.queue)
        codec = client.app.codec

        pubsub = client.redis.pubsub()  # type: ignore[no-untyped-call]
        channel = door.keys.done_channel
        try:
            cap = _subscribe(pubsub, channel, remaining)
            while True:
                # subscribed before the waiter is marked: no finish is missed
                done, value = watched_outcome(
                    codec, self.queue, self.id, door.watch(self.id, register=True)
                )
                if done:
                    return typed_result(self.id, self._convert, value)  # type: ignore[no-any-return]
                until = time.monotonic() + remaining(cap)
                while (left := until - time.monotonic()) > 0:
                    if cap == POLL_INTERVAL:
                        time.sleep(left)
                        break
                    msg = blocking_call(partial(pubsub.get_message, timeout=left))
                    if msg and msg["type"] == "message" and msg["data"] == self.id.encode():
                        break
        finally:
            pubsub.close()


def _subscribe(pubsub: Any, channel: str, remaining: Any) -> float:
    """Subscribe and wait for the server's confirmation; the re-check interval (polling's
    when this ACL user may not subscribe)."""
    try:
        blocking_call(lambda: pubsub.subscribe(channel))
        try:
            until = time.monotonic() + remaining(RECHECK_INTERVAL)
        except ResultTimeout:  # no time to wait: the record is still checked once
            return POLL_INTERVAL
        while (left := until - time.monotonic()) > 0:
            msg = blocking_call(partial(pubsub.get_message, timeout=left))
            if msg and msg["type"] == "subscribe":
                return RECHECK_INTERVAL
        return POLL_INTERVAL
    except rexc.ResponseError:  # NOPERM: waiters re-check on their own instead
        return POLL_INTERVAL


def _no_unique(opts: JobOptions) -> None:
    """The blocking producer does not resolve unique jobs' conflicts: refuse them clearly."""
    if opts.unique is not None:
        raise ConfigurationError(
            "unique jobs are enqueued with await task.options(...).enqueue(...), not app.sync()"
        )
