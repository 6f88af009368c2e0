"""Job events: what the transition scripts write to a queue's event stream (see
``lua/lib/events.lua``), read back as typed ``JobEvent`` values.

The stream is ``<prefix>:{<queue>}:events``, capped at about the queue's setting (``XADD MAXLEN
~``); it is off until ``queue.set_events(maxlen)`` switches it on (the one switch, stored in the
queue's settings, so every producer and worker obeys it at once). ``app.events()`` follows it
with ``XREAD BLOCK`` on a connection of its own and resumes from its last position after a lost
connection; ``queue.events_page()`` reads the retained history, bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import re
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from .._model.checks import at_to_ms, check_int
from .._model.exceptions import ConfigurationError, ServerRefused, ServerUnavailable
from .._model.keys import QueueKeys
from .._store.connect import own_client
from .._store.loader import bounded
from .core import QueueCore

if TYPE_CHECKING:
    from .owner import QueueOwner

logger = logging.getLogger(__name__)

#: the cap of a stream switched on without one (about the newest this many events are kept)
DEFAULT_EVENTS_MAXLEN = 10_000
#: the largest cap (a bound on the stream's memory: about 100 bytes an event)
MAX_EVENTS_MAXLEN = 10_000_000
#: the most events one read returns (a page of ``events_page``, one XREAD of ``app.events``)
MAX_EVENTS_PAGE = 1000

#: the most events one stream entry holds (the events of one loop, see lua/lib/events.lua)
MAX_PER_ENTRY = 100

# a position: a stream entry's id, and for an entry of several events ":" and the event's number
_POSITION = re.compile(r"\A\d{1,20}-\d{1,20}(:\d{1,3})?\Z")


class JobEventKind(enum.Enum):
    """What happened (an event's ``kind``)."""

    #: stored by enqueue (or a schedule's tick); ``due`` is set when it runs later
    ENQUEUED = "enqueued"
    #: leased by a worker or a pull-API consumer (``reserve``): an attempt starts
    STARTED = "started"
    #: the running job reported progress (``current_job().progress(...)``)
    PROGRESS = "progress"
    #: the attempt failed and the job runs again at ``due`` (its backoff); ``reason`` the error
    RETRIED = "retried"
    COMPLETED = "completed"
    #: dead-lettered; ``reason`` the error (also lease expiries on the last attempt, garbage)
    FAILED = "failed"
    #: cancelled (``reason`` "Cancelled: ..." or "Expired: ..." for a job past its expiry)
    CANCELLED = "cancelled"
    #: an operator made a scheduled job runnable now (``promote``); ``reason`` "signal" for a
    #: job a signal woke from its durable wait (``app.signal``)
    PROMOTED = "promoted"
    #: a job that had not started had its priority or due time changed (``Job.change``)
    CHANGED = "changed"
    #: an operator brought a dead letter back (``retry``/``requeue``)
    REQUEUED = "requeued"
    #: given back unfinished by its holder (pull-API ``release``, a worker shutting down)
    RELEASED = "released"
    #: handed back because its lease ran out (``reason`` "expired") or its worker was
    #: declared dead ("buried")
    RECOVERED = "recovered"
    #: a worker registered on the queue (its first heartbeat); ``job_id`` is ""
    WORKER_UP = "worker_up"
    #: a worker left: ``reason`` "stopped" (a clean exit) or "dead" (buried by reap)
    WORKER_DOWN = "worker_down"


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One event of a queue's stream.

    ``position`` is its place in the stream (a string such as ``"1764138000123-0"``): pass it as
    ``since=`` to resume right after it. ``at`` is when the server wrote it.
    """

    position: str
    queue: str
    kind: JobEventKind
    job_id: str
    task: str | None
    attempt: int | None
    worker: str | None
    reason: str | None
    due: datetime | None
    at: datetime


def _ms_time(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def _digits(s: str) -> bool:
    """ASCII digits only (``str.isdigit`` also accepts "²", which ``int`` refuses)."""
    return s.isascii() and s.isdigit()


def _texts(fields: dict[Any, Any]) -> dict[str, str]:
    return {
        (k.decode(errors="replace") if isinstance(k, bytes) else str(k)): (
            v.decode(errors="replace") if isinstance(v, bytes) else str(v)
        )
        for k, v in fields.items()
    }


def parse_entry(queue: str, entry_id: bytes | str, fields: dict[Any, Any]) -> list[JobEvent]:
    """The events of one stream entry (one, or the numbered events of a loop: see
    ``lua/lib/events.lua``), in order; an entry that holds no event (garbage) gives none."""
    pos = entry_id.decode(errors="replace") if isinstance(entry_id, bytes) else entry_id
    f = _texts(fields)
    try:
        kind = JobEventKind(f.get("k", ""))
        at = _ms_time(int(pos.partition("-")[0]))
    except (ValueError, OverflowError, OSError):
        return []
    n = f.get("n", "")
    if not n:
        values = (f.get("j", ""), f.get("t", ""), f.get("a", ""), f.get("w", ""), f.get("d", ""))
        return [_event(queue, pos, kind, at, values, f.get("r", ""))]
    try:
        flat = json.loads(f.get("e", ""))
    except ValueError:
        return []
    if not _digits(n) or not 0 < int(n) <= MAX_PER_ENTRY or not isinstance(flat, list):
        return []
    if len(flat) != int(n) * 5 or not all(isinstance(v, str) for v in flat):
        return []
    return [
        _event(queue, f"{pos}:{i // 5 + 1}", kind, at, flat[i : i + 5], "")
        for i in range(0, len(flat), 5)
    ]


def _event(
    queue: str, pos: str, kind: JobEventKind, at: datetime, values: Sequence[str], reason: str
) -> JobEvent:
    job_id, task, attempt, worker, due = values
    return JobEvent(
        position=pos,
        queue=queue,
        kind=kind,
        job_id=job_id,
        task=task or None,
        attempt=int(attempt) if _digits(attempt) and len(attempt) < 10 else None,
        worker=worker or None,
        reason=reason or None,
        due=_ms_time(int(due)) if _digits(due) and len(due) < 16 else None,
        at=at,
    )


def split_position(position: str) -> tuple[str, int]:
    """A checked position as (stream entry id, how many of its events come before or at it:
    0 for the whole entry)."""
    entry, _, i = position.partition(":")
    return entry, int(i or 0)


def _before(entry: str) -> str:
    """The stream id just before entry id ``entry`` (XREAD reads after an id)."""
    ms, _, seq = entry.partition("-")
    if int(seq) > 0:
        return f"{ms}-{int(seq) - 1}"
    return f"{int(ms) - 1}-18446744073709551615" if int(ms) > 0 else "0-0"


def check_position(since: str | datetime) -> str:
    """A stream position to read after: ``"$"`` (only new events), ``"0"`` (the oldest kept),
    a saved ``JobEvent.position``, or an aware datetime (events written from then on)."""
    if isinstance(since, datetime):
        ms = at_to_ms(since)
        return f"{ms - 1}-18446744073709551615" if ms > 0 else "0-0"
    if since == "$":
        return since
    if since == "0":
        return "0-0"
    if isinstance(since, str) and _POSITION.match(since):
        return since
    raise ConfigurationError(
        f'since= must be "$", "0", an event\'s position or an aware datetime, not {since!r}'
    )


def _kinds(kinds: Iterable[JobEventKind | str] | None) -> frozenset[JobEventKind] | None:
    if kinds is None:
        return None
    try:
        return frozenset(JobEventKind(k) for k in kinds)
    except ValueError as exc:
        raise ConfigurationError(f"unknown event kind: {exc}") from exc


async def iterate_events(
    app: QueueOwner,
    queue: str,
    since: str | datetime,
    kinds: Iterable[JobEventKind | str] | None,
    block: float,
) -> AsyncIterator[JobEvent]:
    """``app.events()``: see there."""
    position = check_position(since)
    wanted = _kinds(kinds)
    # a position inside an entry: read that entry again, without the events up to it
    skip_entry, skip = split_position(position) if position != "$" else ("", 0)
    if skip:
        position = _before(skip_entry)
    key = QueueKeys(app.prefix, queue).events
    block_ms = max(1, int(block * 1000))
    client = own_client(app.redis, key, "events")
    pause = 0.05
    try:
        while True:
            try:
                if position == "$":
                    # pin "$" to the newest event now, so that a reconnect misses nothing
                    last = cast(list[Any], await bounded(client, client.xrevrange(key, count=1)))
                    position = last[0][0].decode() if last else "0-0"
                reply = cast(
                    list[Any],
                    await bounded(
                        client,
                        client.xread({key: position}, count=MAX_EVENTS_PAGE, block=block_ms),
                        blocking=block,
                    ),
                )
            except (ServerUnavailable, ServerRefused) as exc:
                # lost connection (or a garbled key, set aside by the next event): go on from
                # the same position once the server answers again
                logger.warning("events of %r: %s; retrying in %.2f s", queue, exc, pause)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 2.0)
                continue
            pause = 0.05
            for _, entries in reply or ():
                for entry_id, fields in entries:
                    events = parse_entry(queue, entry_id, fields)
                    position = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                    if not events:
                        logger.warning("events of %r: skipped an entry that is no event", queue)
                    if skip and position == skip_entry:
                        events = events[skip:]
                    skip = 0
                    for event in events:
                        if wanted is None or event.kind in wanted:
                            yield event
    finally:
        with contextlib.suppress(Exception):
            await client.aclose()


class QueueEvents:
    """The event stream's methods of a ``Queue`` (which holds one and offers its methods)."""

    __slots__ = ("core",)

    def __init__(self, core: QueueCore) -> None:
        self.core = core

    async def set_events(self, maxlen: int | None = DEFAULT_EVENTS_MAXLEN) -> None:
        """Switch this queue's event stream on, keeping about the newest ``maxlen`` events, or
        off (``None``; the events written so far are kept until the stream is deleted). The
        setting lives in Redis: every producer and worker of the queue follows it at once.

        Raises:
            ConfigurationError: ``maxlen`` is not an int from 1 to 10,000,000.
        """
        if maxlen is None:
            await self.core.door.configure("events", "", "")
            return
        check_int(maxlen, 1, "maxlen", maximum=MAX_EVENTS_MAXLEN)
        await self.core.door.configure("events", "", maxlen)

    async def events_maxlen(self) -> int | None:
        """The cap of this queue's event stream, or None when events are off."""
        raw = await self.core.door.read(
            self.core.door.client.hget(self.core.door.keys.qconf, "events")
        )
        value = raw.decode(errors="replace") if isinstance(raw, bytes) else ""
        return int(value) if _digits(value) and int(value) > 0 else None

    async def events_page(
        self,
        *,
        before: str | None = None,
        count: int = 100,
        kinds: Iterable[JobEventKind | str] | None = None,
    ) -> list[JobEvent]:
        """The newest events kept (newest first), or those just older than position
        ``before`` (the last position of a previous page), at most ``count`` (1,000) events
        (from at most ``count`` stream entries). Read only; does not block.

        Raises:
            ConfigurationError: a bad ``count``, ``before`` or kind.
        """
        check_int(count, 1, "count", maximum=MAX_EVENTS_PAGE)
        wanted = _kinds(kinds)
        high, entry, upto = "+", "", 0
        if before is not None:
            if not _POSITION.match(before):
                raise ConfigurationError(f"before= must be an event's position, not {before!r}")
            entry, upto = split_position(before)
            # inside an entry of several events: that entry's earlier events come first
            high = entry if upto else "(" + entry
        scripts = self.core.door
        key = scripts.keys.events
        try:
            entries = cast(
                list[Any], await scripts.read(scripts.client.xrevrange(key, high, "-", count=count))
            )
        except ServerRefused:  # a garbled key: no events to show until it is set aside
            return []
        page: list[JobEvent] = []
        for entry_id, fields in entries:
            events = parse_entry(self.core.name, entry_id, fields)
            if upto and events and split_position(events[0].position)[0] == entry:
                events = events[: upto - 1]
            page += [e for e in reversed(events) if wanted is None or e.kind in wanted]
            if len(page) >= count:
                break
        return page[:count]
