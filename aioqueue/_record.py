"""The record of a job on its way to the server: what ``enqueue.lua`` stores for it, and the
options of an enqueue call (``JobOptions``) it is made from.

A job is its id, its payload (serialised arguments) and a ``Template``: everything else, which
the jobs of one ``enqueue_many`` call or of one batch share. ``enqueue.lua`` takes jobs in runs
of one template, so a call of many jobs sends the template once and then only ids and payloads.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class Template:
    """The part of a job record that many jobs can share (enqueue.lua's 9 template values)."""

    task: str
    max_attempts: int
    #: run no earlier than this many ms from now (server clock); -1: no delay
    delay_ms: int = -1
    #: run no earlier than this absolute time (epoch ms); -1: none
    at_ms: int = -1
    priority: int = 0
    #: fairness group; '' none
    group: str = ""
    #: the batch the job is a sub-job of; '' none
    batch: str = ""
    #: the batch's home queue when it is another queue ('' this one)
    batch_queue: str = ""
    #: per-job options as JSON (timeout, result_ttl, ...); empty: none
    options: bytes = b""

    def values(self) -> tuple[str, int, int, int, int, str, str, str, bytes]:
        """The 9 values in enqueue.lua's order."""
        return (
            self.task,
            self.max_attempts,
            self.delay_ms,
            self.at_ms,
            self.priority,
            self.group,
            self.batch,
            self.batch_queue,
            self.options,
        )


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job to store: its id, its payload and its (possibly shared) template."""

    id: str
    payload: bytes
    template: Template


@dataclass(frozen=True, slots=True)
class JobOptions:
    """Options of one enqueue call; ``None`` means the task's default."""

    delay: float | None = None
    at: datetime | float | None = None
    job_id: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    timeout: float | None = None
    result_ttl: float | None = None
    queue: str | None = None
    group: str | None = None
