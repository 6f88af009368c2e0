"""Leased jobs, from a consumer's side: what a worker and the pull API ask of a queue.

``Leases`` binds a queue's scripts to its App's settings (retention of dead letters, the
codec of errors and payloads), so a worker and ``Queue.reserve``/``complete``/``fail``/... take
the same path for every transition of a leased job and judge a corrupt record the same way.
``forward_outbox`` hands the outcomes of finished sub-jobs over to their batches on other
queues (workers after an ack, ``Queue.complete`` and ``Queue.reap``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._model.checks import check_name
from .._model.exceptions import RateLimited
from .._model.limits import MAX_ACKS_PER_CALL, MAX_JOBS_PER_CALL
from .._model.record import Claimed, ClaimResult
from .._store.outcomes import FailMode, Outcome, Started
from .depsbox import forward_call, forward_entry

if TYPE_CHECKING:
    from .._store.hot import OrderedLine
    from .owner import QueueParts

logger = logging.getLogger(__name__)


class Leases:
    """One queue's leases: claim, complete, fail, release, renew, and the waits of a consumer."""

    __slots__ = ("codec", "dead_ttl_ms", "name", "scripts")

    def __init__(self, queue: QueueParts) -> None:
        app = queue.app
        self.name = queue.name
        self.scripts = queue.door
        self.codec = app.codec
        self.dead_ttl_ms = app.dead_ttl_ms

    def decode(
        self, c: Claimed, blob: bytes | None = None
    ) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]:
        """A leased job's arguments and options (``blob``: its claim-checked payload).

        Raises:
            BadSignature: signing is on and the payload or options are unsigned or forged.
            Unrunnable: ``CorruptPayload``, the record cannot be decoded.
        """
        return self.codec.load_job(self.name, c.id, c.task, c.payload, c.options, blob)

    async def claim(
        self,
        n: int,
        lease_ms: int,
        worker_id: str = "",
        park_ms: int = 0,
        started: Started = None,
        line: OrderedLine | None = None,
    ) -> ClaimResult:
        """Lease up to ``n`` jobs (see ``QueueScripts.claim``)."""
        return await self.scripts.claim(
            n, lease_ms, self.dead_ttl_ms, worker_id, park_ms, started, line=line
        )

    async def complete_claim(
        self,
        acks: Sequence[tuple[str, str, bytes, int]],
        n: int,
        lease_ms: int,
        worker_id: str = "",
        park_ms: int = 0,
        started: Started = None,
        line: OrderedLine | None = None,
    ) -> tuple[ClaimResult, list[Outcome]]:
        """Finish ``acks`` and lease up to ``n`` jobs in one round trip."""
        res = await self.scripts.complete_claim(
            acks, n, lease_ms, self.dead_ttl_ms, worker_id, park_ms, started, line=line
        )
        self._completed(acks, res[1])
        return res

    async def beat(
        self,
        worker_id: str,
        period_ms: int,
        lease_ms: int,
        started: int,
        info: Sequence[object],
        pairs: Sequence[tuple[str, str]],
        sample: tuple[int, int] | None = None,
    ) -> list[Outcome]:
        """A worker's heartbeat: its registration, the renewal of its leases (those past the
        first ``MAX_JOBS_PER_CALL``, which one call takes at most, renewed by extend), the
        burial of a worker that missed its deadline, and the queue's (backlog, wait ms) for
        its trends when ``sample`` is given."""
        head, rest = pairs[:MAX_JOBS_PER_CALL], pairs[MAX_JOBS_PER_CALL:]
        out = await self.scripts.beat(
            worker_id, period_ms, lease_ms, started, info, head, self.dead_ttl_ms, sample
        )
        for i in range(0, len(rest), MAX_JOBS_PER_CALL):
            out += await self.scripts.extend(rest[i : i + MAX_JOBS_PER_CALL], lease_ms)
        return out

    async def job_age_ms(self, job_id: str) -> int | None:
        """How long ago a job was created (server clock), None if unknown."""
        return await self.scripts.job_age_ms(job_id)

    async def complete(self, acks: Sequence[tuple[str, str, bytes, int]]) -> list[Outcome]:
        """Finish jobs: (id, token, result, result_ttl_ms) each."""
        outcomes = await self.scripts.complete(acks)
        self._completed(acks, outcomes)
        return outcomes

    def _completed(
        self, acks: Sequence[tuple[str, str, bytes, int]], outcomes: list[Outcome]
    ) -> None:
        """Delete the claim-checked payloads of the jobs now completed (``_claimcheck.py``)."""
        claim = self.codec.claim
        if claim is not None and claim.fetched:
            done = (Outcome.OK, Outcome.FORWARD)
            ok = [a[0] for a, o in zip(acks, outcomes, strict=False) if o in done]
            claim.completed(self.name, ok)

    async def fail(
        self,
        job_id: str,
        token: str,
        error: BaseException | str,
        mode: FailMode,
        delay_ms: int = 0,
    ) -> Outcome:
        """Record a failed attempt with its error (see ``FailMode``); a job that raised
        ``RateLimited`` goes back instead, its attempt refunded and its rate limits backing
        off (after ``delay_ms``: its ``retry_after``)."""
        if isinstance(error, RateLimited):
            pair = [(job_id, token)]
            (out,) = await self.scripts.release(pair, delay_ms, True, self.dead_ttl_ms, True)
            return out
        err = self.codec.dump_error(error)
        if self.codec.claim is not None:  # not completed: its blob stays (_claimcheck.py)
            self.codec.claim.forget(self.name, job_id)
        return await self.scripts.fail(job_id, token, err, mode, self.dead_ttl_ms, delay_ms)

    async def release(
        self, pairs: Sequence[tuple[str, str]], delay_ms: int = 0, refund: bool = True
    ) -> list[Outcome]:
        """Give leased jobs back unfinished (by default without spending their attempt), in
        calls of at most ``MAX_ACKS_PER_CALL``."""
        out: list[Outcome] = []
        for i in range(0, len(pairs), MAX_ACKS_PER_CALL):
            chunk = pairs[i : i + MAX_ACKS_PER_CALL]
            out += await self.scripts.release(chunk, delay_ms, refund, self.dead_ttl_ms)
        return out

    async def extend(self, pairs: Sequence[tuple[str, str]], lease_ms: int) -> list[Outcome]:
        """Renew leases to ``lease_ms`` from now."""
        return await self.scripts.extend(pairs, lease_ms)

    async def reap(self, limit: int, lock_ms: int = 0) -> tuple[int, int, int]:
        """Queue maintenance (see ``QueueScripts.reap``)."""
        return await self.scripts.reap(limit, self.dead_ttl_ms, lock_ms)

    async def wait_for_handoff(self, seconds: float, worker_id: str) -> list[Claimed]:
        """A parked worker's wait (see ``QueueScripts.wait_for_handoff``)."""
        return await self.scripts.wait_for_handoff(seconds, worker_id)

    async def wake(self) -> None:
        """Leave a wake token for one idle consumer."""
        await self.scripts.wake()


