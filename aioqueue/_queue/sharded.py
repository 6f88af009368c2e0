"""One hot queue across shards: ``app.queue("hot", shards=K)`` is K ordinary queues,
``hot:s0`` .. ``hot:s<K-1>``, each with its own hash tag (so on a cluster they spread over
the primaries). Producers spread jobs over them; workers that consume ``hot`` run one fetch
loop per shard; reads sum the shards. What holds per shard and what globally is in
docs/scaling.md.

Which shard a job goes to:

- a job with a ``group`` goes to the group's shard (a stable hash of the group), so a
  group's priority order, concurrency limit and rate limit stay whole, in one shard;
- else a job with an explicit ``job_id`` goes to the id's shard, so enqueueing the same id
  twice is still idempotent, and ``locate`` finds it at once;
- else a ``unique`` job goes to its lock key's shard, so the lock stays global;
- else jobs go round-robin (each producer starts at a random shard).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
import zlib
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from .._model.checks import check_int, check_name, to_seconds
from .._model.exceptions import ConfigurationError, JobNotFound
from .._model.job import Job, JobState
from .._model.record import JobOptions
from .inspect import JobSummary
from .pull import Reservation
from .queue import Queue
from .unique import derived_key

if TYPE_CHECKING:
    from .owner import QueueOwner

#: most shards one queue may have
MAX_SHARDS = 256
#: how long a reserve(wait=) blocks on one shard before it looks at the others
_SLICE = 0.05


def shard_name(name: str, index: int) -> str:
    """The name of shard ``index`` of the sharded queue ``name``."""
    return f"{name}:s{index}"


def shard_index(key: str, shards: int) -> int:
    """The shard of a group, job id or unique key: a hash that every process and language
    computes alike (CRC-32 of its UTF-8)."""
    return zlib.crc32(key.encode()) % shards


class ShardedQueue:
    """A queue spread over ``shards`` sub-queues: ``app.queue("hot", shards=4)``.

    Enqueue through tasks declared on the queue (``@app.task(queue="hot")``) or with
    ``enqueue`` by name; workers consume it with ``Worker(app, queues=["hot"])`` (every shard).
    Each shard is an ordinary ``Queue`` (``queues``), for anything done per shard.
    """

    def __init__(self, app: QueueOwner, name: str, shards: int) -> None:
        self.app = app
        self.name = check_name("queue name", name)
        self.shards = check_int(shards, 1, "shards", maximum=MAX_SHARDS)
        #: the shards, as ordinary queues
        self.queues: list[Queue] = [Queue(app, shard_name(name, i)) for i in range(shards)]
        # the round-robin turn of this producer and consumer (``spread``, ``reserve``)
        self.rotation = itertools.count(random.randrange(shards))
        self._by_name = {q.name: q for q in self.queues}

    def __repr__(self) -> str:
        return f"<ShardedQueue {self.name!r} shards={self.shards}>"

    # ------------------------------------------------------------------ routing
    def shard_for(
        self, group: str | None = None, job_id: str | None = None, unique_key: str | None = None
    ) -> Queue:
        """The shard a job with these options goes to (see the module's docstring)."""
        return self.queues[self._index(group or job_id or unique_key)]

    def _index(self, key: str | None) -> int:
        return shard_index(key, self.shards) if key else next(self.rotation) % self.shards

    def shard_named(self, name: str) -> Queue:
        """The shard called ``name`` (a reservation's or a job's ``queue``).

        Raises:
            ConfigurationError: no shard of this queue has that name.
        """
        q = self._by_name.get(name)
        if q is None:
            raise ConfigurationError(f"{name!r} is not a shard of the queue {self.name!r}")
        return q

    # ------------------------------------------------------------------ producer side
    async def enqueue(
        self,
        task: str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Job[Any]:
        """Enqueue a job by task name on its shard (options: those of ``Queue.enqueue``)."""
        key = options.get("unique_key")
        shard = self.shard_for(options.get("group"), options.get("job_id"), key)
        return await shard.enqueue(task, args, kwargs, **options)

    async def locate(self, job_id: str) -> Job[Any]:
        """A handle on a job of this queue by id, on whichever shard holds it (one round
        trip per shard at most; the id's own shard is asked first).

        Raises:
            JobNotFound: no shard has a record of it.
        """
        first = shard_index(job_id, self.shards)
        for i in range(self.shards):
            q = self.queues[(first + i) % self.shards]
            if await q.door.read(q.app.redis.exists(q.door.keys.job(job_id))):
                return q.job(job_id)
        raise JobNotFound(job_id)

    # ------------------------------------------------------------------ reads (summed)
    async def counts(self) -> dict[str, int]:
        """Jobs per state, summed over the shards."""
        return _sum(await asyncio.gather(*(q.counts() for q in self.queues)))

    async def group_counts(self) -> dict[str, int]:
        """Queued jobs per group, summed over the shards."""
        return _sum(await asyncio.gather(*(q.group_counts() for q in self.queues)))

    async def stats(self) -> dict[str, int]:
        """Lifetime counters, summed over the shards."""
        return _sum(await asyncio.gather(*(q.stats() for q in self.queues)))

    async def shard_counts(self) -> list[dict[str, int]]:
        """Jobs per state of each shard, in shard order (to see the spread)."""
        return list(await asyncio.gather(*(q.counts() for q in self.queues)))

    async def jobs(
        self,
        state: str | JobState,
        *,
        task: str | None = None,
        group: str | None = None,
        limit: int = 50,
    ) -> list[JobSummary]:
        """Up to ``limit`` jobs in ``state``, taken from the shards in turn (each shard's
        first page; page through one shard with ``queues[i].jobs(..., cursor=)``)."""
        check_int(limit, 1, "limit")
        pages = await asyncio.gather(
            *(q.jobs(state, task=task, group=group, limit=limit) for q in self.queues)
        )
        mixed = itertools.chain.from_iterable(itertools.zip_longest(*(p.items for p in pages)))
        return [s for s in mixed if s is not None][:limit]

    # ------------------------------------------------------------------ settings (every shard)
    async def pause(self, group: str | None = None) -> None:
        """Pause every shard (or one group, on its shard)."""
        await self._each(group, lambda q: q.pause(group))

    async def resume(self, group: str | None = None) -> None:
        """Resume every shard (or one group, on its shard)."""
        await self._each(group, lambda q: q.resume(group))

    async def set_group_limit(self, group: str | None, limit: int | None) -> None:
        """A group's concurrency limit, on the group's shard (global: the group lives
        there); ``group=None``: the default of every group, on every shard."""
        await self._each(group, lambda q: q.set_group_limit(group, limit))

    async def set_rate_limit(
        self, limit: int | None, period: float | timedelta = 1.0, *, group: str | None = None
    ) -> None:
        """A group's rate limit on its shard (global for the group); without a group, the
        limit of EACH shard: the queue as a whole starts up to ``shards * limit`` jobs per
        period."""
        await self._each(group, lambda q: q.set_rate_limit(limit, period, group=group))

    async def _each(self, group: str | None, call: Any) -> None:
        if group is not None:
            await call(self.shard_for(group))
        else:
            await asyncio.gather(*(call(q) for q in self.queues))

    # ------------------------------------------------------------------ pull API
    async def reserve(
        self,
        n: int = 1,
        *,
        lease: float | timedelta | None = None,
        wait: float | timedelta | None = None,
    ) -> list[Reservation]:
        """Lease up to ``n`` runnable jobs from the shards, starting at the next shard of
        this consumer's rotation (so no shard is starved). With ``wait``, when every shard
        is empty, it blocks on the shards in turn, ``0.05`` s each, until one has a job or
        the time is up."""
        check_int(n, 1, "n")
        wait_s = to_seconds(wait, "wait")
        loop = asyncio.get_running_loop()
        deadline = None if wait_s is None else loop.time() + wait_s
        start = next(self.rotation)
        out: list[Reservation] = []
        for i in range(self.shards):
            q = self.queues[(start + i) % self.shards]
            out += await q.reserve(n - len(out), lease=lease)
            if len(out) >= n:
                return out
        i = 0
        while not out and deadline is not None and (left := deadline - loop.time()) > 0:
            q = self.queues[(start + i) % self.shards]
            out = await q.reserve(n, lease=lease, wait=min(left, _SLICE))
            i += 1
        return out

    async def complete(self, reservation: Reservation, result: Any = None) -> None:
        """``Queue.complete`` on the reservation's shard."""
        await self.shard_named(reservation.queue).complete(reservation, result)

    async def fail(
        self,
        reservation: Reservation,
        error: BaseException | str,
        *,
        retry: bool = True,
        delay: float | timedelta | None = None,
    ) -> bool:
        """``Queue.fail`` on the reservation's shard."""
        q = self.shard_named(reservation.queue)
        return await q.fail(reservation, error, retry=retry, delay=delay)

    async def release(
        self, reservation: Reservation, *, delay: float | timedelta = 0, refund: bool = True
    ) -> None:
        """``Queue.release`` on the reservation's shard."""
        q = self.shard_named(reservation.queue)
        await q.release(reservation, delay=delay, refund=refund)

    async def extend(
        self, reservation: Reservation, *, lease: float | timedelta | None = None
    ) -> None:
        """``Queue.extend`` on the reservation's shard."""
        await self.shard_named(reservation.queue).extend(reservation, lease=lease)


def _sum(parts: Sequence[Mapping[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for part in parts:
        for k, v in part.items():
            total[k] = total.get(k, 0) + v
    return total


def on_shard(
    sharded: ShardedQueue,
    opts: JobOptions,
    task: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> JobOptions:
    """``opts`` sent to the shard of a job of ``task`` with these arguments."""
    key = None
    if opts.unique is not None and not (opts.group or opts.job_id):
        key = opts.unique.key or derived_key(task, args, kwargs)
    shard = sharded.shard_for(opts.group, opts.job_id, key)
    return dataclasses.replace(opts, queue=shard.name)


def spread(
    sharded: ShardedQueue,
    opts: JobOptions,
    task: str,
    calls: Sequence[tuple[tuple[Any, ...], Mapping[str, Any]]],
) -> list[tuple[JobOptions, list[int]]]:
    """The calls of an ``enqueue_many`` by shard: each shard's options and the indexes of
    its calls (one shard for a group; by key for unique jobs; else round-robin)."""
    if opts.group or not calls:
        return [(on_shard(sharded, opts, task, (), {}), list(range(len(calls))))]
    if opts.unique is not None:
        key = opts.unique.key
        n = sharded.shards
        shards = [shard_index(key or derived_key(task, a, kw), n) for a, kw in calls]
    else:
        start = next(sharded.rotation)
        shards = [(start + i) % sharded.shards for i in range(len(calls))]
    parts: dict[int, list[int]] = {}
    for i, s in enumerate(shards):
        parts.setdefault(s, []).append(i)
    return [
        (dataclasses.replace(opts, queue=sharded.queues[s].name), idx)
        for s, idx in sorted(parts.items())
    ]


def shard_names(sharded: Mapping[str, ShardedQueue], name: str) -> list[str]:
    """The queues a worker consuming ``name`` takes from: its shards, or itself."""
    queue = sharded.get(name)
    return [name] if queue is None else [q.name for q in queue.queues]
