"""App: configuration, the connection pool, the task registry and ``@app.task``."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

import redis.asyncio as aioredis

from .._model.checks import check_attempts, check_int, check_name, check_prefix, to_seconds
from .._model.claimcheck import ClaimCheck, PayloadStore
from .._model.codec import Codec
from .._model.compress import Compression
from .._model.cron import MissedPolicy
from .._model.exceptions import ConfigurationError
from .._model.isolation import Isolation
from .._model.limits import DEFAULT_DEAD_TTL_MS, DEFAULT_MAX_ATTEMPTS
from .._model.retrypolicy import ExcTypes, TaskPolicy
from .._model.serialize import Serializer, get_serializer
from .._queue.deps import DependencyPolicy
from .._queue.events import JobEvent, JobEventKind, iterate_events
from .._queue.queue import Queue
from .._queue.sharded import ShardedQueue
from .._store.connect import resolve_url
from .._store.durable import durability_setting
from . import options as settings
from .batch import enqueue_chain, open_batch
from .hooks import EH, LH, MW, Hooks
from .lifecycle import Lifecycle
from .limiters import Held, Limiter, Limiters
from .queues import Queues
from .results import ResultWaiter
from .scheddecl import TaskT, cron_decorator
from .schedules import Schedules, make_spec
from .signals import signal_jobs
from .sync import SyncClient
from .task import Backoff, Task, check_backoff
from .taskdecl import TaskDecorator, register_task
from .workflow import Workflow

if TYPE_CHECKING:
    from .._model.batchinfo import FailurePolicy
    from .._model.job import Job
    from .batch import Batch
    from .task import Call

P = ParamSpec("P")
R = TypeVar("R")


class App:
    """An aioqueue application: one connection pool shared by producers and workers.

    Args:
        url: ``redis://``, ``rediss://`` (TLS) or ``unix://`` URL, with credentials for ACL
            users; default ``$AIOQUEUE_REDIS_URL``, else ``redis://localhost:6379/0``.
        prefix: first part of every key (apps with different prefixes never see each other's).
        queue: the default queue of tasks that name none.
        serializer: ``"json"`` (default), ``"pickle"`` (explicit opt-in: unsafe if anyone
            untrusted can write to Redis), or a Serializer object.
        max_payload_bytes: refuse arguments over this once serialised and compressed (0: none).
        lease: seconds a consumer holds a job before another gets it (workers renew it).
        heartbeat: seconds between a worker's heartbeats (default: 2, or a third of the lease
            if shorter; at most half the lease). A worker that misses three in a row is dead:
            its jobs are handed back without waiting for their leases.
        result_ttl: seconds results and completed job records are kept (None: forever, 0: no).
        dead_ttl: seconds dead-lettered jobs are kept (None: forever).
        max_attempts: default for tasks that do not set their own.
        timeout: default for tasks that do not set their own.
        backoff: default for tasks that do not set their own.
        max_connections: size of the connection pool; callers beyond it wait for a free
            connection (up to 30 s).
        socket_timeout: seconds a reply to aioqueue's own calls may take before the connection
            counts as dead (blocking waits stay well below it; asyncio timeouts enforce it).
        signing_key: sign with HMAC-SHA256 (at least 16 bytes) every job's payload with its
            options, and every result, each bound to its prefix, queue, job and task; workers
            then dead-letter unsigned or tampered jobs (reason ``BadSignature``), and reading
            a tampered result raises ``BadSignature``. A list rotates keys: the first signs.
        verify_keys: more keys accepted when verifying (key rotation; docs/security.md).
        encryption_key: encrypt payloads and results, AES-GCM (``aioqueue[encryption]``); a list
            rotates keys as for signing_key (docs/security.md).
        compression: compress large values: ``"zstd"``, ``"lz4"``, a ``Compression`` (tasks.md).
        payload_store: claim-check large payloads: a ``PayloadStore`` or a ``ClaimCheck``.
        allow_unsigned_pickle: let ``serializer="pickle"`` run without a ``signing_key``
            (refused otherwise: unsigned pickle is code execution for whoever writes to Redis).
        redis_options: extra keyword arguments for ``redis.asyncio.Redis.from_url``.
        wait_replicas: durability mode (docs/scaling.md): after each enqueue and each
            completion, wait until this many replicas acknowledged the write (``WAIT``);
            ``enqueue`` and the pull API's ``complete`` raise ``NotReplicated`` when fewer
            did within ``wait_timeout``, a worker logs a warning. 0 (default): off.
        wait_timeout: seconds to wait for the replicas' acknowledgement.
        wait_aof: wait with ``WAITAOF`` instead: the write fsynced to the append-only file
            of the primary and of ``wait_replicas`` replicas (needs ``appendonly yes``).
        client: a redis-py asyncio client you configured (``Redis``, e.g. on a Sentinel's
            pool, or ``RedisCluster``), or a ``ConnectionPool``, used instead of ``url`` and
            never closed by the App (``app.sync()`` still connects to ``url``).
        testing: test mode: the scripts' clock honours the testing kit's ``VirtualClock``
            (docs/testing.md); every other App ignores it. Never in production.

    Use as ``async with App(...) as app:``; nothing touches the network before that.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        prefix: str = "aq",
        queue: str = "default",
        serializer: str | Serializer = "json",
        max_payload_bytes: int = 1_000_000,
        lease: float | timedelta = 30.0,
        heartbeat: float | timedelta | None = None,
        result_ttl: float | timedelta | None = 86_400.0,
        dead_ttl: float | timedelta | None = DEFAULT_DEAD_TTL_MS / 1000,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float | timedelta | None = None,
        backoff: Backoff | None = None,
        max_connections: int = 100,
        socket_timeout: float | timedelta = 30.0,
        signing_key: str | bytes | Sequence[str | bytes] | None = None,
        verify_keys: Sequence[str | bytes] = (),
        encryption_key: str | bytes | Sequence[str | bytes] | None = None,
        compression: str | Compression | None = None,
        payload_store: PayloadStore | ClaimCheck | None = None,
        allow_unsigned_pickle: bool = False,
        redis_options: Mapping[str, Any] | None = None,
        wait_replicas: int = 0,
        wait_timeout: float | timedelta = 1.0,
        wait_aof: bool = False,
        client: aioredis.Redis | aioredis.RedisCluster | aioredis.ConnectionPool | None = None,
        testing: bool = False,
    ) -> None:
        self.url = resolve_url(url)
        self.prefix = check_prefix(prefix)
        self.default_queue = check_name("queue name", queue)
        self.serializer = get_serializer(serializer)
        self.max_payload_bytes = check_int(max_payload_bytes, 0, "max_payload_bytes", " (0: none)")
        #: seconds of a lease, and between a worker's heartbeats
        self.lease, self.heartbeat = settings.lease_and_heartbeat(lease, heartbeat)
        self.result_ttl_default_ms, self.dead_ttl_ms = settings.retention_ms(result_ttl, dead_ttl)
        self.max_attempts = check_attempts(max_attempts)
        self.timeout = to_seconds(timeout, "timeout")
        self.backoff = check_backoff(backoff) or Backoff()
        self.max_connections = check_int(max_connections, 2, "max_connections")
        self.redis_options = dict(redis_options or {})
        self.socket_timeout = st = settings.socket_timeout_s(self.redis_options, socket_timeout)
        self.durability = durability_setting(wait_replicas, wait_timeout, wait_aof, st)
        #: how job records are encoded and decoded (arguments, options, results, errors)
        keys = (signing_key, verify_keys, encryption_key)
        self.codec = Codec.of(self, keys, compression, payload_store)
        settings.check_pickle(self.serializer, self.codec.signer is not None, allow_unsigned_pickle)
        self.tasks: dict[str, Task[Any, Any]] = {}
        #: lifecycle hooks, middleware and enqueue hooks (see ``on_startup`` and the others)
        self.hooks = Hooks()
        #: its queues by name (``app.queue(name)`` is the way to one)
        self.queues = Queues(self)
        #: periodic schedules: declared in code, and managed in Redis at run time
        self.schedules = Schedules(self)
        #: named limiters by name (``app.limiter``); ``.set()`` and ``.state()`` at run time
        self.limiters = Limiters(self)
        self._life = Lifecycle(self, settings.given_client(client))
        self.testing = bool(testing)

    def __repr__(self) -> str:
        state = self._life.state.name.lower()
        return f"<App prefix={self.prefix!r} queue={self.default_queue!r} {state}>"

    async def open(self) -> None:
        """Create the connection pool, check that the server answers and load the scripts.

        Raises:
            ServerUnavailable: the server cannot be reached, or is loading its data (retry).
            ConfigurationError: the server refused: bad credentials, a DB index out of range,
                an ACL user without a command aioqueue needs (retrying cannot help).
            ClosedError: the App was closed.
        """
        await self._life.open()

    def sync(self) -> SyncClient:
        """The App's blocking producer, for code without an event loop (Django, Flask,
        scripts): ``app.sync().enqueue(task, ...)``. No ``open()`` needed: its own blocking
        pool connects on first use. One per App, shared by threads, until ``close()``d."""
        return self._life.sync()

    async def aclose(self) -> None:
        """Close the connection pool. The App cannot be opened again."""
        await self._life.aclose()

    def rebind(self, url: str, prefix: str, *, testing: bool) -> None:
        """Make this unopened or closed App a new unopened one on ``url``, ``prefix`` and mode,
        keeping its tasks, hooks, declared schedules, sharded queues and codec (for
        ``aioqueue.testing.bind``; no I/O). Raises ConfigurationError if the App is open."""
        self._life.rebind(url, prefix, testing)

    async def __aenter__(self) -> App:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def redis(self) -> aioredis.Redis:
        """The shared client (and its pool). Raises ClosedError unless the App is open."""
        return self._life.redis

    @property
    def result_waiter(self) -> ResultWaiter:
        """The App's shared listener for result notifications (created on first use)."""
        return self._life.result_waiter

    def on_startup(self, fn: LH) -> LH:
        """Register ``async def hook(state: State) -> None`` to run when a worker starts, before
        it fetches a job, in registration order; its tasks read what it stores in ``state``
        from ``current_job().state``. If it raises, the worker stops (``StartupFailed``)."""
        return self.hooks.add_async(self.hooks.startup, fn, "a startup hook")

    def on_shutdown(self, fn: LH) -> LH:
        """Register ``async def hook(state: State) -> None`` to run when a worker stops, after
        its last job, in reverse registration order. What it raises is logged."""
        return self.hooks.add_async(self.hooks.shutdown, fn, "a shutdown hook")

    def middleware(self, fn: MW) -> MW:
        """Register ``async def m(job: JobContext, call_next) -> Any`` around every run of a
        job in workers made after this call: it must ``return await call_next()`` (the result,
        which it may replace). The first registered is outermost. What it raises fails the
        attempt like the task's own exception."""
        return self.hooks.add_async(self.hooks.middleware, fn, "a middleware")

    def before_enqueue(self, fn: EH) -> EH:
        """Register ``def hook(event: EnqueueEvent) -> None`` (a plain function) to run in this
        App's producers, async and blocking, before jobs are stored; raising refuses the
        enqueue (nothing is stored)."""
        return self.hooks.add_enqueue_hook(self.hooks.before_enqueue, fn)

    def after_enqueue(self, fn: EH) -> EH:
        """Register ``def hook(event: EnqueueEvent) -> None`` (a plain function) to run once
        jobs are stored; what it raises is logged, not raised."""
        return self.hooks.add_enqueue_hook(self.hooks.after_enqueue, fn)

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
        declare = functools.partial(self.schedule, tz=tz, args=args, kwargs=kwargs, name=name)
        return cron_decorator(declare, expression, missed=missed, jitter=jitter, grace=grace)

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
        spec = (cron, every, tz, args, kwargs, name, missed, jitter, grace, queue)
        self.schedules.declare(make_spec(self, task, *spec, declared=True))

    @overload
    def task(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> Task[P, R]: ...

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        timeout: float | timedelta | None = None,
        backoff: Backoff | None = None,
        result_ttl: float | timedelta | None = None,
        keep_result: float | timedelta | bool | None = None,
        priority: int = 0,
        isolation: Isolation = None,
        retry_on: type[BaseException] | ExcTypes | None = None,
        dont_retry_on: type[BaseException] | ExcTypes | None = None,
        capture_logs: int | str | None = None,
        limits: Sequence[str] = (),
    ) -> TaskDecorator: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        timeout: float | timedelta | None = None,
        backoff: Backoff | None = None,
        result_ttl: float | timedelta | None = None,
        keep_result: float | timedelta | bool | None = None,
        priority: int = 0,
        isolation: Isolation = None,
        retry_on: type[BaseException] | ExcTypes | None = None,
        dont_retry_on: type[BaseException] | ExcTypes | None = None,
        capture_logs: int | str | None = None,
        limits: Sequence[str] = (),
    ) -> Task[Any, Any] | TaskDecorator:
        """Register a job function (async, or sync to run in a thread pool).

        Use bare (``@app.task``) or with options (``@app.task(max_attempts=5, timeout=30)``).

        Args:
            name: the name jobs are stored under (default: the function's ``__name__``);
                unique within the App.
            queue: the queue its jobs go to (default: the App's).
            max_attempts: runs before a failing job is dead-lettered.
            timeout: seconds one run may take before it is cancelled and counts as failed.
            backoff: delay between failed attempts (default: the App's).
            result_ttl: seconds its results are kept (default: the App's).
            keep_result: ``result_ttl`` by another name: seconds (or a timedelta), ``True``
                for good, ``False`` not at all (give this or ``result_ttl``, not both).
            priority: default priority of its jobs, -100..100, higher first.
            retry_on: only these exception types are retried; others dead-letter at once.
            dont_retry_on: these dead-letter at once (as ``NonRetryable`` does; docs/retries.md).
            capture_logs: keep its ``logging`` records of this level up with the job (``ctx.log``).
            limits: names of limiters (``app.limiter``) each of its jobs needs to start.
            isolation: ``"process"``: run in a child a timeout kills (flow-control.md).
        """

        options = (name, queue, max_attempts, timeout, backoff, result_ttl, keep_result, priority)
        policy = TaskPolicy.of(retry_on, dont_retry_on, capture_logs)
        make = functools.partial(Task, self, policy=policy, isolation=isolation)
        register = functools.partial(register_task, self, make, *options, limits)
        return register(fn) if fn is not None else TaskDecorator(register)

    async def batch(
        self,
        calls: Iterable[Call[Any]] | None = None,
        *,
        on_complete: Call[R] | None = None,
        on_failure: FailurePolicy = "continue",
        concurrency: int | None = None,
        priority: int | None = None,
        group: str | None = None,
        queue: str | None = None,
        retention: float | timedelta | None = None,
    ) -> Batch[R]:
        """Start a batch: many sub-jobs, one notification when all are done.

        With ``calls``, the sub-jobs are stored and the batch sealed in one round trip;
        without, add them with ``await batch.add(...)`` as they come, then ``seal()``.

        Args:
            calls: sub-jobs, from ``task.call(...)`` (of any tasks, on any queues).
            on_complete: a job released exactly once when every sub-job has an outcome; it
                can read them with ``await current_job().batch.results()``.
            on_failure: ``"continue"``: the callback runs, failures are listed in the
                results; ``"fail"``: the batch fails, the callback never runs, ``wait()``
                raises BatchFailed; ``"ignore"``: deprecated alias of ``"continue"``.
            concurrency: at most this many sub-jobs run at once (the batch becomes its own
                group; its sub-jobs must then be on the batch's queue).
            priority: priority of sub-jobs that do not set their own.
            group: fairness group of sub-jobs that do not set their own.
            queue: the batch's home queue (default: the callback's, else the App's).
            retention: seconds the batch's record and collected results are kept after it
                ends (default: the App's result_ttl).
        """
        return await open_batch(
            self, calls, on_complete=on_complete, on_failure=on_failure, concurrency=concurrency,
            priority=priority, group=group, queue=queue, retention=retention,
        )  # fmt: skip

    async def enqueue_chain(self, calls: list[Call[Any]]) -> Job[Any]:
        """Store a chain's steps (what ``Chain.enqueue`` asks of its first task's App: the
        chain lives beside the tasks, the batches it is made of above them): an internal,
        left out of the API reference."""
        return await enqueue_chain(calls)

    def workflow(self, name: str, *, on_failure: DependencyPolicy = "cancel") -> Workflow:
        """A new DAG workflow (docs/workflows.md): ``wf.step(name, task.call(...), after=[...])``
        then ``await wf.enqueue()``; ``WorkflowHandle(app, id, queue)`` reads one back."""
        return Workflow(self, name, on_failure)

    def limiter(
        self,
        name: str,
        *,
        rate: tuple[int, float] | None = None,
        burst: int = 1,
        concurrency: int | None = None,
        key: Callable[..., object] | None = None,
    ) -> Limiter:
        """Declare a named limiter once per App: at most ``rate=(n, seconds)`` starts (GCRA,
        ``burst`` at once) and ``concurrency`` running; ``key(*args, **kwargs)``: one limit per
        value. Tasks opt in with ``@app.task(limits=[name])`` (docs/flow-control.md)."""
        return self.limiters.declare(name, rate, burst, concurrency, key)

    def limit(self, *names: str, key: object = None, queue: str | None = None) -> Held:
        """``async with app.limit("stripe", key=customer):`` waits until every named limit
        admits it (rate and concurrency, shared with the jobs that need them)."""
        return Held(self, names, key, queue or self.default_queue)

    async def signal(self, key: str, payload: Any = None, *, queue: str | None = None) -> int:
        """Wake every job waiting for event ``key`` (``ctx.wait_for_event(key)``) with
        ``payload`` as that call's value; ``queue``: only that queue's (default: the App's
        queues). Returns how many woke (docs/workflows.md, "Durable waits and signals")."""
        return await signal_jobs(self, key, payload, queue)

    @overload
    def queue(self, name: str | None = None) -> Queue: ...

    @overload
    def queue(self, name: str | None = None, *, shards: int) -> ShardedQueue: ...

    def queue(self, name: str | None = None, *, shards: int | None = None) -> Queue | ShardedQueue:
        """The queue called ``name`` (default: the App's default queue). No I/O.

        With ``shards=K``, declares it sharded (docs/scaling.md): K sub-queues that tasks
        sent to ``name`` spread over and workers consuming ``name`` take from. Declare it
        the same way in producers and workers (e.g. where the App is made); asking again
        with the same K returns the same ``ShardedQueue``.

        Raises:
            ConfigurationError: ``name`` is not a valid queue name (``""`` included), or is
                declared sharded and asked for without (or with other) ``shards``.
        """
        if name is None:
            name = self.default_queue
        return self.queues.get(name, shards)

    def events(
        self,
        queue: str | None = None,
        *,
        since: str | datetime = "$",
        kinds: Iterable[JobEventKind | str] | None = None,
        block: float = 5.0,
    ) -> AsyncIterator[JobEvent]:
        """Follow a queue's event stream (``queue.set_events()``): an async iterator of
        ``JobEvent`` (``XREAD BLOCK`` on its own connection, ``block`` seconds a call, below
        the socket timeout) that reconnects and goes on after the last event it yielded.
        ``queue``: default the App's; ``since``: ``"$"`` (from now), ``"0"`` (all kept), a
        saved ``JobEvent.position`` or an aware datetime; ``kinds``: only these (default all).
        A bad ``queue``, ``since`` or kind raises ConfigurationError when iteration starts."""
        name = self.queue(queue).name
        if not 0 < block < self.socket_timeout:
            raise ConfigurationError("block must be more than 0 and below the socket timeout")
        return iterate_events(self, name, since, kinds, block)
