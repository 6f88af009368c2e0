"""The task table of a queue: the task names its live workers serve, with the defaults their
code declares (``lua/tasks.lua``; the key is ``<prefix>:{<queue>}:tasks``).

A worker writes its App's tasks there when it starts and once a minute after (not with every
heartbeat: a heartbeat costs the same whatever the number of tasks). Enqueue by name reads it:
a task a live worker declared gets that task's defaults (``max_attempts``, ``priority``,
``timeout``, ``result_ttl``); a name no live worker knows, while live workers serve the queue,
is refused with ``UnknownTask`` and a suggestion. A worker also samples the heads of its
queues' lanes when it starts and warns about jobs of tasks it does not know (two projects on
one prefix dead-letter each other's jobs).
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._model.exceptions import UnknownTask

if TYPE_CHECKING:
    from .._store.scriptreads import QueueReads
    from .._store.scripts import QueueScripts
    from .owner import QueueOwner

logger = logging.getLogger("aioqueue._worker.worker")

#: most task names one worker declares on a queue (sorted by name; the rest are not checked)
MAX_TASKS = 1000
#: seconds between two writes of a worker's task table (it is written when the worker starts)
REFRESH = 60.0
#: seconds a producer trusts a task it found declared before it reads the table again
KNOWN_FOR = 5.0
#: jobs sampled from the head of each lane of a queue when a worker starts
SAMPLE = 50


@dataclass(frozen=True, slots=True)
class Declared:
    """A task's defaults as its workers' code declares them (``@app.task(...)``)."""

    queue: str
    max_attempts: int
    priority: int
    #: seconds (None: no timeout)
    timeout: float | None
    #: seconds its results are kept (None: the App's default; -1: for good)
    result_ttl: float | None


def declared_table(app: QueueOwner) -> list[str]:
    """Task name, defaults (JSON), name, defaults...: what a worker of ``app`` declares."""
    flat: list[str] = []
    for name in sorted(app.tasks)[:MAX_TASKS]:
        t = app.tasks[name]
        d = Declared(t.queue, t.max_attempts, t.priority, t.timeout, t.result_ttl)
        flat += [name, json.dumps({f: getattr(d, f) for f in Declared.__slots__})]
    return flat


class Known:
    """A producer's memory of what a queue's table said of a task, each answer for
    ``KNOWN_FOR`` seconds: the task's declared defaults, or that the name was let through
    because no live worker serves the queue. Enqueue by name in a loop reads the
    table every few seconds, not once per job (a worker that starts meanwhile is seen within
    that time)."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: dict[str, tuple[float, Declared | None]] = {}

    def get(self, name: str) -> tuple[Declared | None] | None:
        """``(defaults,)`` (None: none known, let through) while remembered; else None."""
        seen = self._seen.get(name)
        return (seen[1],) if seen is not None and time.monotonic() < seen[0] else None

    def put(self, name: str, declared: Declared | None) -> None:
        if len(self._seen) >= MAX_TASKS:
            self._seen.clear()
        self._seen[name] = (time.monotonic() + KNOWN_FOR, declared)


def _number(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _declared(raw: bytes) -> Declared | None:
    """The defaults stored in the table (None: garbled, or written by another version)."""
    try:
        d = json.loads(raw)
        attempts, priority = d["max_attempts"], d["priority"]
        if not (isinstance(attempts, int) and isinstance(priority, int)) or attempts < 1:
            return None
        return Declared(
            str(d["queue"]), attempts, priority, _number(d["timeout"]), _number(d["result_ttl"])
        )
    except (ValueError, TypeError, KeyError):
        return None


@dataclass(frozen=True, slots=True)
class Lookup:
    """What the task table says of one name on one queue."""

    queue: str
    name: str
    #: a live worker is registered on the queue
    live: bool
    #: the task's defaults, if a live worker declared it
    declared: Declared | None
    #: the names live workers declared (when ``declared`` is None)
    names: tuple[str, ...]

    @property
    def unknown(self) -> bool:
        """Live workers serve the queue, some declared their tasks, and none this name (live
        workers that declared nothing, of an older version, cannot tell)."""
        return self.live and self.declared is None and bool(self.names)

    def message(self) -> str:
        text = f"no live worker on queue {self.queue!r} knows a task named {self.name!r}"
        close = difflib.get_close_matches(self.name, self.names, n=3)
        if close:
            text += "; did you mean " + " or ".join(repr(c) for c in close) + "?"
        return text

    def check(self, allow_unknown: bool) -> Declared | None:
        """The task's declared defaults; ``UnknownTask`` if no live worker knows it (unless
        ``allow_unknown``)."""
        if self.unknown and not allow_unknown:
            raise UnknownTask(self.message() + " (allow_unknown=True enqueues it anyway)")
        return self.declared


def parse(queue: str, name: str, reply: Sequence[Any]) -> Lookup:
    """The reply of ``tasks.lua``'s get."""
    declared = _declared(reply[1]) if reply[1] else None
    names = tuple(n.decode(errors="replace") for n in reply[2:])
    return Lookup(queue, name, bool(reply[0]), declared, names)


def get_args(base: str, name: str) -> tuple[str, ...]:
    return (base, "get", name, str(MAX_TASKS))


async def lookup(scripts: QueueScripts, queue: str, name: str) -> Lookup:
    """What the table of ``queue`` says of task ``name`` (one round trip)."""
    return parse(queue, name, await scripts.run("tasks", get_args(scripts.base, name)))


async def register(scripts: QueueScripts, worker_id: str, table: Sequence[str]) -> None:
    """Write a worker's task table on one queue."""
    await scripts.run("tasks", (scripts.base, "put", worker_id, *table))


async def strangers(scripts: QueueReads, known: set[str]) -> dict[str, int]:
    """Of the jobs at the head of the queue's lanes (``SAMPLE`` of each), how many belong to
    each task not in ``known``."""
    k = scripts.keys
    pipe = scripts.client.pipeline(transaction=False)
    pipe.lrange(k.ready, 0, SAMPLE - 1)
    pipe.zrange(k.prio, 0, SAMPLE - 1)
    pipe.zrange(k.scheduled, 0, SAMPLE - 1)
    heads = await scripts.read(pipe.execute())
    ids = list(dict.fromkeys(i.decode(errors="replace") for head in heads for i in head))
    counts: dict[str, int] = {}
    for (raw,) in await scripts.job_fields(ids, ["t"]) if ids else []:
        task = (raw or b"").decode(errors="replace")
        if task and task not in known:
            counts[task] = counts.get(task, 0) + 1
    return counts


def warn_strangers(queue: str, counts: dict[str, int], sampled_prefix: str) -> None:
    """The one warning of a worker that found jobs of tasks it does not know at start."""
    if not counts:
        return
    top = sorted(counts.items(), key=lambda c: -c[1])[:5]
    named = ", ".join(f"{t!r} ({n} jobs)" for t, n in top)
    logger.warning(
        "queue %s: jobs of tasks this worker does not know wait at the head of the queue: %s. "
        "Is another project using the same prefix %r (give each its own App(prefix=...)), "
        "or are these from a newer deploy?",
        queue,
        named,
        sampled_prefix,
    )
