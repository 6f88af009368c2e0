"""What the dashboard's pages show, read through the operator API only (``Queue.counts``,
``throughput``, ``groups``, ``jobs``, ``job_detail``, ``workers``, ``app.schedules.list``):
plain dicts of display values, the same for a page and for its live JSON endpoint."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from aioqueue._app.app import App
from aioqueue._app.batch import Batch
from aioqueue._model.exceptions import AioQueueError, ConfigurationError
from aioqueue._model.job import JobState
from aioqueue._queue.inspect import JobDetail, JobSummary, ResultState
from aioqueue._queue.queue import Queue
from aioqueue._queue.queuereg import declared_queues, known_queues
from aioqueue._queue.registry import WorkerInfo
from aioqueue._queue.search import SearchPage

#: the states a queue page has a tab for, in the order of a job's life
TABS = ("scheduled", "queued", "active", "failed", "completed", "cancelled")
#: the most characters of arguments, results and tracebacks a page shows
MAX_TEXT = 20_000
#: how long the list of queue names (a SCAN of the database) is reused
NAMES_TTL = 30.0
#: the most batches a queue page shows (those of the jobs it lists)
MAX_BATCHES = 20


def when(ms: int | None) -> str:
    """An epoch-ms time as ``YYYY-MM-DD HH:MM:SS`` UTC; ``-`` for none."""
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def ago(dt: datetime | None, now: datetime) -> str:
    """How long before ``now``: ``4s``, ``3m``, ``2h 5m``, ``3d 1h``."""
    if dt is None:
        return "-"
    s = max(0, int((now - dt).total_seconds()))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def pretty(value: Any) -> str:
    """User data as indented JSON where it is JSON, else its repr; clipped to ``MAX_TEXT``."""
    try:
        text = json.dumps(value, indent=2, ensure_ascii=False, default=repr)
    except (TypeError, ValueError):
        text = repr(value)
    return clip(text)


def clip(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit} more)"


class Names:
    """The queue names under the App's prefix: the ones given, or the real ones then those a
    SCAN finds (``_queuereg.known_queues``), reused for ``NAMES_TTL`` seconds (a SCAN is
    O(keys in the database))."""

    def __init__(self, app: App, fixed: tuple[str, ...] | None) -> None:
        self.app = app
        self.fixed = fixed
        self._cached: list[str] = []
        self._at = -NAMES_TTL

    async def get(self) -> list[str]:
        if self.fixed is not None:
            return list(self.fixed)
        if time.monotonic() - self._at >= NAMES_TTL:
            app = self.app
            self._cached = await known_queues(app.redis, app.prefix, declared_queues(app))
            self._at = time.monotonic()
        return list(self._cached)


# --------------------------------------------------------------------- overview
async def queue_row(app: App, name: str) -> dict[str, Any]:
    q = app.queue(name)
    counts = await q.counts()
    tp = await q.throughput(60)
    workers = await q.workers()
    groups = await q.groups(limit=1000)
    return {
        "name": name,
        "counts": counts,
        "paused": await q.is_paused(),
        "paused_groups": [g.name for g in groups if g.paused],
        "groups": len(groups),
        "workers": sum(1 for w in workers if w.alive),
        "completed_1h": tp.completed,
        "failed_1h": tp.failed,
        "minutes": [(m.start_ms, m.completed, m.failed) for m in tp.minutes],
    }


async def overview(app: App, names: list[str]) -> dict[str, Any]:
    rows = [await queue_row(app, n) for n in names]
    minutes: dict[int, list[int]] = {}
    for r in rows:
        for start, done, failed in r["minutes"]:
            m = minutes.setdefault(start, [0, 0])
            m[0] += done
            m[1] += failed
    series = [(s, c, f) for s, (c, f) in sorted(minutes.items())]
    alive: set[str] = set()
    for n in names:
        alive |= {w.id for w in await app.queue(n).workers() if w.alive}
    return {
        "queues": rows,
        "series": series,
        "workers": len(alive),
        "completed_1h": sum(r["completed_1h"] for r in rows),
        "failed_1h": sum(r["failed_1h"] for r in rows),
    }


# --------------------------------------------------------------------- a queue
def took(started_ms: int | None, ended_ms: int | None) -> str:
    """A duration: ``850ms``, ``4.2s``, ``3m 5s``, ``2h 5m``; ``-`` without both ends."""
    if started_ms is None or ended_ms is None or ended_ms < started_ms:
        return "-"
    ms = ended_ms - started_ms
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    return ago(datetime.fromtimestamp(0, UTC), datetime.fromtimestamp(ms / 1000, UTC))


def summary_row(s: JobSummary) -> dict[str, Any]:
    ended = s.finished_ms if s.state is not JobState.SCHEDULED else None
    running = s.state is JobState.ACTIVE
    return {
        "took": took(s.started_ms, int(time.time() * 1000) if running else ended),
        "id": s.id,
        "task": s.task,
        "group": s.group or "-",
        "priority": s.priority,
        "attempts": f"{s.attempts}/{s.max_attempts}",
        "created": when(s.created_ms),
        "due": when(s.due_ms),
        "finished": when(ended),
        "error": "" if s.error is None else f"{s.error.type}: {s.error.message}"[:300],
        "batch": s.batch or "",
    }


@dataclass(frozen=True)
class Listing:
    """What a listing shows: a state's jobs, filtered, in an order (a page's query)."""

    state: str = "queued"
    task: str = ""
    group: str = ""
    error: str = ""
    text: str = ""
    order: str = "oldest"

    @classmethod
    def of(cls, params: Mapping[str, str]) -> Listing:
        """From a query or form; an unknown state is a ConfigurationError (a 400)."""
        state = params.get("state", "") or "queued"
        if state not in TABS:
            raise ConfigurationError(f"unknown state {state!r}")
        got = {k: params.get(k, "").strip() for k in ("task", "group", "error", "text")}
        # dead letters: the newest first unless asked otherwise
        order = params.get("order") or ("newest" if state == "failed" else "oldest")
        return cls(state=state, order="newest" if order == "newest" else "oldest", **got)

    @property
    def query(self) -> dict[str, str]:
        """The query string's fields (the empty ones left out)."""
        return {k: v for k, v in asdict(self).items() if v}

    @property
    def searching(self) -> bool:
        """Whether text filters make the listing read records to match (bounded per page)."""
        return bool(self.error or self.text)

    async def page(self, q: Queue, cursor: str | None, limit: int = 50) -> SearchPage:
        return await q.search(
            self.state,
            task=self.task or None,
            group=self.group or None,
            error=self.error,
            text=self.text,
            cursor=cursor,
            newest_first=self.order == "newest",
            limit=limit,
        )


