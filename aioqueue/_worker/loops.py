"""The background loops of a worker (``Loops``, which a ``Worker`` holds), each a task of its
own while the worker runs:

- the heartbeat: every ``App.heartbeat`` seconds, on each queue, renews the worker's entry in
  the worker registry and every lease it holds there (running jobs, prefetched ones and
  finished ones whose ack is not sent yet), and buries a worker that missed its deadline (so
  a dead worker's jobs come back within a heartbeat of it, even while every worker idles); a
  job whose lease was lost or that was cancelled meanwhile is stopped;
- the acker: sends completions in batches, one script call per queue, fenced by lease tokens;
- the forwarder: hands batch outcomes that an ack put in an outbox to their batch's queue;
- the reaper: queue maintenance once per period across all workers (lock in Redis).

Each loop stops once ``finished`` is set, and survives a server that is away.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._model.codec import Unrunnable
from .._model.limits import MAX_JOBS_PER_CALL
from .._model.record import Claimed
from .._queue.leases import forward_outbox
from .._queue.queuereg import declare_queues
from .._queue.tasktable import REFRESH, declared_table, register, strangers, warn_strangers
from .._store.outcomes import FailMode, Outcome
from .fetch import ACK_CHUNK, TRANSIENT, Fetcher
from .shield import Shield
from .slots import Slots

if TYPE_CHECKING:
    from .._app.app import App
    from .._app.schedules import Scheduler
    from .observe import WorkerObserver

# the worker's logger: what its loops log is the worker's, for those who filter on it
logger = logging.getLogger("aioqueue._worker.worker")
#: how often a worker's beat on a queue carries its backlog and wait for the queue's trends
TREND_SAMPLE_SECONDS = 20.0


class Loops:
    """The heartbeat, acker, forwarder and reaper of a worker, with the state they keep:
    whether the worker finished, when each queue's heartbeat last succeeded, the signals
    that acks or batch outcomes wait to be sent.

    Args:
        app: the worker's App.
        worker_id: the worker's id in the registries.
        queue_names: the queues it consumes.
        slots: its running and prefetched jobs (their leases are renewed).
        shield: its calls that run to the end.
        info: what the registry shows of the worker (see beat.lua), asked at each beat.
        metrics: its observer (None: none).
        scheduler: its scheduler (None: none).
    """

    def __init__(
        self,
        app: App,
        worker_id: str,
        queue_names: list[str],
        slots: Slots[Fetcher],
        shield: Shield,
        info: Callable[[], tuple[object, ...]],
        metrics: WorkerObserver | None,
        scheduler: Scheduler | None,
    ) -> None:
        self.app = app
        self.id = worker_id
        self.queue_names = queue_names
        self.slots = slots
        self.shield = shield
        self.info = info
        self.metrics = metrics
        self.scheduler = scheduler
        #: one per queue, made when the worker starts
        self.fetchers: list[Fetcher] = []
        #: completions wait to be sent
        self.acks_due = asyncio.Event()
        #: batch outcomes wait in an outbox to be handed to their batch's queue
        self.forward = asyncio.Event()
        self.finished = False
        self.lease_ms = int(app.lease * 1000)
        self.beat_s = max(app.heartbeat, 0.05)
        # three missed heartbeats and the worker counts as dead
        self.period_ms = int(self.beat_s * 3000)
        # per queue, when (monotonic) its last heartbeat succeeded
        self.beat_ok: dict[str, float] = {}
        #: when (loop time) this worker last wrote its task table on its queues
        self.tables_at = 0.0

    def alive(self) -> bool:
        """Not finished, and the last heartbeat on every queue succeeded within three
        heartbeat periods (the registry's rule, seen from inside)."""
        if self.finished or len(self.beat_ok) < len(self.fetchers):
            return False
        oldest = min(self.beat_ok.values(), default=0.0)
        return time.monotonic() - oldest < self.period_ms / 1000

    def wake_acker(self) -> None:
        """Completions wait to be sent: the acker looks at them (see ``flush_acks``)."""
        self.acks_due.set()

    async def ack_loop(self) -> None:
        while not self.finished:
            await self.acks_due.wait()
            # let a fetch loop that is about to claim take these acks along first
            await asyncio.sleep(0)
            self.acks_due.clear()
            if not await self.flush_acks(defer=True):
                await asyncio.sleep(0.1)
                self.acks_due.set()

    async def flush_acks(self, *, defer: bool = False) -> bool:
        """Send the completions gathered so far, one script call per queue (shielded: once
        sent, an ack finishes even if the acker is cancelled). False if some could not be
        sent; they stay queued and are covered by the heartbeat meanwhile. With ``defer``
        (the acker), a queue whose claim is in flight keeps its acks for the next claim: the
        fetch loop sends them with it, or wakes the acker when it does not claim at once."""
        ok = True
        for qs in self.fetchers:
            if not qs.acks or (defer and qs.claiming):
                continue
            while qs.acks:
                batch, qs.acks = qs.acks[:ACK_CHUNK], qs.acks[ACK_CHUNK:]
                try:
                    outcomes = await self.shield(qs.leases.complete(batch))
                except TRANSIENT as exc:
                    logger.warning("could not send %d acks (%r); will retry", len(batch), exc)
                    qs.acks[:0] = batch
                    ok = False
                    break
                self.check_acks(outcomes)
        return ok

    def check_acks(self, outcomes: list[Outcome]) -> None:
        lost = outcomes.count(Outcome.STALE) + outcomes.count(Outcome.NO_JOB)
        if lost:
            logger.warning("%d acks found their lease gone (the jobs were re-handed)", lost)
        if Outcome.FORWARD in outcomes:
            self.forward.set()

    async def forward_loop(self) -> None:
        """Hand batch outcomes waiting in the outboxes to batches on other queues as soon as
        an ack reports one (failures and cancellations are caught by the reap loop)."""
        while not self.finished:
            await self.forward.wait()
            self.forward.clear()
            for qs in self.fetchers:
                try:
                    await forward_outbox(qs.queue)
                except TRANSIENT as exc:
                    logger.debug("forwarding batch outcomes failed: %s", exc)
                except Exception:  # a bug, or garbage nobody expected: never stop forwarding
                    logger.exception("forwarding batch outcomes failed; going on")

    async def heartbeat_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.finished:
            await asyncio.sleep(self.beat_s)
            for qs in self.fetchers:
                before = self.beat_ok.get(qs.queue.name, 0.0)
                await self.renew(qs)
                if self.beat_ok.get(qs.queue.name, 0.0) - before > self.period_ms / 1000:
                    self.tables_at = 0.0  # back after its deadline: maybe dropped meanwhile
            await self.declare()
            if loop.time() - self.tables_at > REFRESH:  # once a minute, not every beat
                await self.declare_tasks()

    async def declare(self) -> None:
        """Name this worker's queues in the registry of real queues (``_queuereg``)."""
        try:
            await declare_queues(self.app.redis, self.app.prefix, self.queue_names)
        except TRANSIENT as exc:  # bookkeeping (an ACL without its commands too): go on
            logger.warning("could not record the queues in the registry: %s", exc)

    async def register_worker(self) -> None:
        """Before the first claim: register on every queue (only a registered worker is handed
        jobs it can get back if it dies), declare the tasks it serves, warn about jobs of
        tasks it does not know, and store the schedules declared in code (so that even a
        burst worker that finds nothing to do stores them before it exits)."""
        for qs in self.fetchers:
            await self.renew(qs)
        await self.declare_tasks()
        for qs in self.fetchers:
            try:
                found = await strangers(qs.queue.door.reads, set(self.app.tasks))
            except TRANSIENT as exc:
                logger.debug("queue %s: could not sample its jobs: %r", qs.queue.name, exc)
                continue
            warn_strangers(qs.queue.name, found, self.app.prefix)
        if self.scheduler is not None:
            try:
                await self.scheduler.sync()
            except Exception as exc:  # the scheduler's loop tries again (and logs it)
                logger.warning("could not store the declared schedules yet: %r", exc)

    async def declare_tasks(self) -> None:
        """Write the tasks this worker serves, with their declared defaults, in each queue's
        task table (``_tasktable.py``)."""
        self.tables_at = asyncio.get_running_loop().time()
        table = declared_table(self.app)
        for qs in self.fetchers:
            try:
                await register(qs.queue.door, self.id, table)
            except TRANSIENT as exc:
                logger.warning("queue %s: could not declare its tasks: %r", qs.queue.name, exc)
                self.tables_at = 0.0  # again at the next heartbeat

    async def leave_registry(self) -> None:
        """Leave each queue's worker registry (a worker that cannot is buried later)."""
        for qs in self.fetchers:
            try:
                async with asyncio.timeout(5.0):
                    await qs.leases.beat(self.id, 0, self.lease_ms, qs.started, self.info(), [])
            except (TimeoutError, *TRANSIENT) as exc:
                logger.warning("queue %s: could not leave the registry: %r", qs.queue.name, exc)

    async def _trend_sample(self, qs: Fetcher) -> tuple[int, int] | None:
        """The queue's backlog and wait (ms) for its trends (lib/trends.lua), read at most
        every ``TREND_SAMPLE_SECONDS`` (a few bounded reads): None between samples, and when
        the reads fail (a garbled lane: the beat goes on without its sample)."""
        now = time.monotonic()
        if now - qs.sampled < TREND_SAMPLE_SECONDS:
            return None
        qs.sampled = now
        try:
            wait = await qs.queue.wait_time()
            return (await qs.queue.counts())["queued"], int((wait or 0) * 1000)
        except TRANSIENT as exc:
            logger.debug("queue %s: no trend sample: %r", qs.queue.name, exc)
            return None

    async def renew(self, qs: Fetcher) -> None:
        """The heartbeat on ``qs``: renew this worker's registration and every lease it holds
        there (running jobs, prefetched ones and finished ones whose ack is not sent yet);
        then act on what the renewal found."""
        running = self.slots.running_on(qs)
        held = self.slots.held_on(qs)
        pairs = [(e.claimed.id, e.claimed.token) for _, e in running]
        pairs += [(c.id, c.token) for c in held]
        pairs += [(a[0], a[1]) for a in qs.acks]
        try:
            sample = await self._trend_sample(qs)
            outcomes = await qs.leases.beat(
                self.id, self.period_ms, self.lease_ms, qs.started, self.info(), pairs, sample
            )
        except TRANSIENT as exc:
            logger.warning("heartbeat failed (%s); will retry", exc)
            return
        self.beat_ok[qs.queue.name] = time.monotonic()
        self.drop_buffered(qs, held, outcomes[len(running) : len(running) + len(held)])
        for (task, entry), outcome in zip(running, outcomes, strict=False):
            if task.done() or outcome is Outcome.OK:
                continue
            if outcome is Outcome.CANCEL_REQUESTED:
                logger.info("job %s was cancelled; stopping it", entry.claimed.id)
                entry.cancelled = True
            else:  # the job was handed to someone else: stop working on it here
                logger.warning("lease on job %s lost; cancelling its run", entry.claimed.id)
                entry.lost = True
            task.cancel()
        if self.metrics is not None:
            gone = sum(o is not Outcome.OK and o is not Outcome.CANCEL_REQUESTED for o in outcomes)
            self.metrics.leases_renewed(qs.queue.name, len(pairs), gone)

    def drop_buffered(self, qs: Fetcher, held: list[Claimed], outcomes: list[Outcome]) -> None:
        """Forget prefetched jobs whose lease is gone; record cancelled ones as cancelled."""
        gone = {c.id for c, o in zip(held, outcomes, strict=True) if o is not Outcome.OK}
        if not gone:
            return
        qs.started += len(gone)
        for c, outcome in zip(held, outcomes, strict=True):
            if outcome is Outcome.CANCEL_REQUESTED:
                why = Unrunnable("Cancelled", "cancelled before it ran")
                self.shield(qs.leases.fail(c.id, c.token, why, FailMode.CANCELLED), log=True)
        self.slots.forget(qs, gone)

    async def stop(self, helpers: list[asyncio.Task[None]]) -> None:
        # the loops also check finished: a Redis call that swallows a cancellation (redis-py
        # can, on Python 3.11) must not keep the worker from stopping
        self.finished = True
        for t in helpers:
            t.cancel()
        _, pending = await asyncio.wait(helpers, timeout=1.0)
        for t in pending:
            t.cancel()
        if pending:
            logger.debug("%d background loops did not stop in time; leaving them", len(pending))
        for qs in self.fetchers:  # the claims in flight have finished (the shield's wait)
            await qs.close()

    async def reap_loop(self) -> None:
        interval = max(self.app.lease / 2, 0.05)
        lock_ms = max(int(interval * 1000) - 10, 1)
        while not self.finished:
            for qs in self.fetchers:
                try:
                    await qs.leases.reap(MAX_JOBS_PER_CALL, lock_ms)
                    await forward_outbox(qs.queue)
                except TRANSIENT as exc:
                    logger.debug("maintenance failed: %s", exc)
                except Exception:  # a bug, or garbage nobody expected: never stop maintenance
                    logger.exception("maintenance failed; going on")
            await asyncio.sleep(interval)
