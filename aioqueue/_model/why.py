"""The reasons of ``Job.why()``: ``WhyReason``, a ``WhyRow`` per reason and its sentence.

``why.lua`` reads every block a claim would meet, atomically and by the server's clock, in one
call (``Queue.why()``); ``parse_why`` reads its answer and ``JobWhy`` (in ``job``) holds it. A new
block (a limiter, a dependency) is one more check in ``why.lua`` and one more ``WhyReason``
with its sentence below.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .safetext import escape
from .timeutil import score_ms


class WhyReason(enum.StrEnum):
    """One reason in a ``JobWhy``: what holds a job, or where it is.

    Attributes:
        NOT_FOUND: no record: never enqueued, or its retention ran out (expired).
        FINISHED: it completed, failed (dead letter) or was cancelled, at ``finished_ms``.
        RUNNING: leased to ``worker`` (``worker_alive``: its registration is fresh) until
            ``until_ms``, started at ``started_ms``.
        SCHEDULED: delayed until ``until_ms`` (a time past: the next claim or reap promotes it).
        EVENT: parked in ``ctx.wait_for_event(event)`` until ``app.signal(event, ...)``, or
            until its timeout at ``until_ms``.
        WAITING: held until its batch ``batch`` ends (a batch's callback or a chain's next
            step), or until something else ends (no batch named).
        DEPENDENCIES: held until the ``left`` jobs it depends on (``depends_on=``, a
            workflow's steps) end; ``waits_for`` names up to 10 of them (queue, job id).
        QUEUE_PAUSED: the queue is paused.
        GROUP_PAUSED: its group ``group`` is paused.
        GROUP_FULL: its group runs ``active`` jobs, its limit ``limit``; ``holders`` are up to
            10 of them (job id, worker).
        GROUP_RATE: its group's rate window is used up until ``until_ms``.
        QUEUE_RATE: the queue's rate window is used up until ``until_ms``.
        NO_WORKER: no live worker is registered on the queue.
        LIMITER: its named limit ``limiter`` (key ``limit_key``) does not admit it until
            ``until_ms``: its rate (``limited_by`` "rate") or its running jobs ("conc").
        UNKNOWN_TASK: live workers (``workers`` of them) serve the queue, none declared the task.
        POSITION: ``ahead`` jobs are ahead of it in its lane (``group``; None the default
            lane); ``ahead`` None: not within the first 100,000 of the ready list.
        UNREADABLE: its stored state is not one aioqueue knows (garbage in the record).
    """

    NOT_FOUND = "missing"
    FINISHED = "finished"
    RUNNING = "running"
    SCHEDULED = "scheduled"
    EVENT = "event"
    WAITING = "waiting"
    DEPENDENCIES = "dependencies"
    QUEUE_PAUSED = "queue_paused"
    GROUP_PAUSED = "group_paused"
    GROUP_FULL = "group_full"
    GROUP_RATE = "group_rate"
    QUEUE_RATE = "queue_rate"
    NO_WORKER = "no_worker"
    LIMITER = "limiter"
    UNKNOWN_TASK = "unknown_task"
    POSITION = "position"
    UNREADABLE = "unreadable"


@dataclass(frozen=True, slots=True)
class WhyRow:
    """One reason and its facts (the fields its ``WhyReason`` names; the others are None)."""

    reason: WhyReason
    until_ms: int | None = None
    group: str | None = None
    worker: str | None = None
    worker_alive: bool | None = None
    started_ms: int | None = None
    finished_ms: int | None = None
    batch: str | None = None
    limit: int | None = None
    active: int | None = None
    holders: tuple[tuple[str, str], ...] = ()
    waits_for: tuple[tuple[str, str], ...] = ()
    left: int | None = None
    workers: int | None = None
    ahead: int | None = None
    limiter: str | None = None
    limit_key: str | None = None
    limited_by: str | None = None
    event: str | None = None

    def sentence(self, now_ms: int) -> str:
        """This reason in words (names escaped, times as UTC and from now)."""
        return _SENTENCES[self.reason](self, now_ms)


def parse_why(raw: bytes | str) -> tuple[int, str | None, tuple[WhyRow, ...]]:
    """``why.lua``'s JSON: the server's time (ms), the job's state as stored (None: no
    record) and its rows (its text decoded leniently: ids and names may be garbage)."""
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    data = json.loads(text)
    rows = tuple(_row(r) for r in data.get("rows") or [])  # an empty Lua table is {}
    state = data.get("s")
    return _ms(data["now"]) or 0, None if state is None else str(state), rows


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


def _ms(v: Any) -> int | None:
    """A time read from the server, which garbage may have put anywhere: clamped to 64 bits."""
    return None if v is None else score_ms(float(v))


def _row(r: dict[str, Any]) -> WhyRow:
    reason = WhyReason(r["r"])
    ahead = _int(r.get("ahead"))
    return WhyRow(
        reason,
        until_ms=_ms(r.get("at", r.get("until"))),
        group=(r.get("g") or r.get("lane")) or None,
        worker=r.get("w"),
        worker_alive=r.get("live"),
        started_ms=_ms(r.get("st")) or None,
        finished_ms=_ms(r.get("f")),
        batch=r.get("b") or None,
        limit=_int(r.get("limit")),
        active=_int(r.get("active")),
        left=_int(r.get("n")),
        waits_for=tuple(_member(str(m)) for m in (r.get("deps") or [])),
        holders=tuple((str(h[0]), str(h[1])) for h in (r.get("holders") or [])),
        limiter=None if r.get("name") is None else str(r["name"]),
        limit_key=None if r.get("key") is None else str(r["key"]),
        limited_by=None if r.get("by") is None else str(r["by"]),
        event=None if r.get("r") != "event" else str(r.get("key", "")),
        workers=_int(r.get("workers")),
        ahead=None if ahead is None or ahead < 0 else ahead,
    )


def _member(member: str) -> tuple[str, str]:
    """A dependency's member, ``<prefix>:{<queue>}:<id>``, as (queue, id)."""
    _, brace, rest = member.partition("{")
    queue, close, job_id = rest.partition("}:")
    return (queue, job_id) if brace and close else ("", member)


