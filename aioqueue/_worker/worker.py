"""The consumer pool: one event loop runs up to ``concurrency`` jobs at once.

Per queue, a fetch loop (``fetch.py``) leases as many jobs per round trip as there are free
slots and, when it finds nothing, blocks on the queue's wake list (no polling) until a producer
adds work, a delayed job falls due or a lease runs out. Each job runs in its own task
(``runner.py``), whose outcome the pool settles; its slots (``slots.py``) hold the jobs running
and the prefetched ones. Around them run the background loops (``loops.py``, held): the
heartbeat that renews the worker's registration and every lease it holds (a dead worker is
noticed after three missed beats and its jobs handed back at once), the acker that sends
completions in batches, the forwarder of batch outcomes and the reaper.

Failures, retries and releases are shielded from cancellation and tracked (``shield.py``), so
shutdown waits for them: cancelling the worker at any await point leaves every job in a valid
state. Shutdown is a sequence of named steps (``_shutdown``): stop fetching, leave the parking,
return prefetched jobs, the grace period, cancel what still runs, finish the acks, stop loops."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any

from .._app.app import App
from .._app.context import _worker_state
from .._app.logs import job_fields
from .._app.schedules import Scheduler
from .._model.checks import check_int, to_seconds
from .._model.codec import Unrunnable, describe_error
from .._model.exceptions import ClosedError, ConfigurationError, RateLimited
from .._model.hooks import State
from .._model.record import Claimed
from .._store.outcomes import FailMode, Outcome
from .._version import __version__
from .fetch import TRANSIENT, Crew, Fetcher
from .isolation import ProcessIsolation
from .loops import Loops
from .observe import WorkerObserver
from .runner import Ack, Failure, Runner
from .shield import Shield
from .slots import Running, Slots
from .weights import Turns

logger = logging.getLogger(__name__)


class Worker:
    """Runs jobs of an App's tasks from one or more queues.

    Args:
        app: the App whose tasks run; its connection pool is shared with any producer.
        queues: queue names to consume (default: the App's default queue), or names with
            weights: served by weight, or in order with ``strict`` (docs/flow-control.md).
        concurrency: jobs run at once.
        burst: stop once the queues are empty and nothing runs (for scripts and tests).
        grace: seconds running jobs get to finish on shutdown before they are cancelled and
            returned to the queue without spending an attempt.
        max_batch: most jobs leased per round trip (default: half of ``concurrency`` plus
            ``prefetch``, so that the next claim overlaps the jobs of the last; at most 500).
        prefetch: jobs leased ahead of free slots, started the moment a slot frees (their
            leases are renewed like running jobs'; on shutdown they go back at once, without
            spending an attempt). Default: a tenth of ``concurrency``, at most 100; 0 for none.
        idle_block: longest single blocking wait when idle, in seconds.
        scheduler: run a scheduler for the queues' periodic schedules: it stores those
            declared in code and enqueues one job per tick (every worker may run one; they
            race safely, see docs/scheduling.md).
        unknown_task_grace: seconds a job of a task this worker does not know may wait for a
            worker that knows it (a rolling deploy): until then it is handed back, with a
            growing delay and without spending an attempt; after that it is dead-lettered as
            ``UnknownTask``. 0: dead-letter it at once.
        metrics: an observer of its jobs, leases and claims, e.g.
            ``aioqueue.metrics.WorkerMetrics()`` (Prometheus; docs/observability.md). None:
            nothing is observed, at no cost.
        isolation: the child processes of isolated tasks (``ProcessIsolation``; flow-control.md).

    Use ``await worker.run()`` (returns after ``stop()`` or, with ``burst``, when done), or
    ``async with worker:`` to run it in the background of a block (it returns once the worker
    is registered and serving; so does ``await worker.started()``).
    """

    def __init__(
        self,
        app: App,
        *,
        queues: Sequence[str] | Mapping[str, int] | None = None,
        strict: bool = False,
        concurrency: int = 100,
        burst: bool = False,
        grace: float | timedelta = 30.0,
        max_batch: int | None = None,
        idle_block: float | timedelta = 5.0,
        prefetch: int | None = None,
        scheduler: bool = True,
        unknown_task_grace: float | timedelta = 60.0,
        metrics: WorkerObserver | None = None,
        isolation: ProcessIsolation | None = None,
    ) -> None:
        check_int(concurrency, 1, "concurrency")
        self.app = app
        names = list(queues) if queues else [app.default_queue]
        names = [n for name in names for n in app.queues.consumed(name)]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"queues listed twice: {names}")
        self.queue_names = names
        self.turns = Turns.of(queues, names, strict)  # weighted or strict order, else None
        self.concurrency = concurrency
        self.burst = burst
        self.grace = to_seconds(grace, "grace") or 0.0
        self.unknown_task_grace = to_seconds(unknown_task_grace, "unknown_task_grace") or 0.0
        prefetch = min(concurrency // 10, 100) if prefetch is None else prefetch
        self.prefetch = check_int(prefetch, 0, "prefetch")
        # half the room by default: the server leases the next batch while this one runs
        self.max_batch = max(1, min(max_batch or (concurrency + self.prefetch + 1) // 2, 500))
        self.idle_block = to_seconds(idle_block, "idle_block") or 0.1
        if self.idle_block > app.socket_timeout / 2:
            raise ConfigurationError("idle_block must be at most half of the App's socket_timeout")
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.completed = 0
        self.failed = 0
        #: jobs still running after shutdown because they ignored their cancellation
        self.abandoned = 0
        self._fetchers: list[Fetcher] = []
        #: its jobs running and prefetched
        self.slots: Slots[Fetcher] = Slots(concurrency, self.prefetch)
        self._shield = Shield()
        self._stop = asyncio.Event()
        self._force = False
        self._forced = asyncio.Event()
        self._stopping = False
        self._main: asyncio.Task[None] | None = None
        #: objects the startup hooks share with the tasks (``current_job().state``)
        self.state = State()
        self._runner = Runner(app, concurrency, isolation)
        self._started = False
        #: set once the worker is registered on its queues and about to fetch
        self.ready = asyncio.Event()
        #: fires the queues' periodic schedules (None: scheduler=False)
        self.scheduler = Scheduler(app, names) if scheduler else None
        self._started_ms = 0
        #: the observer of its jobs, leases and claims (None: none)
        self.metrics = metrics
        self._loops = Loops(
            app, self.id, names, self.slots, self._shield, self._info, metrics, self.scheduler
        )
        self._crew = Crew(
            id=self.id,
            burst=burst,
            max_batch=self.max_batch,
            idle_block=self.idle_block,
            lease_ms=self._loops.lease_ms,
            # a parking outlasts the longest wait by a second: a worker that died parked stops
            # getting jobs handed over that long after
            park_ms=int(self.idle_block * 1000) + 1000,
            slots=self.slots,
            shield=self._shield,
            stop=self._stop,
            take=self._take,
            flush_acks=self._loops.flush_acks,
            check_acks=self._loops.check_acks,
            wake_acker=self._loops.wake_acker,
            turns=self.turns,
            metrics=metrics,
        )
        if metrics is not None:
            metrics.bind(self)

    def __repr__(self) -> str:
        return f"<Worker {self.id} queues={self.queue_names} running={len(self.slots.running)}>"

    def stop(self, *, force: bool = False) -> None:
        """Ask the worker to stop: no new jobs are fetched; running jobs get ``grace``
        seconds (none with ``force``), then are cancelled and returned to their queue."""
        if force:
            self._force = True
            self._forced.set()
            for task in list(self.slots.running):
                task.cancel()
        self._stop.set()

    @property
    def alive(self) -> bool:
        """The registry's rule for a live worker, seen from inside: it is registered, not
        stopped, and its last heartbeat on every queue succeeded within three heartbeat
        periods (what ``--health-port`` reports)."""
        return self.ready.is_set() and self._loops.alive()

    @property
    def running_jobs(self) -> int:
        """Jobs running now, plus prefetched ones waiting for a slot."""
        return len(self.slots)

    async def __aenter__(self) -> Worker:
        self._main = asyncio.create_task(self.run())
        try:
            await self.started()
        except BaseException:
            self.stop(force=True)
            await asyncio.wait([self._main])
            raise
        return self

    async def started(self) -> None:
        """Wait until the worker runs (``run()`` or ``async with``): registered on its queues
        (``Queue.workers()`` lists it), its tasks declared and its fetch loops serving. Raises
        what ``run()`` raised if it stopped before that (e.g. ``StartupFailed``)."""
        ready = asyncio.ensure_future(self.ready.wait())
        main = [self._main] if self._main is not None else []
        try:
            await asyncio.wait([ready, *main], return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
        if not self.ready.is_set() and self._main is not None:
            await self._main
            raise ClosedError("the worker stopped before it started serving")

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        if self._main is not None:
            await self._main

    # ------------------------------------------------------------------ main loop
    async def run(self) -> None:
        """Run until ``stop()`` (or, with ``burst``, until the queues are empty)."""
        if self._started:
            raise ClosedError("a Worker runs once; create a new one")
        self._started = True
        self._main = self._main or asyncio.current_task()  # for started()
        self.app.redis  # noqa: B018 - raises ClosedError early if the App is not open
        _worker_state.set(self.state)  # every task started below inherits it (JobContext.state)
        await self.app.hooks.start(self.state)  # StartupFailed: nothing fetched, nothing to undo
        self._fetchers = [Fetcher(self._crew, self.app.queue(n)) for n in self.queue_names]
        loops = self._loops
        loops.fetchers = self._fetchers
        self._started_ms = int(time.time() * 1000)
        await loops.register_worker()  # registered, its tasks declared, before the first claim
        await loops.declare()  # and its queues named in the registry of real queues
        logger.info(
            "worker %s consuming %s at concurrency %d",
            self.id,
            ", ".join(self.queue_names),
            self.concurrency,
        )
        fetchers = [asyncio.create_task(qs.run()) for qs in self._fetchers]
        helpers = [
            asyncio.create_task(loops.heartbeat_loop()),
            asyncio.create_task(loops.reap_loop()),
            asyncio.create_task(loops.forward_loop()),
        ]
        if self.scheduler is not None:
            helpers.append(asyncio.create_task(self.scheduler.run(lambda: loops.finished)))
        acker = asyncio.create_task(loops.ack_loop())
        self.ready.set()  # registered and serving: ``async with`` and ``started()`` return
        stop_waiter: asyncio.Future[Any] = asyncio.ensure_future(self._stop.wait())
        try:
            if self.burst:  # done when every fetch loop has found its queue empty
                drained: asyncio.Future[Any] = asyncio.gather(*fetchers)
                await asyncio.wait([drained, stop_waiter], return_when=asyncio.FIRST_COMPLETED)
            else:
                await stop_waiter
        except asyncio.CancelledError:
            self._force = True
            raise
        finally:
            stop_waiter.cancel()
            try:
                await self._shutdown(fetchers, helpers, acker)
            finally:  # once every job is finished and acknowledged
                await self.app.hooks.stop(self.state)

    async def _shutdown(
        self,
        fetchers: list[asyncio.Task[None]],
        helpers: list[asyncio.Task[None]],
        acker: asyncio.Task[None],
    ) -> None:
        self._stopping = True
        self._stop.set()
        self.slots.freed.set()
        await self._stop_fetching(fetchers)
        if not self.burst:
            await self._unpark()
        self._return_prefetched()
        await self._grace_period()
        await self._cancel_running()
        await self._finish_acks(acker)
        await self._loops.stop(helpers)
        await self._loops.leave_registry()
        self._runner.close()
        logger.info(
            "worker %s stopped (%d completed, %d failed)", self.id, self.completed, self.failed
        )

    async def _stop_fetching(self, fetchers: list[asyncio.Task[None]]) -> None:
        """A fetch loop blocked idle is cancelled; one in the middle of a claim finishes it and
        starts the jobs it got (they then get the grace period like the others), unless the
        stop is forced."""
        for qs, t in zip(self._fetchers, fetchers, strict=True):
            if qs.idle or self._force:
                t.cancel()
        _, stuck = await asyncio.wait(fetchers, timeout=max(min(self.grace, 5.0), 0.1))
        for t in stuck:
            t.cancel()
        await asyncio.gather(*fetchers, return_exceptions=True)

    def _return_prefetched(self) -> None:
        """Prefetched jobs never started: back to their queues at once, attempt refunded."""
        buffered = self.slots.take_buffer()
        for qs in self._fetchers:
            pairs = [(c.id, c.token) for q, c in buffered if q is qs]
            qs.started += len(pairs)
            if pairs:
                self._shield(qs.leases.release(pairs), log=True)

    async def _grace_period(self) -> None:
        """Let running jobs finish for up to ``grace`` seconds (a forced stop: not at all)."""
        if not self.slots.running or self._force or self.grace <= 0:
            return
        logger.info("waiting up to %.1f s for %d running jobs", self.grace, len(self.slots.running))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace
        forced = asyncio.ensure_future(self._forced.wait())
        try:
            while self.slots.running and not forced.done() and loop.time() < deadline:
                await asyncio.wait(
                    [*self.slots.running, forced],
                    timeout=deadline - loop.time(),
                    return_when=asyncio.FIRST_COMPLETED,
                )
        finally:
            forced.cancel()

    async def _cancel_running(self) -> None:
        """Cancel the jobs still running: each goes back to its queue (see ``_settle``). One
        that ignores its cancellation cannot hold the worker: after a short wait it is left
        behind, and its lease brings it back."""
        if not self.slots.running:
            return
        logger.warning("returning %d unfinished jobs to their queues", len(self.slots.running))
        for job in list(self.slots.running):
            job.cancel()
        _, stubborn = await asyncio.wait(list(self.slots.running), timeout=2.0)
        if stubborn:
            logger.warning("%d jobs ignored their cancellation; leaving them", len(stubborn))
            self.abandoned = len(stubborn)

    async def _finish_acks(self, acker: asyncio.Task[None]) -> None:
        """Send the last acks; acks, failures, retries and releases in flight finish before
        we leave (if the server is gone they cannot, and the leases bring those jobs back)."""
        acker.cancel()
        await asyncio.wait([acker], timeout=5.0)
        await self._loops.flush_acks()
        await self._shield.wait(5.0 if self._force else 30.0)

    def _take(self, qs: Fetcher, jobs: list[Claimed]) -> None:
        for c in jobs:
            if self.slots.has_free_slot():
                self._start_job(qs, c)
            else:
                self.slots.buffer.append((qs, c))

    async def _unpark(self) -> None:
        """Leave every queue's parking (see ``Fetcher.leave_parking``)."""
        for qs in self._fetchers:
            await qs.leave_parking()

    def _start_job(self, qs: Fetcher, c: Claimed) -> None:
        qs.started += 1
        self.slots.start(qs, c, self._task)  # at the loop's next turn (see Slots)
        if self.metrics is not None:
            self.metrics.job_started(qs.queue.name, c)

    def _task(self, qs: Fetcher, c: Claimed) -> asyncio.Task[Ack | Failure]:
        task = asyncio.get_running_loop().create_task(self._runner.run(qs.leases, c))
        task.add_done_callback(self._job_done)
        return task

    def _job_done(self, task: asyncio.Task[Ack | Failure]) -> None:
        entry = self.slots.running.pop(task, None)
        if entry is not None:
            if self.metrics is not None:
                q, c = entry.qs.queue.name, entry.claimed
                self.metrics.job_done(q, c, task, cancelled=entry.cancelled, lost=entry.lost)
            self._settle(entry, task)
        if self.slots.buffer and not self._stopping:
            self._start_job(*self.slots.buffer.popleft())
        self.slots.freed.set()

    def _settle(self, entry: Running[Fetcher], task: asyncio.Task[Ack | Failure]) -> None:
        """Record how a run ended: ack it, record its failure, or, if it was cancelled, hand
        the job back (shutdown) or record it as cancelled (a cancellation request)."""
        qs, c = entry.qs, entry.claimed
        if task.cancelled():
            if entry.cancelled:  # cancelled from another process: record it, fenced by the lease
                stop = Unrunnable("Cancelled", "cancelled while running")
                self._shield(qs.leases.fail(c.id, c.token, stop, FailMode.CANCELLED), log=True)
            elif not entry.lost:  # shutdown: back to the queue, and this attempt does not count
                self._shield(qs.leases.release([(c.id, c.token)]), log=True)
            return
        crash = task.exception()
        if crash is not None:  # pragma: no cover - a bug: the lease brings the job back
            logger.error("job runner crashed", exc_info=crash)
            return
        outcome = task.result()
        if type(outcome) is tuple:
            qs.acks.append(outcome)
            self._loops.wake_acker()
            self.completed += 1
        else:
            assert isinstance(outcome, Failure)
            if outcome.parked:  # the run gave the lease back itself (a wait): nothing to record
                return
            if outcome.unknown_task and self.unknown_task_grace > 0:
                self._shield(self._unknown_task(qs, c, outcome), log=True)
            else:
                self._shield(self._fail(qs, c, outcome.error, outcome.retry_ms), log=True)

    async def _unknown_task(self, qs: Fetcher, c: Claimed, outcome: Failure) -> None:
        """A job of a task this worker does not know: while it is younger than the grace,
        hand it back (its attempt refunded) after a delay that grows with its age, for a
        worker that knows the task; then dead-letter it."""
        try:
            age_ms = await qs.leases.job_age_ms(c.id)
        except TRANSIENT:
            age_ms = None
        grace_ms = self.unknown_task_grace * 1000
        if age_ms is not None and 0 <= age_ms < grace_ms:
            delay_ms = int(min(max(age_ms / 4, 500), 10_000, grace_ms - age_ms))
            logger.warning(
                "job %s: no task named %r in this worker; handing it back for %.1f s "
                "(dead-lettered once it is %g s old)",
                c.id,
                c.task,
                delay_ms / 1000,
                self.unknown_task_grace,
            )
            await qs.leases.release([(c.id, c.token)], delay_ms, refund=True)
            return
        await self._fail(qs, c, outcome.error, outcome.retry_ms)

    async def _fail(
        self, qs: Fetcher, c: Claimed, exc: BaseException, retry_ms: int | None = None
    ) -> None:
        """Record a failed run: retried after ``retry_ms`` while attempts are left (None:
        dead-letter it now)."""
        self.failed += 1
        if retry_ms is not None and (c.attempt < c.max_attempts or isinstance(exc, RateLimited)):
            logger.warning(
                "job %s (%s) failed on attempt %d of %d, retrying in %.2f s: %s",
                c.id,
                c.task,
                c.attempt,
                c.max_attempts,
                retry_ms / 1000,
                describe_error(exc),
                extra=job_fields(c.id, c.task, qs.queue.name, c.attempt),
            )
        else:
            logger.error(
                "job %s (%s) dead-lettered after attempt %d of %d: %s",
                c.id,
                c.task,
                c.attempt,
                c.max_attempts,
                describe_error(exc),
                extra=job_fields(c.id, c.task, qs.queue.name, c.attempt),
            )
        mode = FailMode.DEAD if retry_ms is None else FailMode.RETRY
        try:
            outcome = await self._shield(qs.leases.fail(c.id, c.token, exc, mode, retry_ms or 0))
            if outcome is Outcome.DEAD or outcome is Outcome.CANCELLED:
                self._loops.forward.set()  # its batch may live on another queue
        except TRANSIENT as e:
            logger.warning(
                "could not record the failure of job %s (%r); its lease expires", c.id, e
            )

    def _info(self) -> tuple[object, ...]:
        """What the registry shows of this worker (see beat.lua)."""
        return (
            socket.gethostname(),
            os.getpid(),
            __version__,
            ",".join(self.queue_names),
            self.concurrency,
            self._started_ms,
            self.completed,
            self.failed,
            1 if self.app.codec.signer is not None else 0,
        )
