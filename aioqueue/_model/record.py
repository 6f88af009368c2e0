"""The records of a job on the wire: on its way to the server (``JobRecord``: what
``enqueue.lua`` stores, made from the options of an enqueue call, ``JobOptions``) and back from
it (``Claimed``: a job ``claim.lua`` leased), with their layouts in the scripts' ARGV and
replies.

A job is its id, its payload (serialised arguments) and a ``Template``: everything else, which
the jobs of one ``enqueue_many`` call or of one batch share. ``enqueue.lua`` takes jobs in runs
of one template, so a call of many jobs sends the template once and then only ids and payloads.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .limits import CLAIMED_JOB_VALUES

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Template:
    """The part of a job record that many jobs can share (enqueue.lua's 10 template values)."""

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
    #: a unique job's lock: its scope letter (q, r, t) and TTL ms, e.g. ``r3600000``; '' none
    #: (then each job of the run also carries its unique key, ``JobRecord.unique_key``)
    unique: str = ""

    def values(self) -> tuple[str, int, int, int, int, str, str, str, bytes, str]:
        """The 10 values in enqueue.lua's order."""
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
            self.unique,
        )


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job to store: its id, its payload and its (possibly shared) template."""

    id: str
    payload: bytes
    template: Template
    #: the key of its unique lock (when ``template.unique``)
    unique_key: str = ""


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
    #: discard the job if no run has started by then (see ``Task.options``)
    expires: datetime | float | None = None
    #: unique jobs (see ``Task.options``): its lock's key ('' derived from the arguments)
    unique: UniqueOptions | None = None
    #: the jobs it waits for, (queue name or '' for its own, id) pairs (``_queue/deps.py``)
    depends_on: tuple[tuple[str, str], ...] = ()
    #: what it does when one of them fails: "cancel" (None: the default), "run" or "fail"
    on_dependency_failure: str | None = None


@dataclass(frozen=True, slots=True)
class UniqueOptions:
    """How a unique job's lock is keyed, how long it lives and what a conflict does."""

    #: the lock's key; '' derives it from the task name and the arguments
    key: str
    #: the lock's TTL, ms
    ttl_ms: int
    #: while the lock is held: "queued", "running" or "ttl"
    scope: str
    #: on a conflict: "existing", "replace" or "debounce"
    on_conflict: str

    @property
    def template_value(self) -> str:
        """enqueue.lua's template value: the scope's letter and the TTL."""
        return f"{self.scope[0]}{self.ttl_ms}"


@dataclass(slots=True)
class Claimed:
    """One job leased by ``claim``."""

    id: str
    token: str
    attempt: int
    task: str
    payload: bytes
    options: bytes
    max_attempts: int


@dataclass(slots=True)
class ClaimResult:
    now_ms: int
    next_wake_ms: int
    jobs: list[Claimed]


def enqueue_args(base: str, jobs: Sequence[JobRecord]) -> list[Any]:
    """enqueue.lua's ARGV for ``jobs``: consecutive jobs with the same template go as one run
    (see ``runs_args``), built in one pass."""
    args: list[Any] = [base, 0]
    last: Template | None = None
    count_at = n = 0
    for job in jobs:
        t = job.template
        if t is not last and (last is None or t != last):
            if last is not None:
                args[count_at] = n
            args.extend(t.values())
            count_at, n, last = len(args), 0, t
            args.append(0)
            args[1] += 1
        args.append(job.id)
        args.append(job.payload)
        if t.unique:
            args.append(job.unique_key)
        n += 1
    if last is not None:
        args[count_at] = n
    return args


def runs_args(base: str, runs: Sequence[tuple[Sequence[Any], Sequence[Any]]]) -> list[Any]:
    """enqueue.lua's ARGV for runs of jobs: (template values, [id, payload, ...]) each."""
    args: list[Any] = [base, len(runs)]
    for template, pairs in runs:
        args.extend(template)
        args.append(len(pairs) // 2)
        args.extend(pairs)
    return args


def parse_claim(res: list[Any]) -> ClaimResult:
    """claim's reply: now, next wake-up, then the leased jobs."""
    return ClaimResult(int(res[0]), int(res[1]), parse_claimed(res, 2))


def parse_claimed(values: list[Any], first: int = 0) -> list[Claimed]:
    """Leased jobs, ``CLAIMED_JOB_VALUES`` values each from ``first`` on, as claim replies
    them and enqueue hands them to a parked worker (integers then arrive as bytes, from a
    list). A job whose values cannot be read (garbage in a hand list) is left out with a
    warning, so its neighbours still run; its lease runs out and brings it back."""
    try:
        return [
            Claimed(
                values[i].decode(),
                values[i + 1].decode(errors="replace"),
                int(values[i + 2]),
                values[i + 3].decode(errors="replace"),  # an unknown task is dead-lettered
                values[i + 4],
                values[i + 5],
                int(values[i + 6]),
            )
            for i in range(first, len(values), CLAIMED_JOB_VALUES)
        ]
    except (UnicodeDecodeError, ValueError, TypeError, AttributeError, IndexError):
        pass
    jobs = []
    for i in range(first, len(values), CLAIMED_JOB_VALUES):
        try:
            jobs.append(_claimed(values, i))
        except (UnicodeDecodeError, ValueError, TypeError, AttributeError, IndexError) as exc:
            logger.warning("left out a leased job that cannot be read: %r", exc)
    return jobs


def _claimed(values: list[Any], i: int) -> Claimed:
    """One leased job (the slow path's; the fast path above is the same, inlined)."""
    return Claimed(
        values[i].decode(),
        values[i + 1].decode(errors="replace"),
        int(values[i + 2]),
        values[i + 3].decode(errors="replace"),
        values[i + 4],
        values[i + 5],
        int(values[i + 6]),
    )
