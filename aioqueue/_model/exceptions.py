"""The exceptions aioqueue raises, all under one base class, in three families that answer
"whose fault is it?" so one ``except`` can catch each::

    AioQueueError
    ├── UsageError                you called it wrong: fix the call or the configuration
    │   ├── ConfigurationError    bad App/task/option values, bad URLs, invalid names
    │   ├── ClosedError           an App or worker used before opening or after closing
    │   ├── UnknownTask           enqueue by name of a task no live worker declared
    │   ├── UnknownDependency     depends_on= or wait_for_children names no job
    │   ├── WorkflowError         a workflow whose graph cannot run (a cycle, a missing step)
    │   ├── SerializationError    arguments or a result that cannot be serialised
    │   │   └── PayloadTooLarge   a serialised payload over the configured limit
    │   └── DuplicateStep         a job's run used one durable step name twice
    ├── ServerError               the server failed: often worth retrying later
    │   ├── ServerUnavailable     Redis could not be reached or dropped the connection
    │   ├── ServerRefused         Redis answered a call with an error (a script's, a command's)
    │   ├── NotReplicated         durability mode: a write not acknowledged by enough replicas
    │   ├── QueueFull             backpressure: the queue holds its max_queued waiting jobs
    │   └── EmbeddedServerError   the embedded Valkey server could not start
    ├── JobError                  the job (or batch, lease, stored value) is not what you asked for
    │   ├── JobNotFound           no record of the job (never existed, or its retention ran out)
    │   ├── CorruptRecord         a job's stored state cannot be read (garbled in Redis)
    │   ├── JobFailed             awaited result of a job that was dead-lettered
    │   ├── JobCancelled          awaited result of a job that was cancelled
    │   ├── ResultTimeout         result(timeout=) ran out; also a builtin TimeoutError
    │   ├── LeaseLost             complete/fail/release/extend with a stale lease token
    │   ├── BadSignature          a signing App met an unsigned or tampered payload or result
    │   │   └── DecryptionFailed  a payload or result that does not decrypt here
    │   ├── InvalidHandle         a reservation handle that is garbled, forged or another queue's
    │   ├── BatchNotFound         no record of the batch (never existed, or its retention ran out)
    │   ├── BatchFailed           awaited batch (on_failure="fail") had failed sub-jobs
    │   ├── BatchCancelled        awaited batch was cancelled
    │   ├── JobNotChangeable      job.change() of a job that started or finished
    │   ├── WaitTimedOut          a durable wait (ctx.wait_for_event) ran out; a TimeoutError
    │   └── NonRetryable          raised by a task: dead-letter this job now, no retry
    └── StartupFailed             a worker's startup hook raised: the worker did not start

Each keeps the builtin base it had (``ServerUnavailable`` is an ``OSError``, ``JobNotFound`` a
``LookupError``, ``ConfigurationError`` a ``ValueError``, ...), so older ``except`` clauses go on
working.

``Retry`` is not an error: a job raises it to ask to run again later. ``SyncTimeoutWarning``
(a ``UserWarning``) is the one warning of aioqueue's own: a sync task declared with a timeout
that cannot stop it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any


class AioQueueError(Exception):
    """Base class of every exception aioqueue raises."""


class UsageError(AioQueueError):
    """Base class of the errors of a call that cannot work as made: a bad option or name, an App
    used while closed, arguments that cannot be stored. Fix the call; retrying will not help."""


class ServerError(AioQueueError):
    """Base class of the errors of the server: unreachable, refusing a call, not replicating in
    time, or (the embedded one) not starting. The call may work when retried later."""


class JobError(AioQueueError):
    """Base class of the errors about a job, a batch or a lease: not found, unreadable, failed,
    cancelled, not finished in time, no longer held, or not authentic."""


class ConfigurationError(UsageError, ValueError):
    """Raised when an option, a name or a URL is invalid, at the call that received it."""


class UnknownDependency(UsageError, LookupError):
    """Raised at enqueue (or ``wait_for_children``) when a dependency names no job: never
    enqueued, or its record expired. Nothing was stored."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"dependency {job_id!r} is no job (never enqueued, or its record expired)")
        self.job_id = job_id


