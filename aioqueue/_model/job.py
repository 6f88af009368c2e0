"""Job handles (``Job[R]``), job states, and the stored record of a job."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, Protocol, TypeVar

from .checks import to_seconds
from .exceptions import (
    CorruptRecord,
    JobCancelled,
    JobFailed,
    ResultTimeout,
    SerializationError,
)
from .why import WhyReason, WhyRow, parse_why

R = TypeVar("R")


class JobState(enum.StrEnum):
    """Where a job is in its life (docs/guarantees.md draws the transitions).

    The words are shared with ``BatchState``: ``completed``, ``failed`` and ``cancelled`` mean
    the same for a job and for a batch, and ``finished`` is true for exactly those three.

    Attributes:
        WAITING: a batch's callback (or a chain's second call), held until its batch ends.
        SCHEDULED: delayed (``delay=``/``at=``, or a retry's backoff), not yet due.
        QUEUED: runnable, waiting for a consumer.
        ACTIVE: leased to a worker or a pull-API consumer.
        COMPLETED: finished with a result.
        FAILED: dead-lettered, with the reason (``JobInfo.error``).
        CANCELLED: cancelled before it finished.
    """

    WAITING = "waiting"
    SCHEDULED = "scheduled"
    QUEUED = "queued"
    ACTIVE = "active"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        """True for the terminal states: completed, failed (dead letter) and cancelled."""
        return self in _FINISHED


_FINISHED = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """A record (not an exception) of what a failed attempt left behind: the exception's type
    name, its message and the formatted traceback. ``JobInfo.error`` and ``BatchItem.error``."""

    type: str
    message: str
    traceback: str | None = None


@dataclass(frozen=True, slots=True)
class JobInfo:
    """A snapshot of a job's stored record.

    A field that cannot be read (something other than aioqueue wrote to the record) is named
    in ``garbled`` and reads as if it were absent: ``None``, or 0 for the counts (1 for
    ``max_attempts``). Arguments that cannot be decoded (a corrupt or unverified payload) are
    ``None`` and named too. Only an unreadable state raises (``CorruptRecord``).
    """

    id: str
    queue: str
    task: str
    state: JobState
    attempts: int
    max_attempts: int
    priority: int
    created_ms: int
    due_ms: int | None
    finished_ms: int | None
    error: ErrorInfo | None
    args: tuple[Any, ...] | None
    kwargs: dict[str, Any] | None
    progress: Any = None
    #: names of the fields above whose stored value could not be read
    garbled: tuple[str, ...] = ()
    #: the payload (and the result) are stored encrypted (``App(encryption_key=...)``): an App
    #: that cannot decrypt them reads ``args``/``kwargs`` (and a detail's result) as None
    encrypted: bool = False


class JobHome(Protocol):
    """What a ``Job`` handle asks of its queue (a ``Queue`` satisfies it)."""

    @property
    def name(self) -> str: ...
    async def job_info(self, job_id: str) -> JobInfo: ...
    async def cancel_jobs(self, job_ids: Sequence[str]) -> int: ...
    async def change_job(
        self,
        job_id: str,
        priority: int | None,
        delay: float | timedelta | None,
        at: datetime | float | None,
    ) -> JobState: ...
    async def job_state(self, job_id: str) -> JobState: ...
    async def wait_result(self, job_id: str, seconds: float | None) -> Any: ...
    async def why(self, job_id: str) -> JobWhy: ...


class Job(Generic[R]):
    """A handle on an enqueued job; ``R`` is the task's return type.

    Cheap to create (no I/O): ``app.queue(name).job(job_id)`` gives one for any id.
    """

    __slots__ = ("_convert", "_queue", "id")

    def __init__(
        self, queue: JobHome, job_id: str, convert: Callable[[Any], Any] | None = None
    ) -> None:
        self._queue = queue
        self.id = job_id
        # the task's result decoder (its return annotation), for jobs its Task enqueued
        self._convert = convert

    @property
    def queue(self) -> str:
        """The name of the job's queue."""
        return self._queue.name

    def __repr__(self) -> str:
        return f"Job(id={self.id!r}, queue={self.queue!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Job) and (other.id, other.queue) == (self.id, self.queue)

    def __hash__(self) -> int:
        return hash((self.id, self.queue))

    async def state(self) -> JobState:
        """The job's current state.

        Raises:
            JobNotFound: no record (never enqueued, or its retention ran out).
            CorruptRecord: the record's state cannot be read.
        """
        return await self._queue.job_state(self.id)

    async def cancel(self) -> bool:
        """Cancel the job (see ``Queue.cancel_jobs``). True if it was cancelled at once;
        False if it was running (its worker stops it shortly) or had already finished."""
        return await self._queue.cancel_jobs([self.id]) == 1

    async def change(
        self,
        *,
        priority: int | None = None,
        delay: float | timedelta | None = None,
        at: datetime | float | None = None,
    ) -> JobState:
        """Change the job while it waits (queued or scheduled), in one atomic step: its
        priority, and/or when it runs (``delay`` seconds from now, or ``at``; one of the two).
        A changed queued job goes to the back of its priority level. Returns its state after.

        Raises:
            JobNotChangeable: it started, finished or was cancelled.
            JobNotFound: no record of it.
            ConfigurationError: a bad value, both ``delay`` and ``at``, or nothing to change.
        """
        return await self._queue.change_job(self.id, priority, delay, at)

    async def info(self) -> JobInfo:
        """The job's stored record; fields that cannot be read are named in ``garbled``.

        Raises:
            JobNotFound: no record (never enqueued, or its retention ran out).
            CorruptRecord: the record's state cannot be read.
        """
        return await self._queue.job_info(self.id)

    async def why(self) -> JobWhy:
        """Why the job is (not) running, from the server's state in one atomic read (see
        ``JobWhy``; in words: ``.sentence()``)."""
        return await self._queue.why(self.id)

    async def result(self, timeout: float | timedelta | None = None) -> R:
        """Wait for the job to finish and return its result, without polling.

        Args:
            timeout: seconds (or timedelta) to wait at most; ``None`` waits as long as it takes.

        Raises:
            JobFailed: the job ended in the dead-letter store (its error is attached).
            JobCancelled: the job was cancelled.
            ResultTimeout: the job did not finish in time; ``timeout=0`` looks once, without
                waiting, and returns the result of a job that has finished.
            JobNotFound: no record of the job.
            CorruptRecord: the record's state cannot be read.
            SerializationError: the result does not fit the task's return annotation (a Job
                its Task enqueued reads the result by that annotation; others as JSON gives it).
        """
        value = await self._queue.wait_result(self.id, to_seconds(timeout))
        return typed_result(self.id, self._convert, value)  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class JobWhy:
    """Why a job is (not) running, read in one atomic call (``Job.why()``).

    ``rows`` are every reason that holds now, the one a claim meets first first; a queued
    job that nothing blocks has one row, its ``POSITION``.
    """

    job_id: str
    queue: str
    #: the job's state (None: no record, or a state aioqueue does not know)
    state: JobState | None
    #: the server's clock when it was read (ms)
    now_ms: int
    rows: tuple[WhyRow, ...]

    @property
    def reason(self) -> WhyReason:
        """The deciding reason: the first row's."""
        return self.rows[0].reason

    @property
    def blocked(self) -> bool:
        """True when something holds a queued job back (a row other than its position)."""
        return self.state is JobState.QUEUED and self.reason is not WhyReason.POSITION

    def sentence(self) -> str:
        """Every reason in words, the deciding one first."""
        return " ".join(row.sentence(self.now_ms) for row in self.rows)

    @classmethod
    def read(cls, queue: str, job_id: str, raw: bytes | str) -> JobWhy:
        """``why.lua``'s answer for a job (a state aioqueue does not know reads as None)."""
        now, state, rows = parse_why(raw)
        known = JobState(state) if state in _STATES else None
        return cls(job_id, queue, known, now, rows or (WhyRow(WhyReason.UNREADABLE),))


_STATES = frozenset(s.value for s in JobState)


def typed_result(job_id: str, convert: Callable[[Any], Any] | None, value: Any) -> Any:
    """A job's result read by its task's return annotation (``convert``), if there is one.

    Raises:
        SerializationError: the result does not fit the annotation.
    """
    if convert is None or value is None:
        return value
    try:
        return convert(value)
    except Exception as exc:
        raise SerializationError(
            f"the result of job {job_id!r} does not fit its task's return annotation: {exc}"
        ) from exc


def parse_state(job_id: str, raw: str | bytes) -> JobState:
    """A job's stored state, or CorruptRecord when it is not one of ``JobState``'s words."""
    try:
        return JobState(raw.decode() if isinstance(raw, bytes) else raw)
    except ValueError:  # includes UnicodeDecodeError
        raise CorruptRecord(job_id, "state", raw) from None


def raise_for_outcome(job_id: str, state: str, error: ErrorInfo | None) -> None:
    """Raise the exception that a finished, unsuccessful job's result() raises."""
    if state == JobState.FAILED:
        e = error or ErrorInfo("Unknown", "no error recorded")
        raise JobFailed(job_id, e.type, e.message, e.traceback)
    if state == JobState.CANCELLED:
        raise JobCancelled(job_id, None if error is None else error.type)


__all__ = [
    "ErrorInfo",
    "Job",
    "JobInfo",
    "JobState",
    "ResultTimeout",
    "parse_state",
    "raise_for_outcome",
    "typed_result",
]
