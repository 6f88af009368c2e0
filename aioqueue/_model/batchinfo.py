"""A batch's records: ``BatchState``, ``BatchInfo`` (a snapshot) and ``BatchItem`` (a finished
sub-job), and the failure policies (``FailurePolicy``); the batches themselves are in
``_batch``."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Literal

from .job import ErrorInfo, Job

#: "ignore" is deprecated: it always did exactly what "continue" does (stored as "continue")
FailurePolicy = Literal["continue", "fail", "ignore"]
_POLICIES = ("continue", "fail", "ignore")


class BatchState(enum.StrEnum):
    """Where a batch is in its life; the words are ``JobState``'s where the meaning is shared.

    Attributes:
        OPEN: not finished: sub-jobs may still be added (until ``seal()``) or lack an outcome.
        COMPLETED: sealed and every sub-job has an outcome; the callback (if any) is released.
            With ``on_failure="continue"`` this includes batches with failed
            sub-jobs (``BatchInfo.failed`` counts them).
        FAILED: ``on_failure="fail"`` and a sub-job failed; the callback never runs.
        CANCELLED: ``Batch.cancel()`` was called before it finished.
    """

    OPEN = "open"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        """True for the terminal states: completed, failed and cancelled (as ``JobState``)."""
        return self is not BatchState.OPEN


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """A snapshot of a batch, from ``Batch.info()``: ``done + failed`` of ``total`` sub-jobs
    have an outcome (``done``: completed; ``failed``: dead-lettered or cancelled)."""

    id: str
    state: BatchState
    total: int
    done: int
    failed: int
    sealed: bool

    @property
    def pending(self) -> int:
        """Sub-jobs without an outcome yet: ``total - done - failed``."""
        return self.total - self.done - self.failed


@dataclass(frozen=True, slots=True)
class BatchItem:
    """One finished sub-job: its handle, and its result (``ok``) or its error."""

    job: Job[Any]
    ok: bool
    result: Any
    error: ErrorInfo | None
