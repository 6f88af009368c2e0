"""A queue's trends over the last hour, day or week (the dashboard's charts): jobs completed
and dead-lettered per bucket, per task, and the highest backlog and wait sampled, read from
the compact per-bucket counters of ``lua/lib/trends.lua`` (at most 168 hashes a read)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._model.exceptions import ConfigurationError
from .._store.scripts import QueueScripts

#: span -> (bucket resolution, bucket ms, buckets shown)
SPANS = {"hour": ("m", 60_000, 60), "day": ("h", 3_600_000, 24), "week": ("h", 3_600_000, 168)}
#: the most tasks a trend lists (the busiest; a bucket counts at most 50 by name)
MAX_TASKS = 50
_MAX = 2**53


@dataclass(frozen=True, slots=True)
class TrendPoint:
    """One bucket: jobs completed and dead-lettered in it (of every task, or of one), and
    the highest backlog (queued jobs) sampled in it and the wait (seconds; None: no sample).
    Of the queue, the wait is the longest a worker's beat sampled (the head of its lanes);
    of a task, the longest its jobs started in the bucket had waited since they were due."""

    start_ms: int
    completed: int
    failed: int
    backlog: int | None = None
    wait: float | None = None


@dataclass(frozen=True, slots=True)
class Trends:
    """A queue's trends over a span: its points (oldest first) and each task's points."""

    span: str
    points: tuple[TrendPoint, ...]
    tasks: dict[str, tuple[TrendPoint, ...]] = field(default_factory=dict)


def _count(v: bytes | None) -> int | None:
    """A stored count, or None for anything that is no count (garbage reads as none)."""
    try:
        n = int(v) if v is not None else None
    except ValueError:
        return None
    return n if n is not None and 0 <= n < _MAX else None


async def trends(scripts: QueueScripts, span: str) -> Trends:
    """A queue's trends over the last ``span``: see ``Queue.trends``."""
    if span not in SPANS:
        raise ConfigurationError(f"span must be one of {', '.join(SPANS)}, got {span!r}")
    res, ms, n = SPANS[span]
    now = await scripts.server_ms() // ms
    buckets = list(range(now - n + 1, now + 1))
    rows = await scripts.trend_buckets(res, buckets)
    per_task: dict[str, list[list[int | None]]] = {}
    points = []
    for i, (b, row) in enumerate(zip(buckets, rows, strict=True)):
        done = failed = 0
        for raw, value in row.items():
            kind, sep, task = raw.decode(errors="replace").partition(":")
            count = _count(value)
            if not sep or kind not in _KINDS or count is None:
                continue
            slot = per_task.setdefault(task, [[0, 0, None, None] for _ in buckets])[i]
            slot[_KINDS[kind]] = count
            if kind == "c":
                done += count
            elif kind == "f":
                failed += count
        wait = _count(row.get(b"w"))
        points.append(
            TrendPoint(
                b * ms, done, failed, _count(row.get(b"b")), None if wait is None else wait / 1000
            )
        )
    # a task without a backlog field in a sampled bucket had none queued then
    for slots in per_task.values():
        for slot, point in zip(slots, points, strict=True):
            if point.backlog is not None and slot[2] is None:
                slot[2] = 0
    busiest = sorted(per_task, key=lambda t: -sum(_busy(s) for s in per_task[t]))[:MAX_TASKS]
    tasks = {
        t: tuple(_point(b * ms, s) for b, s in zip(buckets, per_task[t], strict=True))
        for t in sorted(busiest)
    }
    return Trends(span, tuple(points), tasks)


#: a bucket's per-task fields: kind -> its place in a task's slot (completed, dead-lettered,
#: the highest backlog sampled, the longest wait in ms of its jobs started in the bucket)
_KINDS = {"c": 0, "f": 1, "b": 2, "w": 3}


def _busy(slot: list[int | None]) -> int:
    """How much a task did and waited in a bucket (the busiest tasks are listed)."""
    return sum(v or 0 for v in slot[:3])


def _point(start_ms: int, slot: list[int | None]) -> TrendPoint:
    c, f, backlog, wait = slot
    return TrendPoint(start_ms, c or 0, f or 0, backlog, None if wait is None else wait / 1000)
