"""Prometheus metrics (``pip install 'aioqueue[metrics]'``): a worker's own metrics
(``WorkerMetrics``, served by ``worker --metrics-port``) and the queue exporter
(``QueueCollector``, served by ``python -m aioqueue metrics --port``), which reads every
queue's depths, groups, oldest job, dead letters, workers and pauses when it is scraped.

Names and labels follow Prometheus' conventions: a ``aioqueue_`` prefix, ``_total`` counters,
``_seconds`` units, and labels of bounded cardinality only (queue, task, state, outcome; never
a job id; a task this worker does not know is labelled ``unknown``, and a queue's groups are
cut to the ``max_groups`` with the largest backlog plus one ``__other__`` series). The table
of every metric is in docs/observability.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ._queue.queuereg import declared_queues, known_queues
from ._worker.runner import Failure

if TYPE_CHECKING:
    from ._app.app import App
    from ._model.record import Claimed
    from ._worker.observe import Observed

__all__ = ["QueueCollector", "WorkerMetrics", "serve"]

logger = logging.getLogger(__name__)

#: run times: from 5 ms to 10 minutes
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600)
#: the label of a task name the worker does not know (garbage must not grow the series)
UNKNOWN = "unknown"
#: the lifetime counters of a queue's ``stats`` that are exported (any other field, planted
#: there, would grow the series without bound)
EVENTS = (
    "enqueued",
    "completed",
    "failed",
    "retried",
    "expired",
    "cancelled",
    "buried",
    "requeued",
    "purged",
    "garbled",
    "refused",
)
#: the group series that sums the groups past ``max_groups``
OTHER_GROUPS = "__other__"


_M = TypeVar("_M", bound=Callable[..., None])


def _never_raises(method: _M) -> _M:
    """An observer method the worker calls in its acks' and heartbeat's path: a bug in it
    is logged, and must not keep a job from being settled or a heartbeat from going on."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> None:
        try:
            method(*args, **kwargs)
        except Exception:
            logger.exception("metrics: %s failed; going on", method.__name__)

    return cast(_M, call)


