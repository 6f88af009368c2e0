"""The fetch side of a worker, one ``Fetcher`` per queue: lease as many jobs per round trip as
the pool has free slots (sending its pending acks along), and when the queue is empty park and
block until a producer hands jobs over, leaves a wake token, or a delayed job falls due (no
polling). The jobs it gets go to the pool (``Worker``), which runs them.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import redis.exceptions as rexc

from .._model.exceptions import AioQueueError
from .._model.limits import MAX_ACKS_PER_CALL
from .._model.record import Claimed, ClaimResult
from .._queue.leases import Leases
from .._store.loader import Outcome

if TYPE_CHECKING:
    from .._queue.queue import Queue
    from .worker import Worker

logger = logging.getLogger(__name__)

# most acks sent in one script call
ACK_CHUNK = MAX_ACKS_PER_CALL

# errors a loop survives by backing off and trying again (the server went away, a failover)
TRANSIENT = (AioQueueError, rexc.RedisError, OSError)


class Fetcher:
    """One queue of a worker: its leases, its acks not sent yet, and its fetch loop."""

    __slots__ = ("acks", "idle", "leases", "pool", "queue", "sampled", "started")

    def __init__(self, pool: Worker, queue: Queue) -> None:
        self.pool = pool
        self.queue = queue
        self.leases = Leases(queue)
        self.acks: list[tuple[str, str, bytes, int]] = []
        self.idle = False  # blocked waiting for work: safe to cancel
        #: leases of this queue the pool has started or given up, in the order it got them
        #: (the server numbers a worker's leases the same way: see lua/lib/workers.lua)
        self.started = 0
        self.sampled = 0.0  # when its last beat carried a trend sample (monotonic)

    def report(self) -> tuple[int, int]:
        """What a claim tells the server: the leases started (or given up) so far, and how
        many of the jobs it gets start at once (free slots, none while jobs wait in the
        buffer)."""
        pool = self.pool
        free = 0 if pool._buffer else max(pool.concurrency - len(pool._running), 0)
        return self.started, free

    async def run(self) -> None:
        """The fetch loop: until the pool stops (or, in burst mode, the queue is drained)."""
        pool = self.pool
        backoff = 0.05
        while not pool._stop.is_set():
            free = pool.concurrency + pool.prefetch - len(pool._running) - len(pool._buffer)
            if free <= 0:
                await self.wait_slot()
                continue
            want = min(free, pool.max_batch)
            try:
                res = await self._claim(want)
                pool._take(self, res.jobs)
                if pool.metrics is not None:
                    pool.metrics.claimed(self.queue.name, len(res.jobs))
                backoff = 0.05
                if len(res.jobs) >= want:
                    continue
                if pool.burst:
                    if await self._burst_done(res):
                        return
                    continue
                # parked by that claim: new jobs may be handed over in the wait
                handed = await self._wait_for_work(res)
                if handed:
                    pool._take(self, handed)
                    if pool.metrics is not None:
                        pool.metrics.handed(self.queue.name, len(handed))
                    # let the handed jobs start before the next claim is prepared and sent
                    await asyncio.sleep(0)
            except TRANSIENT as exc:  # includes a blocking wait that overran its timeout
                logger.warning("queue %s: %r; retrying in %.2f s", self.queue.name, exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
            except Exception:  # a bug, or a reply nobody expected: never stop fetching
                logger.exception(
                    "queue %s: unexpected error; retrying in %.2f s", self.queue.name, 1.0
                )
                await asyncio.sleep(1.0)

    async def _burst_done(self, res: ClaimResult) -> bool:
        """Burst mode found the queue drained for now: True once nothing more can come from
        this worker's own jobs; else wait for one of them to finish and look again."""
        pool = self.pool
        if pool._running or pool._buffer:
            await self.wait_slot()
            return False
        if self.acks or pool._shielded:  # our own acks may still hold group slots
            await pool._flush_acks()
            await asyncio.gather(*list(pool._shielded), return_exceptions=True)
            return False
        return True

    async def _wait_for_work(self, res: ClaimResult) -> list[Claimed]:
        """Parked: block until a producer hands over jobs (returned) or leaves a wake token, or
        the next delayed job falls due or lease runs out (no polling)."""
        pool = self.pool
        block = pool.idle_block
        timer = None
        if res.next_wake_ms >= 0:
            block = min(block, max((res.next_wake_ms - res.now_ms) / 1000, 0.001))
            if block < pool.idle_block:
                # the server checks BLPOP timeouts only on its clock tick (100 ms at hz 10):
                # leave ourselves a wake token at the due time instead
                timer = asyncio.get_running_loop().call_later(block, self._wake_soon)
            block += 0.2  # the token is the wake-up; the timeout is the fallback
        try:
            # wait_for_handoff bounds the blocking call itself (block + half the socket
            # timeout), so it cannot hang even if the socket silently died
            handed: list[Claimed] = await self._idle(self.leases.wait_for_handoff(block, pool.id))
            return handed
        finally:
            if timer is not None:
                timer.cancel()

    def _wake_soon(self) -> None:
        pool = self.pool
        pool._shield(self.leases.wake(), log=True)

    async def _claim(self, want: int) -> ClaimResult:
        """Lease up to ``want`` jobs; a busy worker sends its pending acks along."""
        pool = self.pool
        lease = pool._lease_ms
        acks, self.acks = self.acks[:ACK_CHUNK], self.acks[ACK_CHUNK:]
        coro: Any
        # a worker that gets fewer jobs than it asked for parks (burst mode never waits)
        park = 0 if pool.burst else pool._park_ms
        report = self.report()
        if acks:
            coro = self.leases.complete_claim(acks, want, lease, pool.id, park, report)
        else:
            coro = _with_no_outcomes(self.leases.claim(want, lease, pool.id, park, report))
        # shielded: a claim the server ran must reach us, even if we are cancelled meanwhile
        fut = asyncio.ensure_future(coro)
        pool._shielded.add(fut)
        fut.add_done_callback(pool._shielded.discard)
        try:
            res, outcomes = await asyncio.shield(fut)
        except asyncio.CancelledError:
            # stopping: hand back what this claim leased as soon as its reply is in
            fut.add_done_callback(self._release_claimed)
            raise
        except TRANSIENT:
            self.acks[:0] = acks
            raise
        pool._check_acks(outcomes)
        return res  # type: ignore[no-any-return]

    async def leave_parking(self) -> None:
        """Leave the queue's parking, and hand back what was handed over but never reached
        us (if the server cannot be reached, the leases bring those jobs back)."""
        pool = self.pool
        try:
            async with asyncio.timeout(5.0):
                res = await self.leases.claim(0, pool._lease_ms, pool.id, 0, self.report())
        except (TimeoutError, *TRANSIENT) as exc:
            logger.warning("queue %s: could not leave the parking: %r", self.queue.name, exc)
            return
        pairs = [(c.id, c.token) for c in res.jobs]
        self.started += len(pairs)
        if pairs:
            pool._shield(self.leases.release(pairs), log=True)

    def _release_claimed(self, fut: asyncio.Future[Any]) -> None:
        pool = self.pool
        if fut.cancelled() or fut.exception() is not None:
            return  # nothing reached us: any lease it took runs out and the job comes back
        res: ClaimResult = fut.result()[0]
        pairs = [(c.id, c.token) for c in res.jobs]
        self.started += len(pairs)
        if pairs:
            pool._shield(self.leases.release(pairs), log=True)

    async def wait_slot(self) -> None:
        pool = self.pool
        pool._slot_freed.clear()
        await self._idle(pool._slot_freed.wait())

    async def _idle(self, waiting: Awaitable[Any]) -> Any:
        """Await ``waiting`` marked as idle: shutdown may cancel the fetch loop there."""
        pool = self.pool
        self.idle = True
        try:
            if pool._stop.is_set():  # stopping: do not start a blocking wait
                if inspect.iscoroutine(waiting):
                    waiting.close()
                return []
            return await waiting
        finally:
            self.idle = False


async def _with_no_outcomes(claim: Awaitable[ClaimResult]) -> tuple[ClaimResult, list[Outcome]]:
    return await claim, []
