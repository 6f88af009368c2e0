"""The worker registry, read side: who consumes a queue (``Queue.workers()``).

Each worker registers on every queue it consumes and renews that registration with each
heartbeat (``lua/beat.lua``; the keys are in ``_keys.py``, the rules in
``lua/lib/workers.lua``). A worker that misses three heartbeats in a row is dead: the next
heartbeat or claim of any live worker on the queue, or ``reap``, buries it and hands its jobs
back, so they come back within four heartbeats of its death.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._store.scripts import QueueScripts

#: most workers one read lists
MAX_WORKERS = 1000


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One worker registered on a queue, as its last heartbeat described it."""

    id: str
    host: str
    pid: int
    version: str
    #: the queues it consumes
    queues: tuple[str, ...]
    concurrency: int
    started: datetime | None
    last_beat: datetime | None
    #: its heartbeats are on time; False: it missed three and is about to be buried
    alive: bool
    #: jobs of this queue leased to it now (running, prefetched, or finished but not acked)
    jobs_held: int
    #: jobs it completed and failed (attempts) since it started, on all its queues
    done: int
    failed: int
    #: it signs (``App(signing_key=...)``): it runs only jobs signed by a key holder
    signs: bool = False


def _int(raw: dict[bytes, bytes], field: bytes) -> int:
    try:
        return int(raw.get(field, b"0"))
    except ValueError:
        return 0


def _time(raw: dict[bytes, bytes], field: bytes) -> datetime | None:
    ms = _int(raw, field)
    if ms <= 0:
        return None
    try:
        return datetime.fromtimestamp(ms / 1000, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _str(raw: dict[bytes, bytes], field: bytes) -> str:
    return raw.get(field, b"").decode(errors="replace")


async def read_workers(scripts: QueueScripts) -> list[WorkerInfo]:
    """The workers registered on a queue (at most ``MAX_WORKERS``), by heartbeat deadline."""
    now, entries = await scripts.workers(MAX_WORKERS)
    out = []
    for wid, deadline, raw, held in entries:
        queues = _str(raw, b"queues")
        out.append(
            WorkerInfo(
                id=wid,
                host=_str(raw, b"host"),
                pid=_int(raw, b"pid"),
                version=_str(raw, b"ver"),
                queues=tuple(q for q in queues.split(",") if q),
                concurrency=_int(raw, b"conc"),
                started=_time(raw, b"st"),
                last_beat=_time(raw, b"beat"),
                alive=deadline > now,
                jobs_held=held,
                done=_int(raw, b"done"),
                failed=_int(raw, b"failed"),
                signs=raw.get(b"sg") == b"1",
            )
        )
    return out
