"""``python -m aioqueue schedules``: the stored periodic schedules and their next runs, as a
table or as JSON."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

from .._app.app import App
from .._app.schedules import ScheduleInfo
from .._model.exceptions import AioQueueError
from .format import error

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def list_schedules(
    url: str | None, prefix: str, queues: Sequence[str] | None, *, as_json: bool
) -> int:
    """Print the schedules; the exit code (a failure is one line on stderr)."""
    try:
        app = App(url, prefix=prefix)
    except AioQueueError as exc:
        error(exc)
        return EXIT_USAGE
    try:
        infos = asyncio.run(_read(app, queues))
    except AioQueueError as exc:
        error(f"{type(exc).__name__}: {exc}")
        return EXIT_ERROR
    if as_json:
        print(json.dumps([as_record(i) for i in infos], indent=2))
    else:
        print(table(infos, time.time()))
    return EXIT_OK


async def _read(app: App, queues: Sequence[str] | None) -> list[ScheduleInfo]:
    async with app:
        return await app.schedules.list(queues=queues)


def as_record(info: ScheduleInfo) -> dict[str, Any]:
    """A schedule as JSON: times as ISO 8601 (UTC) and epoch ms, durations in seconds."""
    nxt = info.next_run
    return {
        "name": info.name,
        "queue": info.queue,
        "task": info.task,
        "cron": info.cron,
        "tz": info.tz,
        "every_seconds": None if info.every is None else info.every.total_seconds(),
        "args": list(info.args),
        "kwargs": info.kwargs,
        "missed": info.missed,
        "jitter_seconds": info.jitter.total_seconds(),
        "grace_seconds": info.grace.total_seconds(),
        "next_run": None if nxt is None else nxt.isoformat(),
        "next_run_ms": None if nxt is None else int(nxt.timestamp() * 1000),
        "declared": info.declared,
    }


def table(infos: Sequence[ScheduleInfo], now: float) -> str:
    """A human table: one line per schedule, next run in UTC and from now."""
    if not infos:
        return "no schedules"
    rows = [("NAME", "QUEUE", "TASK", "WHEN", "MISSED", "NEXT RUN (UTC)", "IN")]
    for i in infos:
        if i.cron is not None:
            when = f"{i.cron} ({i.tz or 'UTC'})"
        else:
            assert i.every is not None
            when = f"every {i.every.total_seconds():g} s"
        nxt = i.next_run
        rows.append(
            (
                i.name,
                i.queue,
                i.task,
                when,
                i.missed,
                "-" if nxt is None else nxt.strftime("%Y-%m-%d %H:%M:%S"),
                "-" if nxt is None else _span(nxt.timestamp() - now),
            )
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def _span(seconds: float) -> str:
    if seconds < 0:
        return "due"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"
