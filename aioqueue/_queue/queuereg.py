"""Which queues exist: the real ones first, then (if there is room) the ones a SCAN finds.

A key planted under the prefix must neither hide a real queue nor flood a listing (I13), so
the queues an operator's view shows (dashboard, exporter, ``aioqueue info``) come from, in
order: the queues the App declares in code (its tasks'), the registry ``<prefix>:queues``
(ZSET queue name -> when a worker consuming it last beat, epoch ms; each worker writes it at
start and with its heartbeats), and only then, up to the limit, the queues a SCAN of
``<prefix>:{*}:stats`` finds. The registry keeps its ``REGISTRY_MAX`` most recent names.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .._model.keys import queues_registry
from .._store.loader import bounded, queue_names

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from .owner import QueueOwner

#: the most names the registry keeps (the most recently seen), and how long a name no worker
#: beat for stays a real queue
REGISTRY_MAX = 1000
REGISTRY_KEEP_MS = 7 * 24 * 3600 * 1000
#: the most queues a listing shows
MAX_QUEUES = 1000
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,200}")


def declared_queues(app: QueueOwner) -> list[str]:
    """The queues of the App's tasks."""
    return sorted({t.queue for t in app.tasks.values()})


async def declare_queues(client: aioredis.Redis, prefix: str, names: Iterable[str]) -> None:
    """Record ``names`` as real queues, seen now (a worker's start and heartbeats)."""
    key = queues_registry(prefix)
    now = int(time.time() * 1000)
    pipe = client.pipeline(transaction=False)
    pipe.zadd(key, dict.fromkeys(names, now))
    pipe.zremrangebyrank(key, 0, -REGISTRY_MAX - 1)
    pipe.pexpire(key, REGISTRY_KEEP_MS)  # a prefix nobody consumes any more leaves nothing
    await bounded(client, pipe.execute())


async def real_queues(client: aioredis.Redis, prefix: str, declared: Iterable[str]) -> list[str]:
    """The real queues: ``declared`` and the registry's recent names, sorted."""
    since = int(time.time() * 1000) - REGISTRY_KEEP_MS
    got = await bounded(
        client,
        client.zrangebyscore(queues_registry(prefix), since, "+inf", start=0, num=REGISTRY_MAX),
    )
    names = {n.decode(errors="replace") if isinstance(n, bytes) else str(n) for n in got}
    names.update(declared)
    return sorted(n for n in names if _NAME.fullmatch(n))[:MAX_QUEUES]


async def known_queues(
    client: aioredis.Redis, prefix: str, declared: Iterable[str] = (), limit: int = MAX_QUEUES
) -> list[str]:
    """The real queues, then the ones a SCAN finds, ``limit`` at most in all."""
    real = (await real_queues(client, prefix, declared))[:limit]
    room = limit - len(real)
    if room <= 0:
        return real
    seen = set(real)
    found = await queue_names(client, prefix, limit=len(real) + room)
    return real + [n for n in found if n not in seen][:room]