class WorkflowError(UsageError, ValueError):
    """Raised by a workflow's ``enqueue`` (before anything is stored) when its graph cannot
    run: a cycle, a step named twice, an edge to a step that does not exist."""


class ClosedError(UsageError, RuntimeError):
    """Raised when an App or a worker is used before it was opened or after it was closed."""


class UnknownTask(UsageError, LookupError):
    """Raised by enqueue by name (``Queue.enqueue``, ``enqueue_by_name``) when live workers
    serve the queue and none of them declared a task of that name (a typo, or a task of
    another project); the message suggests close names. ``allow_unknown=True`` enqueues it
    anyway (a task only the next deploy brings)."""


class SerializationError(UsageError, TypeError):
    """Raised by ``enqueue`` when the arguments cannot be serialised, and by a worker when a
    result cannot be (the job then fails with this error)."""


class PayloadTooLarge(SerializationError):
    """Raised by ``enqueue`` when the serialised arguments exceed ``App(max_payload_bytes=)``."""


class DuplicateStep(UsageError, ValueError):
    """Raised by ``ctx.step(name, ...)`` when this run of the job already used ``name``: a
    step's name is its identity across runs, so two steps of one job must not share it."""

    def __init__(self, job_id: str, name: str) -> None:
        super().__init__(f"job {job_id!r}: step {name!r} was already used in this run")
        self.job_id = job_id
        self.name = name


class ServerUnavailable(ServerError, OSError):
    """Raised when Redis cannot be reached or drops the connection during a call (after the
    connection pool's own retries). Also an ``OSError``; named so that it does not shadow the
    builtin ``ConnectionError`` in ``from aioqueue import *``."""


class NotReplicated(ServerError):
    """Raised in durability mode (``App(wait_replicas=...)``) by ``enqueue`` and the pull
    API's ``complete`` when fewer replicas than asked acknowledged the write within
    ``wait_timeout``. The write was made on the primary (a retry with the same job id is
    safe); it is only not yet known to survive a failover. ``acknowledged`` is how many
    replicas did."""

    def __init__(self, message: str, acknowledged: int = 0) -> None:
        super().__init__(message)
        self.acknowledged = acknowledged


class QueueFull(ServerError):
    """Raised by an enqueue when the queue holds the most waiting jobs its setting allows
    (``Queue.set_max_queued``): nothing of the call was stored (all or nothing). A
    ``ServerError``, like a server's "busy": the call is right and worth making again later.
    A producer waits for room first when the setting gives a wait (backing off), and raises
    this once that runs out.

    Attributes:
        waiting: the queue's backlog when the call was refused (``Queue.backlog()``).
        limit: the setting's maximum.
        wait: the seconds the setting lets a producer wait for room (0: none).
    """

    def __init__(self, waiting: int, limit: int, wait_ms: int) -> None:
        super().__init__(
            f"queue full: {waiting} jobs waiting, at most {limit} (Queue.set_max_queued); "
            "nothing of this enqueue was stored"
        )
        self.waiting = waiting
        self.limit = limit
        self.wait = wait_ms / 1000


class ServerRefused(ServerError):
    """Raised when Redis answers a call with an error instead of a result: a script that
    refused (an ACL rule, ``OOM``, a read-only replica) or a plain read of a key that holds
    garbage. The scripts set aside garbage they meet instead of failing on it, so an error
    that reaches here comes from the server, not from a script stopped midway.
    ``__cause__`` is redis-py's ``ResponseError``."""


class LeaseLost(JobError):
    """Raised when a job is completed, failed, released or extended with a lease token that is
    no longer current: the lease ran out and the job was handed to another consumer (or it
    already finished). The caller must stop working on the job."""

    def __init__(self, job_id: str, message: str | None = None) -> None:
        super().__init__(message or f"lease on job {job_id!r} is no longer held")
        self.job_id = job_id