async def all_counts(q: Queue) -> dict[str, int]:
    """Jobs per state, every tab's (completed and cancelled: the listing indexes)."""
    return {**await q.counts(), **await q.finished_counts()}


async def queue_page(
    app: App, name: str, listing: Listing, cursor: str | None, limit: int = 50
) -> dict[str, Any]:
    q = app.queue(name)
    counts = await all_counts(q)
    page = await listing.page(q, cursor, limit)
    groups = await q.groups(limit=200)
    schedules = await app.schedules.list(queues=[name])
    batch_ids = list(dict.fromkeys(s.batch for s in page.items if s.batch))[:MAX_BATCHES]
    batches = [b for b in [await batch_row(q, bid) for bid in batch_ids] if b is not None]
    return {
        "name": name,
        "counts": counts,
        "paused": await q.is_paused(),
        "jobs": [summary_row(s) for s in page.items],
        "cursor": page.cursor,
        "scanned": page.scanned,
        "total": counts.get(listing.state, 0),
        "batches": batches,
        "groups": [
            {
                "name": g.name,
                "queued": g.queued,
                "active": g.active,
                "limit": "-" if g.limit is None else g.limit,
                "rate": "-" if g.rate is None else f"{g.rate} per {g.rate_seconds:g}s",
                "paused": g.paused,
            }
            for g in groups
        ],
        "schedules": [
            {
                "name": s.name,
                "task": s.task,
                "when": s.cron or (f"every {s.every.total_seconds():g}s" if s.every else "-"),
                "next": "-" if s.next_run is None else s.next_run.strftime("%Y-%m-%d %H:%M:%S"),
            }
            for s in schedules
        ],
    }