def _dependencies(r: WhyRow, now: int) -> str:
    named = ", ".join(f"{escape(j)} (queue {escape(q)})" for q, j in r.waits_for)
    return f"It waits for {r.left} job(s) it depends on" + (f": {named}." if named else ".")


def _at(ms: int | None, now_ms: int) -> str:
    if ms is None:
        return "an unknown time"
    try:
        t = datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, ValueError, OSError):  # garbage: beyond what a date can be
        return f"{ms} ms (not a date)"
    d = (ms - now_ms) / 1000
    return f"{t} (in {d:.1f} s)" if d >= 0 else f"{t} ({-d:.1f} s ago)"


def _group(r: WhyRow) -> str:
    return escape(r.group or "")


def _running(r: WhyRow, now: int) -> str:
    who = f"worker {escape(r.worker)}" if r.worker else "a pull-API consumer"
    s = f"It is running on {who}, leased until {_at(r.until_ms, now)}."
    if r.worker and not r.worker_alive:
        s += " That worker missed its heartbeats: the job goes back to the queue when it is buried."
    return s


def _scheduled(r: WhyRow, now: int) -> str:
    if r.until_ms is not None and r.until_ms <= now:
        return f"It was due at {_at(r.until_ms, now)}; the next claim or reap makes it runnable."
    return f"It is scheduled until {_at(r.until_ms, now)}."


def _full(r: WhyRow, now: int) -> str:
    held = ", ".join(f"{escape(j)} on {escape(w) or 'a pull-API consumer'}" for j, w in r.holders)
    s = f"Its group {_group(r)} is at its limit: {r.active} running of {r.limit}"
    return s + (f" ({held})." if held else ".")


def _limiter(r: WhyRow, now: int) -> str:
    what = "its running jobs" if r.limited_by == "conc" else "its rate"
    key = f" (key {escape(r.limit_key or '')})" if r.limit_key else ""
    name = escape(r.limiter or "")
    return f"Its limiter {name}{key} admits no more by {what} until {_at(r.until_ms, now)}."


def _position(r: WhyRow, now: int) -> str:
    lane = f"group {_group(r)}'s lane" if r.group else "the queue's lane"
    if r.ahead is None:
        return f"It is queued in {lane}, beyond the first 100,000 jobs."
    if r.ahead == 0:
        return f"It is next in {lane}."
    return f"It is queued in {lane} with {r.ahead} job(s) ahead of it."


_SENTENCES: dict[WhyReason, Callable[[WhyRow, int], str]] = {
    WhyReason.NOT_FOUND: lambda r, n: "No such job: never enqueued, or its retention ran out.",
    WhyReason.FINISHED: lambda r, n: f"It has finished, at {_at(r.finished_ms, n)}.",
    WhyReason.RUNNING: _running,
    WhyReason.SCHEDULED: _scheduled,
    WhyReason.WAITING: lambda r, n: (
        f"It waits for batch {escape(r.batch)} to end." if r.batch else "It waits for other jobs."
    ),
    WhyReason.DEPENDENCIES: _dependencies,
    WhyReason.QUEUE_PAUSED: lambda r, n: "The queue is paused.",
    WhyReason.GROUP_PAUSED: lambda r, n: f"Its group {_group(r)} is paused.",
    WhyReason.GROUP_FULL: _full,
    WhyReason.GROUP_RATE: lambda r, n: (
        f"Its group {_group(r)} used up its rate until {_at(r.until_ms, n)}."
    ),
    WhyReason.QUEUE_RATE: lambda r, n: f"The queue used up its rate until {_at(r.until_ms, n)}.",
    WhyReason.NO_WORKER: lambda r, n: "No live worker serves this queue.",
    WhyReason.LIMITER: lambda r, n: _limiter(r, n),
    WhyReason.EVENT: lambda r, n: (
        f"It waits for event {escape(r.event or '')} (app.signal), "
        f"or its timeout at {_at(r.until_ms, n)}."
    ),
    WhyReason.UNKNOWN_TASK: lambda r, n: (
        f"The {r.workers} live worker(s) of this queue do not declare its task."
    ),
    WhyReason.POSITION: _position,
    WhyReason.UNREADABLE: lambda r, n: "Its stored state cannot be read.",
}