class WorkerMetrics:
    """A worker's metrics, in a registry of their own (or ``registry``): pass it as
    ``Worker(app, metrics=WorkerMetrics())`` and serve it with ``serve(m.registry, port)``,
    or add its registry's metrics to your own exposition.

    Args:
        registry: where to register the metrics (default: a new ``CollectorRegistry``, so
            that two workers in one process do not clash).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        reg = self.registry
        qt = ("queue", "task")
        self.started = Counter("aioqueue_jobs_started", "Runs started", qt, registry=reg)
        self.completed = Counter("aioqueue_jobs_completed", "Runs that succeeded", qt, registry=reg)
        self.failed = Counter(
            "aioqueue_jobs_failed",
            "Runs that failed with no attempt left (dead-lettered)",
            qt,
            registry=reg,
        )
        self.retried = Counter(
            "aioqueue_jobs_retried", "Runs that failed and will run again", qt, registry=reg
        )
        self.cancelled = Counter(
            "aioqueue_jobs_cancelled", "Runs stopped by a cancellation request", qt, registry=reg
        )
        self.returned = Counter(
            "aioqueue_jobs_returned",
            "Runs that ended without an outcome: the job went back to its queue (shutdown, "
            "lease_lost, unknown_task, parked)",
            ("queue", "task", "reason"),
            registry=reg,
        )
        self.duration = Histogram(
            "aioqueue_job_duration_seconds",
            "Run time of jobs that completed, failed or will retry",
            ("queue", "task", "outcome"),
            buckets=DURATION_BUCKETS,
            registry=reg,
        )
        self.renewals = Counter(
            "aioqueue_lease_renewals", "Leases renewed by heartbeats", ("queue",), registry=reg
        )
        self.leases_lost = Counter(
            "aioqueue_leases_lost",
            "Leases a heartbeat found gone (expired and handed to another worker)",
            ("queue",),
            registry=reg,
        )
        self.claims = Counter(
            "aioqueue_claims", "Claim round trips to the server", ("queue",), registry=reg
        )
        self.claimed_jobs = Counter(
            "aioqueue_claimed_jobs", "Jobs leased by claims", ("queue",), registry=reg
        )
        self.handed_jobs = Counter(
            "aioqueue_handed_jobs",
            "Jobs handed to this parked worker by producers",
            ("queue",),
            registry=reg,
        )
        self._worker: Observed | None = None
        self._t0: dict[tuple[str, str], float] = {}
        # the labelled children per (queue, task): a labels() lookup per job costs more
        # than the increment itself
        self._series: dict[tuple[str, str], _Series] = {}
        reg.register(_WorkerGauges(lambda: self._worker))

    # ------------------------------------------------------------------ the observer
    def bind(self, worker: Observed) -> None:
        """Called by the Worker this is given to."""
        if self._worker is not None and self._worker is not worker:
            raise ValueError("a WorkerMetrics observes one worker; make one per worker")
        self._worker = worker

    def _of(self, queue: str, name: str) -> _Series:
        """The series of ``name``'s jobs on ``queue`` (a name this worker does not know
        counts as ``unknown``, and is not kept: garbage must not grow the cache)."""
        series = self._series.get((queue, name))
        if series is None:
            w = self._worker
            task = name if w is not None and name in w.app.tasks else UNKNOWN
            series = self._series.get((queue, task))
            if series is None:
                series = self._series[queue, task] = _Series(self, queue, task)
        return series

    @_never_raises
    def job_started(self, queue: str, job: Claimed) -> None:
        """The worker started ``job`` (called by the worker)."""
        self._of(queue, job.task).started.inc()
        self._t0[queue, job.id] = time.monotonic()

    @_never_raises
    def job_done(
        self, queue: str, job: Claimed, run: asyncio.Task[Any], *, cancelled: bool, lost: bool
    ) -> None:
        """``job`` ended: how, from its task ``run`` (called by the worker)."""
        t0 = self._t0.pop((queue, job.id), None)
        series = self._of(queue, job.task)
        if run.cancelled():
            if cancelled:
                self.cancelled.labels(queue, series.task).inc()
            else:
                reason = "lease_lost" if lost else "shutdown"
                self.returned.labels(queue, series.task, reason).inc()
            return
        if run.exception() is not None:  # a bug in the runner: the pool logs it
            return
        outcome = run.result()
        if not isinstance(outcome, Failure):
            series.completed.inc()
            if t0 is not None:
                series.completed_seconds.observe(time.monotonic() - t0)
            return
        if outcome.parked:  # a durable wait, or wait_for_children, gave the job back
            self.returned.labels(queue, series.task, "parked").inc()
            return
        if outcome.unknown_task and self._worker is not None and self._worker.unknown_task_grace:
            self.returned.labels(queue, series.task, "unknown_task").inc()
            return
        name = (
            "retried"
            if outcome.retry_ms is not None and job.attempt < job.max_attempts
            else "failed"
        )
        (series.retried if name == "retried" else series.failed).inc()
        if t0 is not None:
            self.duration.labels(queue, series.task, name).observe(time.monotonic() - t0)

    @_never_raises
    def leases_renewed(self, queue: str, renewed: int, lost: int) -> None:
        """A heartbeat renewed ``renewed`` leases and found ``lost`` gone (called by the worker)."""
        self.renewals.labels(queue).inc(renewed)
        if lost:
            self.leases_lost.labels(queue).inc(lost)

    @_never_raises
    def claimed(self, queue: str, jobs: int) -> None:
        """A claim took ``jobs`` jobs (called by the worker)."""
        self.claims.labels(queue).inc()
        self.claimed_jobs.labels(queue).inc(jobs)

    @_never_raises
    def handed(self, queue: str, jobs: int) -> None:
        """``jobs`` jobs were handed to the parked worker (called by the worker)."""
        self.handed_jobs.labels(queue).inc(jobs)


class _Series:
    """The labelled children of one (queue, task) that every job touches."""

    __slots__ = ("completed", "completed_seconds", "failed", "retried", "started", "task")

    def __init__(self, m: WorkerMetrics, queue: str, task: str) -> None:
        self.task = task
        self.started = m.started.labels(queue, task)
        self.completed = m.completed.labels(queue, task)
        self.failed = m.failed.labels(queue, task)
        self.retried = m.retried.labels(queue, task)
        self.completed_seconds = m.duration.labels(queue, task, "completed")


class _WorkerGauges(Collector):
    """The worker's gauges, read when scraped: jobs running, prefetched, its concurrency."""

    def __init__(self, worker: Callable[[], Observed | None]) -> None:
        self.worker = worker  # the worker observed, once bound

    def describe(self) -> Iterable[Metric]:
        """The metric families, without samples (prometheus_client's Collector protocol)."""
        return list(self._families(None))

    def collect(self) -> Iterable[Metric]:
        """The metric families with their samples (prometheus_client's Collector protocol)."""
        return list(self._families(self.worker()))

    @staticmethod
    def _families(w: Observed | None) -> Iterator[Metric]:
        running = len(w.slots.running) if w is not None else 0
        yield GaugeMetricFamily("aioqueue_jobs_running", "Jobs running now", running)
        yield GaugeMetricFamily(
            "aioqueue_jobs_prefetched",
            "Jobs leased ahead, waiting for a free slot",
            len(w.slots.buffer) if w is not None else 0,
        )
        yield GaugeMetricFamily(
            "aioqueue_worker_concurrency",
            "Jobs the worker runs at once at most",
            w.concurrency if w is not None else 0,
        )


