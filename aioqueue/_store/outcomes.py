"""The scripts' per-job return codes as named outcomes (``Outcome``, ``TickOutcome``,
``ReplaceOutcome``) and the ways a job can fail (``FailMode``): the codes become names here and
nowhere else."""

from __future__ import annotations

import enum
from typing import Final

from .._model.exceptions import JobNotFound, LeaseLost


class Outcome(enum.Enum):
    """What a fenced script did to one job (its per-job return code, by name)."""

    OK = "ok"
    #: complete: done, and its outcome waits in the outbox for a batch on another queue
    FORWARD = "forward"
    #: fail: a retry was scheduled
    RETRY = "retry"
    #: fail: dead-lettered
    DEAD = "dead"
    #: fail: recorded as cancelled
    CANCELLED = "cancelled"
    #: extend: renewed, but cancellation was requested: stop the job, record it cancelled
    CANCEL_REQUESTED = "cancel_requested"
    NO_JOB = "no_job"
    #: the lease token does not match: the lease ran out and the job moved on
    STALE = "stale"

    def check(self, job_id: str) -> None:
        """Raise for the codes that mean the caller no longer holds the job."""
        if self is Outcome.NO_JOB:
            raise JobNotFound(job_id)
        if self is Outcome.STALE:
            raise LeaseLost(job_id)

    @property
    def lost(self) -> bool:
        """The caller no longer holds the job (no record, or another lease)."""
        return self is Outcome.NO_JOB or self is Outcome.STALE


#: a worker's report in a claim: (leases it started or gave up, free slots), None for none
Started = tuple[int, int] | None


# the one table per script: Lua's return code -> Outcome (see each .lua header)
_FENCED = {-1: Outcome.NO_JOB, -2: Outcome.STALE}
_COMPLETE: Final = {1: Outcome.OK, 2: Outcome.FORWARD, **_FENCED}
_FAIL: Final = {1: Outcome.RETRY, 2: Outcome.DEAD, 3: Outcome.CANCELLED, **_FENCED}
_EXTEND: Final = {1: Outcome.OK, -3: Outcome.CANCEL_REQUESTED, **_FENCED}
_RELEASE: Final = {1: Outcome.OK, **_FENCED}


class TickOutcome(enum.Enum):
    """What ``schedule.lua`` did with one tick of a periodic schedule."""

    #: the tick's job was enqueued and the stored tick moved on
    FIRED = "fired"
    #: the stored tick moved on without a new job (missed ticks skipped, or its job existed)
    ADVANCED = "advanced"
    #: the tick is not due yet by the server's clock
    NOT_DUE = "not_due"
    NO_SCHEDULE = "no_schedule"
    #: the stored tick is another one: another scheduler fired this tick
    STALE = "stale"


_TICK: Final = {
    1: TickOutcome.FIRED,
    2: TickOutcome.ADVANCED,
    0: TickOutcome.NOT_DUE,
    -1: TickOutcome.NO_SCHEDULE,
    -2: TickOutcome.STALE,
}


class ReplaceOutcome(enum.Enum):
    """What ``replace.lua`` did to the job that holds a unique lock."""

    #: its arguments (and, debouncing, its due time) were replaced
    REPLACED = "replaced"
    #: it no longer waits (it started or finished): nothing changed
    STARTED = "started"
    #: the lock no longer names it: enqueue again
    LOCK_MOVED = "lock_moved"


_REPLACE: Final = {
    1: ReplaceOutcome.REPLACED,
    0: ReplaceOutcome.STARTED,
    -1: ReplaceOutcome.LOCK_MOVED,
}


class FailMode(enum.Enum):
    """What ``fail`` does with a failed attempt."""

    #: run again after the delay while attempts are left, else dead-letter
    RETRY = "retry"
    #: dead-letter now
    DEAD = "dead"
    #: record the job as cancelled (its cancellation was requested)
    CANCELLED = "cancelled"


# fail.lua's ARGV[5] (retry delay ms) carries the two other modes as -1 and -2
_FAIL_SIGNAL: Final = {FailMode.DEAD: -1, FailMode.CANCELLED: -2}
