"""App: configuration, the connection pool, the task registry and ``@app.task``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast, overload

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry

from .._model.checks import (
    check_attempts,
    check_int,
    check_name,
    check_prefix,
    check_task_name,
    lease_ms,
    retention_seconds,
    to_ms,
    to_seconds,
)
from .._model.claimcheck import ClaimCheck, PayloadStore
from .._model.codec import Codec
from .._model.compress import Compression
from .._model.exceptions import ClosedError, ConfigurationError
from .._model.isolation import Isolation
from .._model.keys import QueueKeys
from .._model.serialize import PickleSerializer, Serializer, get_serializer
from .._queue.deps import DependencyPolicy
from .._queue.events import JobEvent, JobEventKind, iterate_events
from .._queue.queue import Queue
from .._queue.sharded import ShardedQueue
from .._store.connect import adopt, connect, pool_options, resolve_url
from .._store.durable import durability_setting, set_durability
from .._store.hot import close_hot_connection
from .batch import open_batch
from .hooks import HookDecorators, Hooks
from .lifecycle import Rebinding, State
from .results import ResultWaiter
from .scheddecl import ScheduleDecorators
from .schedules import Schedules
from .sync import SyncClient
from .task import Backoff, Task, TaskDecorator, check_backoff
from .workflow import Workflow

if TYPE_CHECKING:
    from .._model.batchinfo import FailurePolicy
    from .batch import Batch, Call

P = ParamSpec("P")
R = TypeVar("R")


class App(HookDecorators, ScheduleDecorators, Rebinding):
    """An aioqueue application: one connection pool shared by producers and workers.

    Args:
        url: ``redis://``, ``rediss://`` (TLS) or ``unix://`` URL, with credentials for ACL
            users; default ``$AIOQUEUE_REDIS_URL``, else ``redis://localhost:6379/0``.
        prefix: first part of every key; two apps with different prefixes never see each
            other's jobs on one server.
        queue: the default queue of tasks that name none.
        serializer: ``"json"`` (default), ``"pickle"`` (explicit opt-in: unsafe if anyone
            untrusted can write to Redis), or a Serializer object.
        max_payload_bytes: refuse arguments over this once serialised and compressed (0: none).
        lease: seconds a consumer holds a job before it is handed out again (workers renew it
            while the job runs).
        heartbeat: seconds between a worker's heartbeats (default: 2, or a third of the lease
            if that is shorter; at most half the lease). A worker that misses three in a row
            is declared dead, and its jobs are handed back without waiting for their leases.
        result_ttl: seconds results and completed job records are kept (None: forever,
            0: not kept).
        dead_ttl: seconds dead-lettered jobs are kept (None: forever).
        max_attempts: default for tasks that do not set their own.
        timeout: default for tasks that do not set their own.
        backoff: default for tasks that do not set their own.
        max_connections: size of the connection pool; callers beyond it wait for a free
            connection (up to 30 s).
        socket_timeout: seconds a reply to aioqueue's own calls may take before the connection
            counts as dead (blocking waits are kept well below it). It is enforced with
            asyncio timeouts around those calls, not redis-py's socket timeout: on Python 3.11
            redis-py's timeout path can swallow a task's cancellation.
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
            pool, or ``RedisCluster``), or a ``ConnectionPool``, to use instead of
            connecting to ``url``; the App does not close it. ``app.sync()`` still
            connects to ``url``.
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
        dead_ttl: float | timedelta | None = 7 * 86_400.0,
        max_attempts: int = 3,
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
        self.lease = lease_ms(lease, minimum_ms=100) / 1000
        hb = to_seconds(heartbeat, "heartbeat")
        if hb is None:
            hb = min(2.0, self.lease / 3)
        elif not 0.05 <= hb <= self.lease / 2:
            raise ConfigurationError("heartbeat must be at least 0.05 s and at most half the lease")
        #: seconds between a worker's heartbeats
        self.heartbeat = hb
        rt = to_seconds(result_ttl, "result_ttl")
        self.result_ttl_default_ms = -1 if rt is None else to_ms(rt, "result_ttl")
        dt = to_seconds(dead_ttl, "dead_ttl")
        self.dead_ttl_ms = 0 if dt is None else max(to_ms(dt, "dead_ttl"), 1)
        self.max_attempts = check_attempts(max_attempts)
        self.timeout = to_seconds(timeout, "timeout")
        self.backoff = check_backoff(backoff) or Backoff()
        self.max_connections = check_int(max_connections, 2, "max_connections")
        self.redis_options = dict(redis_options or {})
        st = to_seconds(self.redis_options.get("socket_timeout", socket_timeout), "socket_timeout")
        if st is None or st < 1:
            raise ConfigurationError("socket_timeout must be at least 1 s")
        self.socket_timeout = st
        self.durability = durability_setting(wait_replicas, wait_timeout, wait_aof, st)
        #: how job records are encoded and decoded (arguments, options, results, errors)
        keys = (signing_key, verify_keys, encryption_key)
        self.codec = Codec.of(self, keys, compression, payload_store)
        pickled = isinstance(self.serializer, PickleSerializer)
        if pickled and self.codec.signer is None and not allow_unsigned_pickle:
            raise ConfigurationError(
                "serializer='pickle' without a signing_key lets anyone who can write to "
                "Redis run code in your workers and producers: give signing_key=..., or "
                "allow_unsigned_pickle=True if only trusted code can reach Redis"
            )
        self.tasks: dict[str, Task[Any, Any]] = {}
        #: lifecycle hooks, middleware and enqueue hooks (see ``on_startup`` and the others)
        self.hooks = Hooks()
        self._queues: dict[str, Queue] = {}
        #: the class of its queues (aioqueue.otel.instrument swaps in one that traces)
        self._queue_type: type[Queue] = Queue
        self._sharded: dict[str, ShardedQueue] = {}
        #: periodic schedules: declared in code, and managed in Redis at run time
        self.schedules = Schedules(self)
        self._redis: aioredis.Redis | None = None
        #: the user's client (App(client=...)): used, never closed
        if isinstance(client, aioredis.ConnectionPool):  # a client on it (the pool stays yours)
            client = aioredis.Redis(connection_pool=client)
        self._given = cast("aioredis.Redis | None", client)
        self.testing = bool(testing)
        self._results: ResultWaiter | None = None
        self._state = State.UNOPENED
        self._sync: SyncClient | None = None

    def __repr__(self) -> str:
        return (
            f"<App prefix={self.prefix!r} queue={self.default_queue!r} {self._state.name.lower()}>"
        )

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> None:
        """Create the connection pool, check that the server answers and load the scripts.

        Raises:
            ServerUnavailable: the server cannot be reached, or is loading its data (retry).
            ConfigurationError: the server refused: bad credentials, a DB index out of range,
                an ACL user without a command aioqueue needs (retrying cannot help).
            ClosedError: the App was closed.
        """
        if self._state is State.OPEN:
            return
        if self._state is State.CLOSED:
            raise ClosedError("this App was closed; create a new App to connect again")
        # None: see socket_timeout above; our calls carry their own asyncio timeout
        opts = self._pool_options(Retry, None)
        probe = QueueKeys(self.prefix, self.default_queue).seq
        if self._given is not None:
            await adopt(self._given, self.socket_timeout, probe, self.testing)
            self._redis = self._given
        else:
            self._redis = await connect(self.url, opts, self.socket_timeout, probe, self.testing)
        set_durability(self._redis, self.durability)
        self._state = State.OPEN

    def _pool_options(
        self, retry: Callable[..., Any], socket_timeout: float | None
    ) -> dict[str, Any]:
        """The connection pool's options, for the async client and the blocking one
        (``app.sync()``), each with its own ``Retry`` class."""
        return pool_options(
            self.url, self.max_connections, self.redis_options, retry, socket_timeout
        )

    def sync(self) -> SyncClient:
        """The App's blocking producer, for code without an event loop (Django, Flask,
        scripts): ``app.sync().enqueue(task, ...)``. It needs no ``open()``: its own pool of
        blocking connections connects on first use. One per App, shared by threads, until
        ``close()``d."""
        client = self._sync
        if client is None or client.closed:
            client = self._sync = SyncClient(self)
        return client

    async def aclose(self) -> None:
        """Close the connection pool. The App cannot be opened again."""
        if self._results is not None:
            await self._results.aclose()
            self._results = None
        if self._redis is not None:
            await close_hot_connection(self._redis)
            if self._redis is not self._given:
                await self._redis.aclose()
            self._redis = None
        self._state = State.CLOSED

    async def __aenter__(self) -> App:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    @property
    def redis(self) -> aioredis.Redis:
        """The shared client (and its pool). Raises ClosedError unless the App is open."""
        if self._redis is None:
            if self._state is State.CLOSED:
                raise ClosedError("this App is closed")
            raise ClosedError("this App is not open: use `async with app:` or `await app.open()`")
        return self._redis

    @property
    def result_waiter(self) -> ResultWaiter:
        """The App's shared listener for result notifications (created on first use)."""
        if self._results is None:
            self.redis  # noqa: B018 - raises ClosedError unless open
            self._results = ResultWaiter(self)
        return self._results

    # ------------------------------------------------------------------ tasks and queues
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
    ) -> Task[Any, Any] | TaskDecorator:
        """Register a job function (async, or sync to run in a thread pool).

        Use bare (``@app.task``) or with options (``@app.task(max_attempts=5, timeout=30)``).

        Args:
            name: the name jobs are stored under (default: the function's ``__name__``);
                unique within the App.
            queue: the queue its jobs go to (default: the App's).
            max_attempts: runs before a failing job is dead-lettered.
            timeout: seconds one run may take before it is cancelled and counts as failed
                (a sync task's thread runs on: see docs/workers.md, and ``isolation``).
            backoff: delay between failed attempts (default: the App's).
            result_ttl: seconds its results are kept (default: the App's).
            keep_result: the same setting, by the name other queues use: seconds (or a
                timedelta) to keep its results, ``True`` to keep them for good, ``False`` not
                to keep them at all (give this or ``result_ttl``, not both).
            priority: default priority of its jobs, -100..100, higher first.
            isolation: ``"process"``: each run in a child process that a timeout kills and
                whose crash fails only the job (docs/flow-control.md#isolation).
        """

        def register(f: Callable[..., Any]) -> Task[Any, Any]:
            task_name = name if name is not None else getattr(f, "__name__", None)
            if not task_name:
                raise ConfigurationError(f"cannot name task {f!r}: pass name=")
            check_task_name(task_name)
            if task_name in self.tasks:
                raise ConfigurationError(
                    f"a task named {task_name!r} is already registered; "
                    "pass name= to tell them apart"
                )
            t: Task[Any, Any] = Task(
                self,
                f,
                name=task_name,
                queue=check_name("queue name", self.default_queue if queue is None else queue),
                max_attempts=self.max_attempts if max_attempts is None else max_attempts,
                timeout=self.timeout if timeout is None else to_seconds(timeout, "timeout"),
                backoff=check_backoff(backoff) or self.backoff,
                result_ttl=retention_seconds(result_ttl, keep_result),
                priority=priority,
                isolation=isolation,
            )
            self.tasks[task_name] = t
            return t

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
                raises BatchFailed; ``"ignore"``: deprecated, the same as ``"continue"``
                (warns ``DeprecationWarning``).
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
            priority=priority, group=group, queue=queue, retention=to_seconds(retention),
        )  # fmt: skip

    def workflow(self, name: str, *, on_failure: DependencyPolicy = "cancel") -> Workflow:
        """A new DAG workflow (docs/workflows.md): ``wf.step(name, task.call(...), after=[...])``
        then ``await wf.enqueue()``; ``WorkflowHandle(app.queue(q), id)`` reads one back."""
        return Workflow(self, name, on_failure)

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
        name = self.default_queue if name is None else name
        sharded = self._sharded.get(name)
        if sharded is None and shards is not None:
            if name in self._queues:
                raise ConfigurationError(f"queue {name!r} is in use unsharded: declare it first")
            sharded = self._sharded[name] = ShardedQueue(self, name, shards)
        if sharded is not None:
            if shards != sharded.shards:
                raise ConfigurationError(
                    f"queue {name!r} is sharded: use app.queue({name!r}, shards={sharded.shards})"
                )
            return sharded
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = self._queue_type(self, name)
        return q

    def events(
        self,
        queue: str | None = None,
        *,
        since: str | datetime = "$",
        kinds: Iterable[JobEventKind | str] | None = None,
        block: float = 5.0,
    ) -> AsyncIterator[JobEvent]:
        """Follow a queue's event stream (switched on with ``queue.set_events()``): an async
        iterator of ``JobEvent``, waiting for new ones (``XREAD BLOCK`` on a connection of its
        own, at most ``block`` seconds a call). After a lost connection it reconnects and goes
        on from the last event it yielded, so none is missed or repeated; close it with
        ``aclose()`` or by leaving the ``async for``.

        Args:
            queue: the queue (default: the App's default queue).
            since: ``"$"`` only events from now on, ``"0"`` every event still kept, a
                ``JobEvent.position`` saved earlier (resume right after it), or an aware
                datetime.
            kinds: only these kinds (default: every kind).
            block: the longest wait of one read, in seconds (below the socket timeout).

        Raises:
            ConfigurationError: a bad ``queue``, ``since`` or kind (when iteration starts).
        """
        name = self.queue(queue).name
        if not 0 < block < self.socket_timeout:
            raise ConfigurationError("block must be more than 0 and below the socket timeout")
        return iterate_events(self, name, since, kinds, block)