class JobNotFound(JobError, LookupError):
    """Raised when a job id has no record: it never existed or its retention expired."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"no job {job_id!r} (never enqueued, or its record expired)")
        self.job_id = job_id


class CorruptRecord(JobError, ValueError):
    """Raised by ``Job.info()``, ``Job.state()`` and ``Job.result()`` when the job's record
    exists but its state cannot be read (something other than aioqueue wrote to it). Other
    unreadable fields do not raise: ``JobInfo.garbled`` names them."""

    def __init__(self, job_id: str, field: str, value: object) -> None:
        super().__init__(f"job {job_id!r}: its stored {field} cannot be read: {value!r}")
        self.job_id = job_id
        self.field = field


class BatchNotFound(JobError, LookupError):
    """Raised by a ``Batch`` handle's calls (``info``, ``wait``, ``results``, ``add``,
    ``seal``, ``cancel``) when the batch id has no record: it never existed or its retention
    expired."""

    def __init__(self, batch_id: str) -> None:
        super().__init__(f"no batch {batch_id!r} (never created, or its record expired)")
        self.batch_id = batch_id


class JobFailed(JobError):
    """Raised by ``Job.result()`` when the job ended in the dead-letter store.

    Attributes:
        job_id: the job.
        error_type: the exception class name the job raised (or a reason such as
            ``LeaseExpired``).
        error_message: its message.
        traceback: the formatted traceback, when there was one.
    """

    def __init__(
        self, job_id: str, error_type: str, error_message: str, traceback: str | None = None
    ) -> None:
        super().__init__(f"job {job_id!r} failed: {error_type}: {error_message}")
        self.job_id = job_id
        self.error_type = error_type
        self.error_message = error_message
        self.traceback = traceback


class JobCancelled(JobError):
    """Raised by ``Job.result()`` when the job was cancelled."""

    def __init__(self, job_id: str, reason: str | None = None) -> None:
        why = f" ({reason})" if reason else ""
        super().__init__(f"job {job_id!r} was cancelled{why}")
        self.job_id = job_id
        #: why, when recorded: ``"Expired"`` for a job whose expiry passed before it started
        self.reason = reason


class ResultTimeout(JobError, TimeoutError):
    """Raised by ``Job.result(timeout=)`` when the job has not finished in time."""


class BatchFailed(JobError):
    """Raised by ``Batch.wait()`` when a batch with ``on_failure="fail"`` had failures;
    ``info`` is its final BatchInfo."""

    def __init__(self, info: Any) -> None:
        super().__init__(f"batch {info.id!r}: {info.failed} of {info.total} sub-jobs failed")
        self.info = info


class BatchCancelled(JobError):
    """Raised by ``Batch.wait()`` when the batch was cancelled."""


class BadSignature(JobError):
    """Raised when an App with a ``signing_key`` reads a value that is unsigned or whose
    signature does not match its place (prefix, queue, job, task, field): a job's payload and
    options (a worker or ``reserve`` then dead-letters the job with this reason, unread), or a
    result (``Job.result()``, ``Batch.results()``: another job's, or one not made for that
    batch, does not match either). An App without a key raises it when it meets a signed
    result."""


class DecryptionFailed(BadSignature):
    """Raised when an App reads a payload or result it cannot decrypt: with an
    ``encryption_key``, a value not encrypted, encrypted with a key it does not list, tampered
    with, or moved from another job, task, queue or prefix (AES-GCM authenticates it with its
    place); without one, an encrypted value. A worker or ``reserve`` dead-letters the job with
    this reason, undecoded; ``Job.result()`` and ``Batch.results()`` raise it."""


class InvalidHandle(JobError, ValueError):
    """Raised by ``Queue.reservation_from`` for a handle it cannot take: not a handle (cut,
    garbled, made up), another queue's, tampered with or signed with a key not accepted here
    (when the App has a ``signing_key``), or signed when the App has none, or the reverse.
    A well-formed handle whose lease is over is not refused here: ``complete`` and the other
    calls answer ``LeaseLost``, as for the reservation itself."""


class JobNotChangeable(JobError):
    """Raised by ``Job.change()`` when the job no longer waits (it started, finished or was
    cancelled): only a queued or scheduled job can be changed. ``state`` is the state it was
    found in."""

    def __init__(self, job_id: str, state: str) -> None:
        super().__init__(f"job {job_id!r} is {state}: only a queued or scheduled job changes")
        self.job_id = job_id
        self.state = state


class WaitTimedOut(JobError, TimeoutError):
    """Raised inside a task by ``await ctx.wait_for_event(key, timeout=...)`` when no signal
    came in time (the job was woken by its timeout, possibly on another worker)."""

    def __init__(self, key: str, timeout: float | timedelta) -> None:
        if isinstance(timeout, timedelta):
            timeout = timeout.total_seconds()
        super().__init__(f"no signal {key!r} within {timeout} s")
        self.key = key
        #: seconds the wait was given
        self.timeout = timeout


class NonRetryable(JobError):
    """Raised by a task to fail its job for good: the job is dead-lettered at once, whatever
    attempts it has left, with this exception's class name (a subclass keeps its own) and
    message as the reason. Use it for errors no retry can heal (a declined card, a
    malformed order); ``@app.task(dont_retry_on=...)`` does the same for other types."""


class StartupFailed(AioQueueError):
    """Raised by ``Worker.run`` when one of the App's startup hooks (``@app.on_startup``)
    raised: the worker fetched nothing and runs no shutdown hook. The hook's exception is the
    ``__cause__``; the message names the hook."""


class EmbeddedServerError(ServerError, RuntimeError):
    """Raised when the embedded Valkey server cannot be found, started or reached."""


class RateLimited(Exception):
    """Raised by a job whose upstream refused it for its rate (an HTTP 429): the job goes
    back to its queue without spending an attempt, to run again after ``retry_after``
    seconds, and the rate limits it needs back off for every worker (halved, then climbing
    back with each success: see docs/flow-control.md, "Adaptive backoff").

    Args:
        retry_after: seconds (or a timedelta) before the job, and any job of its rate
            limits' keys, starts again (the upstream's ``Retry-After``); ``None``: at once,
            at the lowered rate. At most an hour.
    """

    def __init__(self, retry_after: float | timedelta | None = None, *args: Any) -> None:
        super().__init__(*args)
        if isinstance(retry_after, timedelta):
            retry_after = retry_after.total_seconds()
        if retry_after is not None and (
            isinstance(retry_after, bool)
            or not isinstance(retry_after, int | float)
            or not 0 <= retry_after <= 3600
        ):
            raise ConfigurationError(
                f"RateLimited(retry_after=) must be 0..3600 s: {retry_after!r}"
            )
        #: seconds before it runs again (None: at once)
        self.retry_after = None if retry_after is None else float(retry_after)


class Retry(Exception):
    """Raised by a job to be run again later; it spends an attempt.

    Args:
        delay: seconds (or a timedelta) to wait before the next attempt; ``None`` uses the
            task's backoff. A negative delay means "now"; a non-finite one (``nan``, ``inf``)
            or one over 100 years fails the attempt with the reason ``InvalidRetry`` (the
            task's backoff applies).

    Raises:
        ConfigurationError: ``delay`` is neither a number, a timedelta nor None.
    """

    def __init__(self, delay: float | timedelta | None = None, *args: Any) -> None:
        super().__init__(*args)
        if isinstance(delay, timedelta):
            delay = delay.total_seconds()
        elif delay is not None and (isinstance(delay, bool) or not isinstance(delay, int | float)):
            raise ConfigurationError(
                f"Retry(delay=) must be seconds (a number or timedelta), not {delay!r}"
            )
        #: seconds before the next attempt (as given), or None for the task's backoff
        self.delay = None if delay is None else float(delay)


class SyncTimeoutWarning(UserWarning):
    """Warned when a sync task is declared with a timeout and no isolation: on timeout its job
    fails, but its thread cannot be stopped and runs on (``isolation="process"`` kills it)."""