# ---------------------------------------------------------------------- the queue exporter
@dataclass(slots=True)
class _QueueSnapshot:
    """What one scrape read of one queue."""

    name: str
    counts: dict[str, int]
    groups: list[tuple[str, int]]
    other_groups: tuple[int, int]  # (how many groups, their queued jobs)
    oldest_age: float | None
    workers_alive: int
    workers_dead: int
    paused: bool
    stats: dict[str, int] = field(default_factory=dict)
    max_queued: int | None = None
    backlog: dict[str, int] = field(default_factory=dict)


class QueueCollector(Collector):
    """The queue exporter: a Prometheus collector that reports, per queue, the jobs per state,
    the backlog per group (the ``max_groups`` largest, and the rest summed as ``__other__``),
    the age of the oldest queued job, dead letters, workers alive and dead, whether it is
    paused and its lifetime counters. It reads them through the App's operator API when
    ``refresh()`` is awaited (``serve`` does that for each scrape), so one exporter covers
    every worker and producer.

    Args:
        app: an open App (its URL and key prefix name the queues).
        queues: the queues to report (default: every queue under the App's prefix, found
            at each scrape: the real ones first, those the App declares and those in the
            registry of workers' queues, then those a SCAN finds, at most 1,000 in all).
        max_groups: group series per queue at most (plus one ``__other__``).
    """

    def __init__(
        self, app: App, queues: Sequence[str] | None = None, *, max_groups: int = 20
    ) -> None:
        if max_groups < 0:
            raise ValueError(f"max_groups must be >= 0, got {max_groups}")
        self.app = app
        self.queues = list(queues) if queues else None
        self.max_groups = max_groups
        self._snapshot: list[_QueueSnapshot] = []
        self._scrape_seconds = 0.0

    async def refresh(self) -> None:
        """Read every queue's numbers now (what ``collect`` then reports)."""
        t0 = time.monotonic()
        app = self.app
        names = self.queues or await known_queues(app.redis, app.prefix, declared_queues(app))
        self._snapshot = [await self._read(name) for name in names]
        self._scrape_seconds = time.monotonic() - t0

    async def _read(self, name: str) -> _QueueSnapshot:
        q = self.app.queue(name)
        counts = await q.counts()
        by_group = sorted((await q.group_counts()).items(), key=lambda kv: (-kv[1], kv[0]))
        top, rest = by_group[: self.max_groups], by_group[self.max_groups :]
        oldest = await q.wait_time()
        workers = await q.workers()
        alive = sum(1 for w in workers if w.alive)
        return _QueueSnapshot(
            name=name,
            counts=counts,
            groups=top,
            other_groups=(len(rest), sum(n for _, n in rest)),
            oldest_age=oldest,
            workers_alive=alive,
            workers_dead=len(workers) - alive,
            paused=await q.is_paused(),
            stats=await q.stats(),
            max_queued=setting[0] if (setting := await q.max_queued()) else None,
            backlog=await q.backlog(),
        )

    def describe(self) -> Iterable[Metric]:
        """Nothing: the families are read at scrape time (prometheus_client's protocol)."""
        return []  # read at scrape time: nothing to describe up front

    def collect(self) -> Iterable[Metric]:
        """The families of the last ``refresh()``: depths, groups, ages, workers, pauses."""
        jobs = GaugeMetricFamily("aioqueue_queue_jobs", "Jobs per state", labels=["queue", "state"])
        dead = GaugeMetricFamily(
            "aioqueue_queue_dead_letters", "Dead-lettered jobs kept", labels=["queue"]
        )
        groups = GaugeMetricFamily(
            "aioqueue_queue_group_jobs",
            f"Queued jobs per group (the largest backlogs; the rest as {OTHER_GROUPS})",
            labels=["queue", "group"],
        )
        ngroups = GaugeMetricFamily(
            "aioqueue_queue_groups", "Groups with queued jobs", labels=["queue"]
        )
        oldest = GaugeMetricFamily(
            "aioqueue_queue_oldest_job_age_seconds",
            "Seconds the longest-waiting queued job has waited since it became due, from the "
            "heads of the queue's lanes (Queue.wait_time; 0: none queued)",
            labels=["queue"],
        )
        workers = GaugeMetricFamily(
            "aioqueue_queue_workers", "Registered workers", labels=["queue", "alive"]
        )
        paused = GaugeMetricFamily(
            "aioqueue_queue_paused", "1 while the queue is paused", labels=["queue"]
        )
        maxq = GaugeMetricFamily(
            "aioqueue_queue_max_queued",
            "The backpressure limit of waiting jobs (Queue.set_max_queued; no series: none)",
            labels=["queue"],
        )
        backlog = GaugeMetricFamily(
            "aioqueue_queue_backlog",
            "Jobs queued or scheduled per task, counted exactly (Queue.backlog; '*': past 100)",
            labels=["queue", "task"],
        )
        lifetime = CounterMetricFamily(
            "aioqueue_queue_events",
            "Lifetime counters of the queue (enqueued, completed, failed, retried, expired)",
            labels=["queue", "event"],
        )
        for s in self._snapshot:
            for state, n in s.counts.items():
                jobs.add_metric([s.name, state], n)
            dead.add_metric([s.name], s.counts.get("failed", 0))
            for g, n in s.groups:
                groups.add_metric([s.name, g], n)
            if s.other_groups[0]:
                groups.add_metric([s.name, OTHER_GROUPS], s.other_groups[1])
            ngroups.add_metric([s.name], len(s.groups) + s.other_groups[0])
            oldest.add_metric([s.name], s.oldest_age or 0.0)
            workers.add_metric([s.name, "true"], s.workers_alive)
            workers.add_metric([s.name, "false"], s.workers_dead)
            paused.add_metric([s.name], 1.0 if s.paused else 0.0)
            if s.max_queued is not None:
                maxq.add_metric([s.name], s.max_queued)
            for task, n in s.backlog.items():
                backlog.add_metric([s.name, task], n)
            for event in EVENTS:
                if event in s.stats:
                    lifetime.add_metric([s.name, event], s.stats[event])
        took = GaugeMetricFamily(
            "aioqueue_exporter_scrape_seconds", "Time the last scrape took to read the queues"
        )
        took.add_metric([], self._scrape_seconds)
        return [jobs, dead, groups, ngroups, oldest, workers, paused, maxq, backlog, lifetime, took]


