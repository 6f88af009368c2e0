"""``Queue.rekey()`` (and ``python -m aioqueue rekey``): sign and encrypt again, with the first
of the App's keys, every stored value signed or encrypted with another listed key: the
payloads of the queue's jobs in every state (scheduled, queued, active, failed, completed,
cancelled), their results, and the copies of results in its batches.

The records are found with SCAN (an operator's command, not a hot path), read in bounded
batches, re-sealed here (where the keys are) and written back by ``rekey.lua``, a
compare-and-set per record: a job claimed, finished, retried or deleted meanwhile keeps what
it has (counted in ``changed``; run ``rekey`` again for it). A value that no listed key
accepts (tampered, or sealed with a key already dropped) is left as it is and counted in
``unreadable``: a worker dead-letters such a job with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from .._model.codec import describe_error
from .._model.keys import split_queue_member

if TYPE_CHECKING:
    from .owner import QueueParts

#: reasons kept in a report (the first ones)
_REASONS_KEPT = 20


@dataclass(frozen=True, slots=True)
class RekeyReport:
    """What ``Queue.rekey()`` did on one queue."""

    queue: str
    #: job records looked at
    jobs: int = 0
    #: payloads signed / encrypted again with the first keys
    payloads: int = 0
    #: results (field ``r``) sealed again
    results: int = 0
    #: results held by batches of this queue sealed again
    batch_results: int = 0
    #: records (jobs, batch results) already sealed with the first keys, or not sealed at all
    current: int = 0
    #: records left as they were because they changed while being rekeyed (run it again)
    changed: int = 0
    #: values no listed key accepts (tampered, or sealed with a key no longer listed)
    unreadable: int = 0
    #: the first reasons of ``unreadable`` (``"job '<id>' payload: <reason>"``; ids as
    #: reprs, so nothing read from Redis prints control characters)
    reasons: tuple[str, ...] = ()


class _Tally:
    def __init__(self, queue: str) -> None:
        self.counts = dict.fromkeys(
            ("jobs", "payloads", "results", "batch_results", "current", "changed", "unreadable"),
            0,
        )
        self.queue = queue
        self.reasons: list[str] = []

    def bad(self, where: str, exc: Exception) -> None:
        self.counts["unreadable"] += 1
        if len(self.reasons) < _REASONS_KEPT:
            self.reasons.append(f"{where}: {describe_error(exc)}")

    def report(self) -> RekeyReport:
        return RekeyReport(self.queue, **self.counts, reasons=tuple(self.reasons))


async def rekey(queue: QueueParts, batch: int = 200) -> RekeyReport:
    """Rekey ``queue``'s stored values, ``batch`` records a step (see the module)."""
    scripts = queue.door
    tally = _Tally(queue.name)
    chunk: list[bytes] = []
    async for key in scripts.client.scan_iter(match=f"{scripts.base}job:*", count=batch):
        chunk.append(cast(bytes, key))
        if len(chunk) >= batch:
            await _jobs(queue, chunk, tally)
            chunk = []
    if chunk:
        await _jobs(queue, chunk, tally)
    async for key in scripts.client.scan_iter(match=f"{scripts.base}batch:*:res", count=batch):
        await _batch_results(queue, cast(bytes, key), tally, batch)
    return tally.report()


async def _jobs(queue: QueueParts, keys: Sequence[bytes], tally: _Tally) -> None:
    scripts, codec, name = queue.door, queue.app.codec, queue.name
    pipe = scripts.client.pipeline(transaction=False)
    for key in keys:
        pipe.hmget(key, "t", "p", "o", "r")
    rows = await scripts.read(pipe.execute(raise_on_error=False))
    for key, row in zip(keys, rows, strict=True):
        sub = key[len(scripts.base) :].decode(errors="surrogateescape")
        job_id = sub[len("job:") :]
        if isinstance(row, Exception) or row[1] is None:  # not a job's hash (set aside, gone)
            continue
        tally.counts["jobs"] += 1
        task = (row[0] or b"").decode(errors="replace")
        payload, options, result = row[1], row[2] or b"", row[3]
        triples: list[bytes | str] = []
        try:
            new = codec.rekey_payload(name, job_id, task, options, payload)
            if new is not None:
                triples += ["p", payload, new]
        except Exception as exc:
            tally.bad(f"job {job_id!r} payload", exc)
        if result:
            try:
                new = codec.rekey_result(name, job_id, result)
                if new is not None:
                    triples += ["r", result, new]
            except Exception as exc:
                tally.bad(f"job {job_id!r} result", exc)
        if not triples:
            tally.counts["current"] += 1
            continue
        written, _ = await _write(queue, [sub, len(triples) // 3, *triples])
        if written:
            tally.counts["payloads"] += "p" in triples[::3]
            tally.counts["results"] += "r" in triples[::3]
        else:
            tally.counts["changed"] += 1


async def _batch_results(queue: QueueParts, key: bytes, tally: _Tally, batch: int) -> None:
    """The results a batch of this queue holds, each bound to its member job."""
    scripts, codec = queue.door, queue.app.codec
    sub = key[len(scripts.base) :].decode(errors="surrogateescape")
    async for field, value in scripts.client.hscan_iter(key, count=batch):
        member = cast(bytes, field).decode(errors="surrogateescape")
        home, job_id = split_queue_member(queue.app.prefix, member) or (queue.name, member)
        try:
            new = codec.rekey_result(home, job_id, cast(bytes, value))
        except Exception as exc:
            tally.bad(f"job {job_id!r} result in {sub!r}", exc)
            continue
        if new is None:
            tally.counts["current"] += 1
        elif (await _write(queue, [sub, 1, field, value, new]))[0]:
            tally.counts["batch_results"] += 1
        else:
            tally.counts["changed"] += 1


async def _write(queue: QueueParts, entry: Sequence[Any]) -> tuple[int, int]:
    """rekey.lua on one entry: (written, changed)."""
    scripts = queue.door
    res = await scripts.run("rekey", (scripts.base, *entry))
    return int(res[0]), int(res[1])
