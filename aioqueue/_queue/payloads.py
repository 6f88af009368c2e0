"""Orphaned payload blobs of the claim-check (``App(payload_store=...)``, ``_model/claimcheck.py``):
the blobs of jobs whose record is gone, found and deleted by ``Queue.purge`` (for the jobs it
deletes) and by ``sweep_payloads``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from .._model.checks import to_seconds
from .._model.claimcheck import ClaimChecker, job_key, queue_prefix
from .._model.exceptions import ConfigurationError

if TYPE_CHECKING:
    from .._store.scriptreads import QueueReads
    from .owner import QueueParts


async def drop_orphans(
    checker: ClaimChecker, scripts: QueueReads, queue: str, ids: Sequence[str], grace: float = 0.0
) -> int:
    """Delete the blobs of jobs of ``queue`` (read through ``scripts``) among ``ids``
    whose record is gone, and still gone ``grace`` seconds later (a producer puts a blob
    just before it stores the record). Returns how many keys were deleted."""
    gone = await _gone(scripts, ids)
    if gone and grace > 0:
        await asyncio.sleep(grace)
        gone = await _gone(scripts, gone)
    if gone:
        await checker.store.delete([job_key(checker.prefix, queue, i) for i in gone])
    return len(gone)


async def _gone(scripts: QueueReads, ids: Sequence[str]) -> list[str]:
    """The ids among ``ids`` whose job record does not exist (one pipelined round trip)."""
    if not ids:
        return []
    async with scripts.client.pipeline(transaction=False) as pipe:
        for job_id in ids:
            pipe.exists(scripts.keys.job(job_id))
        alive = await pipe.execute()
    return [i for i, n in zip(ids, alive, strict=True) if not n]


async def sweep_payloads(
    queue: QueueParts, limit: int = 10_000, cursor: str = "", grace: float | timedelta = 10.0
) -> tuple[int, str]:
    """Delete the payload blobs of ``queue`` whose job is gone (deleted by retention inside
    Redis, or purged in bulk), looking at up to ``limit`` store keys from ``cursor``. A blob
    whose record is missing is deleted only if it is still missing ``grace`` seconds later:
    an enqueue puts the blob just before it stores the record.

    Returns:
        How many blobs were deleted, and the cursor to go on from ("" once the scan is done).
    """
    wait = to_seconds(grace, "grace") or 0.0
    checker = queue.app.codec.claim
    if checker is None:
        raise ConfigurationError("sweep_payloads needs App(payload_store=...)")
    start = queue_prefix(checker.prefix, queue.name)
    deleted = seen = 0
    while seen < limit:
        keys, cursor = await checker.store.scan(start, cursor, min(1000, limit - seen))
        seen += len(keys)
        ids = [k[len(start) :] for k in keys if k.startswith(start)]
        deleted += await drop_orphans(checker, queue.door.reads, queue.name, ids, wait)
        if not cursor:
            break
    return deleted, cursor