def _fields(record: bytes) -> list[bytes]:
    """Split an outbox record: length-prefixed fields (``<len>:<bytes>``...).

    Raises:
        ValueError: it is not such a record.
    """
    out = []
    pos = 0
    while pos < len(record):
        colon = record.index(b":", pos)
        size = int(record[pos:colon])
        if size < 0 or colon + 1 + size > len(record):
            raise ValueError(f"a field of {size} bytes past the end of the record")
        out.append(record[colon + 1 : colon + 1 + size])
        pos = colon + 1 + size
    return out


async def forward_outbox(queue: QueueParts, limit: int = 10_000, chunk: int = 500) -> int:
    """Hand over outcomes of this queue's sub-jobs to their batches on other queues, until
    the outbox is empty (or ``limit`` entries). Safe anywhere, any number of times: applying
    an outcome twice counts it once, and an entry leaves the outbox only after it was applied.
    Returns the number of entries handed over."""
    app = queue.app
    scripts = queue.door
    done = 0
    while done < limit:
        items = await scripts.outbox(chunk)
        if not items:
            break
        by_home: dict[str, list[bytes]] = {}
        deps: dict[tuple[str, str], list[bytes]] = {}  # (kind, queue) -> values (deps.py)
        garbled: list[bytes] = []
        for raw in items:
            try:
                fields = _fields(raw)
                entry = forward_entry(fields)
                if entry is not None:
                    kind, name, values = entry
                    deps.setdefault((kind, check_name("queue", name)), []).extend(values)
                    continue
                bid, home, member, ok, value = fields
                name = check_name("queue", home.decode())
            except (ValueError, TypeError) as exc:  # UnicodeDecodeError, ConfigurationError
                logger.warning(
                    "outbox of %r: set aside an entry that cannot be read (%s)", queue.name, exc
                )
                garbled.append(raw)
                continue
            by_home.setdefault(name, []).extend((bid, member, ok, value))
        if garbled:
            await scripts.outbox_set_aside(garbled, "an entry that cannot be read")
            items = [raw for raw in items if raw not in garbled]
        calls = [
            app.queue(name).door.batch_apply_call(outcomes) for name, outcomes in by_home.items()
        ]
        calls += [forward_call(app, name, kind, v) for (kind, name), v in deps.items()]
        if calls:
            await scripts.run_many(calls)
            await scripts.outbox_remove(items)
        done += len(items)
        # applying dependency entries may have added more (the rest of a dependency's
        # dependents, lib/deps): read again rather than wait for the next reap
        if len(items) + len(garbled) < chunk and not deps:
            break
    return done