# --------------------------------------------------------------------- batches, a job
async def batch_row(q: Queue, batch_id: str) -> dict[str, Any] | None:
    """A batch homed on ``q`` with its progress; None when it is not there (expired, or
    homed on another queue)."""
    try:
        b = await Batch(q, batch_id).info()
    except AioQueueError:
        return None
    return {
        "id": b.id,
        "state": b.state.value,
        "total": b.total,
        "done": b.done,
        "failed": b.failed,
        "sealed": b.sealed,
        "percent": 0 if b.total == 0 else round(100 * (b.done + b.failed) / b.total),
    }


async def job_page(app: App, name: str, job_id: str) -> dict[str, Any]:
    d: JobDetail = await app.queue(name).job_detail(job_id)
    info = d.info
    batch = None
    if d.batch is not None:
        batch = await batch_row(app.queue(name), d.batch) or {
            "id": d.batch,
            "state": "unknown",
            "total": 0,
            "done": 0,
            "failed": 0,
            "sealed": False,
            "percent": 0,
        }
    err = info.error
    # an encrypted job read without its key: no plaintext to show, and not garbage either
    unread = "(encrypted)" if info.encrypted else "(cannot be decoded)"
    result = "-"
    if info.state is JobState.COMPLETED:
        result = unread if info.encrypted and info.args is None else d.result_text()
        if d.result_state is ResultState.OK:
            result = pretty(d.result)
    history = [
        {
            "number": a.number,
            "worker": a.worker or "-",
            "started": when(a.started_ms),
            "ended": when(a.ended_ms),
            "took": "-"
            if a.started_ms is None or a.ended_ms is None
            else f"{(a.ended_ms - a.started_ms) / 1000:.3f}s",
            "outcome": a.outcome,
            "error": "" if a.error_type is None else f"{a.error_type}: {a.error_message or ''}",
        }
        for a in d.history
    ]
    why = await app.queue(name).why(job_id)
    return {
        "id": info.id,
        "queue": info.queue,
        "task": info.task,
        "why": why.sentence(),
        "state": info.state.value,
        "attempts": f"{info.attempts}/{info.max_attempts}",
        "priority": str(info.priority),
        "group": d.group or "-",
        "batch": batch,
        "created": when(info.created_ms),
        "due": when(info.due_ms),
        "started": when(d.started_ms),
        "lease": when(d.lease_deadline_ms),
        "finished": when(info.finished_ms),
        "cancel_requested": "yes" if d.cancel_requested else "no",
        "progress": "-" if info.progress is None else clip(pretty(info.progress), 2000),
        "args": pretty(list(info.args)) if info.args is not None else unread,
        "kwargs": pretty(info.kwargs) if info.kwargs is not None else unread,
        "options": pretty(d.options) if d.options else "-",
        "result": result,
        "error": "-" if err is None else clip(f"{err.type}: {err.message}", 2000),
        "traceback": "" if err is None or not err.traceback else clip(err.traceback),
        "history": history,
        "logs": [
            {"at": when(int(t * 1000)) if t else "-", "level": level, "message": clip(msg, 2000)}
            for t, level, msg in d.logs
        ],
        "garbled": ", ".join(info.garbled),
    }


# --------------------------------------------------------------------- workers
async def workers_page(app: App, names: list[str]) -> list[dict[str, Any]]:
    seen: dict[str, tuple[WorkerInfo, int]] = {}
    for n in names:
        for w in await app.queue(n).workers():
            held = seen[w.id][1] if w.id in seen else 0
            seen[w.id] = (w, held + w.jobs_held)
    now = datetime.now(UTC)
    rows = []
    for w, held in sorted(seen.values(), key=lambda x: (not x[0].alive, x[0].id)):
        rows.append(
            {
                "id": w.id,
                "host": w.host,
                "pid": w.pid,
                "version": w.version,
                "queues": ", ".join(w.queues),
                "concurrency": w.concurrency,
                "uptime": ago(w.started, now),
                "beat": ago(w.last_beat, now) + " ago" if w.last_beat else "-",
                "alive": w.alive,
                "held": held,
                "done": w.done,
                "failed": w.failed,
            }
        )
    return rows