# ---------------------------------------------------------------------- serving
_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}
#: longest request head read, and how long a client may take to send it
MAX_HEAD = 8192
READ_TIMEOUT = 5.0


async def serve(
    registry: CollectorRegistry,
    port: int,
    host: str = "0.0.0.0",
    *,
    before: Callable[[], Awaitable[None]] | None = None,
) -> asyncio.Server:
    """Serve ``GET /metrics`` (Prometheus' text format) of ``registry`` on ``host:port``, on
    the running event loop. ``before`` is awaited before each scrape (a ``QueueCollector``'s
    ``refresh``); if it raises, the scrape answers 503 and the error is logged.

    Returns:
        the listening server (``close()`` stops it; port 0 picks a free port).

    Raises:
        OSError: the port cannot be bound.
    """

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        status, ctype, body, head_only = 400, "text/plain", b"bad request\n", False
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                head = await reader.readuntil(b"\r\n\r\n")
            status, ctype, body, head_only = await _answer(head, registry, before)
        except (TimeoutError, asyncio.LimitOverrunError, asyncio.IncompleteReadError, OSError):
            pass
        reason = _REASONS.get(status, "Bad Request")
        try:
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + (b"" if head_only else body)
            )
            await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, host, port, limit=MAX_HEAD)
    bound = server.sockets[0].getsockname()[1] if server.sockets else port
    logger.info("metrics on http://%s:%d/metrics", host, bound)
    return server


async def _answer(
    head: bytes, registry: CollectorRegistry, before: Callable[[], Awaitable[None]] | None
) -> tuple[int, str, bytes, bool]:
    parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return 400, "text/plain", b"bad request\n", False
    method, target = parts[0], parts[1].split("?", 1)[0]
    if target != "/metrics":
        return 404, "text/plain", b"not found: try /metrics\n", False
    if method not in ("GET", "HEAD"):
        return 405, "text/plain", b"method not allowed\n", False
    if before is not None:
        try:
            await before()
        except Exception as exc:  # the server is away: Prometheus records the target down
            logger.warning("metrics scrape failed: %r", exc)
            return 503, "text/plain", f"scrape failed: {type(exc).__name__}\n".encode(), False
    return 200, CONTENT_TYPE_LATEST, generate_latest(registry), method == "HEAD"
