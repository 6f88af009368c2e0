"""The fetch side of a worker, one ``Fetcher`` per queue: lease as many jobs per round trip as
the pool has free slots (sending its pending acks along), and when the queue is empty park and
block until a producer hands jobs over, leaves a wake token, or a delayed job falls due (no
polling). The jobs it gets go to the pool (``Worker``), which runs them; what the pool lends
its fetchers is a ``Crew``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import redis.exceptions as rexc

from .._model.exceptions import AioQueueError
from .._model.limits import MAX_ACKS_PER_CALL
from .._model.record import Claimed, ClaimResult
from .._queue.leases import Leases
from .._store.durable import durability_of
from .._store.hot import OrderedLine, ordered_line
from .._store.outcomes import Outcome
from .shield import Shield
from .slots import Slots
from .weights import Turns

if TYPE_CHECKING:
    from .._queue.queue import Queue
    from .observe import WorkerObserver

logger = logging.getLogger(__name__)

# most acks sent in one script call
ACK_CHUNK = MAX_ACKS_PER_CALL

# errors a loop survives by backing off and trying again (the server went away, a failover)
TRANSIENT = (AioQueueError, rexc.RedisError, OSError)


@dataclass(frozen=True, slots=True)
class Crew:
    """What a worker lends its fetchers: who claims and how, where the jobs go, the acks to
    send along."""

    #: the worker's id (its leases and parking are under it)
    id: str
    burst: bool
    max_batch: int
    idle_block: float
    lease_ms: int
    #: how long a parking lasts (a worker that died parked stops getting jobs after it)
    park_ms: int
    slots: Slots[Fetcher]
    shield: Shield
    #: set when the worker stops fetching
    stop: asyncio.Event
    #: the pool's hand for jobs leased by ``Fetcher``: run them or buffer them
    take: Callable[[Fetcher, list[Claimed]], None]
    flush_acks: Callable[[], Awaitable[bool]]
    check_acks: Callable[[list[Outcome]], None]
    #: completions wait: the acker sends those no claim took along (``Loops.wake_acker``)
    wake_acker: Callable[[], None]
    #: weighted queues, or strict order (``weights.py``); None: each fetcher claims freely
    turns: Turns | None
    metrics: WorkerObserver | None


class Fetcher:
    """One queue of a worker: its leases, its acks not sent yet, and its fetch loop."""

    __slots__ = (
        "acks",
        "claiming",
        "crew",
        "idle",
        "leases",
        "line",
        "queue",
        "sampled",
        "started",
    )

    def __init__(self, crew: Crew, queue: Queue) -> None:
        self.crew = crew
        self.queue = queue
        self.leases = Leases(queue)
        self.acks: list[tuple[str, str, bytes, int]] = []
        self.idle = False  # blocked waiting for work: safe to cancel
        #: claims in flight: while there are any the acker leaves this queue's acks to the
        #: next claim, which the loop sends as soon as one returns if it has free slots
        self.claiming = 0
        #: leases of this queue the pool has started or given up, in the order it got them
        #: (the server numbers a worker's leases the same way: see lua/lib/workers.lua)
        self.started = 0
        self.sampled = 0.0  # when its last beat carried a trend sample (monotonic)
        #: the connection its claims in flight two at a time go over, in order (made when the
        #: queue is first busy); None where there is none (a cluster client, durability mode)
        self.line: OrderedLine | None = None

    def report(self, ahead: int = 0) -> tuple[int, int]:
        """What a claim tells the server: the leases started (or given up) so far, and how
        many of the jobs it gets start at once (free slots, none while jobs wait in the
        buffer), after the jobs of the claims in flight ahead of it (``ahead``: as many as
        they asked for) have taken theirs."""
        return self.started, max(self.crew.slots.free() - ahead, 0)

    async def run(self) -> None:
        """The fetch loop: until the pool stops (or, in burst mode, the queue is drained)."""
        crew = self.crew
        backoff = 0.05
        while not crew.stop.is_set():
            free = crew.slots.room()
            if free <= 0:
                await self.wait_slot()
                continue
            want = min(free, crew.max_batch)
            try:
                if (turn := await self._next_claim(want)) is None:
                    continue  # weighted queues: the slots were taken meanwhile
                res, want = turn
                self._took(res.jobs)
                backoff = 0.05
                if await self._after_claim(res, want):
                    return
            except TRANSIENT as exc:  # includes a blocking wait that overran its timeout
                logger.warning("queue %s: %r; retrying in %.2f s", self.queue.name, exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
            except Exception:  # a bug, or a reply nobody expected: never stop fetching
                logger.exception(
                    "queue %s: unexpected error; retrying in %.2f s", self.queue.name, 1.0
                )
                await asyncio.sleep(1.0)

    def _took(self, jobs: list[Claimed]) -> None:
        crew = self.crew
        crew.take(self, jobs)
        if crew.metrics is not None:
            crew.metrics.claimed(self.queue.name, len(jobs))

    async def _after_claim(self, res: ClaimResult, want: int) -> bool:
        """After a claim's jobs went to the pool: claim on while the queue has more, or wait
        for work (parked); True when a burst is done."""
        crew = self.crew
        if len(res.jobs) >= want:
            if crew.turns is None and self._line() is not None:
                await self._busy()
            return False
        if crew.burst:
            return await self._burst_done(res)
        # parked by that claim: new jobs may be handed over in the wait
        handed = await self._wait_for_work(res)
        if handed:
            crew.take(self, handed)
            if crew.metrics is not None:
                crew.metrics.handed(self.queue.name, len(handed))
            # let the handed jobs start before the next claim is prepared and sent
            await asyncio.sleep(0)
        return False

    async def _burst_done(self, res: ClaimResult) -> bool:
        """Burst mode found the queue drained for now: True once nothing more can come from
        this worker's own jobs; else wait for one of them to finish and look again."""
        crew = self.crew
        if crew.slots:
            await self.wait_slot()
            return False
        if self.acks or crew.shield:  # our own acks may still hold group slots
            await crew.flush_acks()
            await crew.shield.settle()
            return False
        return True

    async def _wait_for_work(self, res: ClaimResult) -> list[Claimed]:
        """Parked: block until a producer hands over jobs (returned) or leaves a wake token, or
        the next delayed job falls due or lease runs out (no polling)."""
        crew = self.crew
        block = crew.idle_block
        timer = None
        if res.next_wake_ms >= 0:
            block = min(block, max((res.next_wake_ms - res.now_ms) / 1000, 0.001))
            if block < crew.idle_block:
                # the server checks BLPOP timeouts only on its clock tick (100 ms at hz 10):
                # leave ourselves a wake token at the due time instead
                timer = asyncio.get_running_loop().call_later(block, self._wake_soon)
            block += 0.2  # the token is the wake-up; the timeout is the fallback
        try:
            # wait_for_handoff bounds the blocking call itself (block + half the socket
            # timeout), so it cannot hang even if the socket silently died
            handed: list[Claimed] = await self._idle(self.leases.wait_for_handoff(block, crew.id))
            return handed
        finally:
            if timer is not None:
                timer.cancel()

    def _wake_soon(self) -> None:
        crew = self.crew
        crew.shield(self.leases.wake(), log=True)

    async def _next_claim(self, want: int) -> tuple[ClaimResult, int] | None:
        """Claim up to ``want`` jobs, or with weighted queues this queue's share when its turn
        comes (the claim's result and how many it asked for; None: no slot free any more)."""
        if self.crew.turns is None:
            return await self._claim(want), want
        return await self._take_turn(self.crew.turns)

    async def _take_turn(self, turns: Turns) -> tuple[ClaimResult, int] | None:
        """Weighted queues (weights.py): wait for this queue's turn, then claim its share of
        the slots free then (the claim's result and how many it asked for); None when none
        is free any more."""
        share = await turns.take(self.queue.name)
        try:
            free = self.crew.slots.room()
            if free <= 0:
                turns.undo()
                return None
            want = max(1, min(math.ceil(free * share), self.crew.max_batch))
            return await self._claim(want), want
        finally:
            turns.done()

    def _line(self) -> OrderedLine | None:
        if self.line is None:
            client = self.leases.scripts.client
            if durability_of(client) is None:
                self.line = ordered_line(client)
        return self.line

    async def close(self) -> None:
        """Close the connection its claims in flight went over, if any."""
        line, self.line = self.line, None
        if line is not None:
            await line.close()

    async def _busy(self) -> None:
        """The queue had at least what we asked for: keep two claims in flight (without
        parking), so that the server works on one while the reply to the other is read and
        its jobs run, until one comes back short (the loop's next claim then parks, or ends a
        burst) or no slot is left to promise. A claim asks for a third of the slots at most:
        when a reply comes, the jobs of the one before have mostly finished, and their slots
        go to the next claim."""
        crew = self.crew
        slots = crew.slots
        share = max(1, min(crew.max_batch, (slots.concurrency + slots.prefetch) // 3))
        flight: deque[tuple[asyncio.Future[Any], list[tuple[str, str, bytes, int]], int]]
        flight = deque()
        promised = 0  # slots the claims in flight may fill
        short = False
        try:
            while True:
                while not short and len(flight) < 2 and not crew.stop.is_set():
                    free = slots.room() - promised
                    if free < (share if flight else 1):
                        break
                    want = min(free, share)
                    flight.append((*self._send(want, 0, promised, self.line), want))
                    promised += want
                if not flight:
                    return
                fut, acks, want = flight.popleft()
                promised -= want
                res = await self._receive(fut, acks)
                self._took(res.jobs)
                if len(res.jobs) < want:
                    short = True
        except BaseException:
            # the reply being awaited is seen to by _receive; the others' leases go back, and
            # their acks wait for the next call, once their replies are in
            for fut, acks, _ in flight:
                fut.add_done_callback(partial(self._abandon, acks))
            raise

    async def _claim(self, want: int) -> ClaimResult:
        """Lease up to ``want`` jobs; a busy worker sends its pending acks along. A worker
        that gets fewer jobs than it asked for parks (burst mode never waits). Over the
        ordered line once the queue has been busy (its reply read off the wire; nothing is
        in flight there now), else through the pool."""
        crew = self.crew
        park = 0 if crew.burst else crew.park_ms
        return await self._receive(*self._send(want, park, 0, self.line))

    def _send(
        self, want: int, park: int, ahead: int = 0, line: OrderedLine | None = None
    ) -> tuple[asyncio.Future[Any], list[tuple[str, str, bytes, int]]]:
        """Send a claim for up to ``want`` jobs with the pending acks (at most a chunk) along,
        behind claims in flight that asked for ``ahead`` jobs (over ``line`` when given): its
        future, and the acks it carries."""
        crew = self.crew
        lease = crew.lease_ms
        acks, self.acks = self.acks[:ACK_CHUNK], self.acks[ACK_CHUNK:]
        coro: Any
        report = self.report(ahead)
        if acks:
            coro = self.leases.complete_claim(acks, want, lease, crew.id, park, report, line)
        else:
            coro = _with_no_outcomes(self.leases.claim(want, lease, crew.id, park, report, line))
        # tracked: a claim the server ran must reach us, even if we are cancelled meanwhile
        fut = crew.shield.track(coro)
        self.claiming += 1
        fut.add_done_callback(self._claimed)
        return fut, acks

    def _claimed(self, fut: asyncio.Future[Any]) -> None:
        self.claiming -= 1
        if self.acks and not self.claiming:
            # the acker skipped these while we claimed: if this loop claims again at once it
            # takes them along (before the acker runs); if it waits, the acker sends them
            self.crew.wake_acker()

    async def _receive(
        self, fut: asyncio.Future[Any], acks: list[tuple[str, str, bytes, int]]
    ) -> ClaimResult:
        """The reply of a claim ``_send`` sent: its jobs leased; its acks' outcomes checked."""
        try:
            res, outcomes = await asyncio.shield(fut)
        except asyncio.CancelledError:
            # stopping: hand back what this claim leased as soon as its reply is in
            fut.add_done_callback(partial(self._abandon, acks))
            raise
        except TRANSIENT:
            self.acks[:0] = acks
            raise
        self.crew.check_acks(outcomes)
        return res  # type: ignore[no-any-return]

    def _abandon(self, acks: list[tuple[str, str, bytes, int]], fut: asyncio.Future[Any]) -> None:
        """A claim whose reply nobody takes: its leases go back at once, and if it failed its
        acks wait for the next call."""
        if fut.cancelled():
            return  # nothing reached us: any lease it took runs out and the job comes back
        if fut.exception() is not None:
            self.acks[:0] = acks
            return
        self._give_back(fut.result()[0])

    async def leave_parking(self) -> None:
        """Leave the queue's parking, and hand back what was handed over but never reached
        us (if the server cannot be reached, the leases bring those jobs back)."""
        crew = self.crew
        try:
            async with asyncio.timeout(5.0):
                res = await self.leases.claim(0, crew.lease_ms, crew.id, 0, self.report())
        except (TimeoutError, *TRANSIENT) as exc:
            logger.warning("queue %s: could not leave the parking: %r", self.queue.name, exc)
            return
        self._give_back(res)

    def _give_back(self, res: ClaimResult) -> None:
        """Release the leases of a claim's jobs that will not run here (counted as given up
        in the worker's report)."""
        pairs = [(c.id, c.token) for c in res.jobs]
        self.started += len(pairs)
        if pairs:
            self.crew.shield(self.leases.release(pairs), log=True)

    async def wait_slot(self) -> None:
        crew = self.crew
        await self._idle(crew.slots.wait_freed())

    async def _idle(self, waiting: Awaitable[Any]) -> Any:
        """Await ``waiting`` marked as idle: shutdown may cancel the fetch loop there."""
        crew = self.crew
        self.idle = True
        try:
            if crew.stop.is_set():  # stopping: do not start a blocking wait
                if inspect.iscoroutine(waiting):
                    waiting.close()
                return []
            return await waiting
        finally:
            self.idle = False


async def _with_no_outcomes(claim: Awaitable[ClaimResult]) -> tuple[ClaimResult, list[Outcome]]:
    return await claim, []
