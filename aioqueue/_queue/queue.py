"""One queue, from the producer's side: enqueue, counts, settings and job records. A ``Queue``
holds its faces and offers their methods as its own: the pull API (``reserve`` / ``complete``
/ ...) of ``QueuePull`` (``pull.py``), the operator's methods of ``QueueAdmin`` (``admin.py``)
and the event stream's of ``QueueEvents`` (``events.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from .._model.checks import (
    at_to_ms,
    check_attempts,
    check_group,
    check_int,
    check_job_id,
    check_priority,
    check_task_name,
    expiry_option,
    new_job_id,
    to_ms,
    to_seconds,
)
from .._model.claimcheck import put_blobs
from .._model.codec import Codec
from .._model.convert import Convert
from .._model.exceptions import ConfigurationError, JobNotFound
from .._model.held import held, own_held
from .._model.job import Job, JobState, parse_state, raise_for_outcome
from .._model.limits import MAX_JOBS_PER_CALL
from .._model.record import JobRecord, Template
from .admin import QueueAdmin
from .core import QueueCore
from .events import QueueEvents
from .leases import forward_outbox
from .owner import OwnedQueue, QueueOwner
from .pull import QueuePull
from .registry import WorkerInfo, read_workers
from .rekey import RekeyReport
from .rekey import rekey as rekey_queue
from .tasktable import Declared, lookup
from .unique import OnConflict, UniqueScope, derived_key, enqueue_unique, unique_options

T = TypeVar("T")

#: most job ids one cancel script call takes (cancel_jobs sends more in several calls)
CANCEL_CHUNK = 500


@own_held
class Queue(QueueCore):
    """A named queue of an App: ``app.queue("emails")``. Cheap; cached by the App.

    A queue is its core (``QueueCore``: the App, name, keys and the door to them) holding its
    faces, whose methods it offers as its own: the producer's are here, the pull API
    (``reserve``, ``complete``, ``fail``, ``release``, ``extend``, ``reservation_from``) is
    ``QueuePull``'s, the operator's (``jobs``, ``job_detail``, ``requeue``, ``purge``, ...)
    ``QueueAdmin``'s and the event stream's ``QueueEvents``'."""

    def __init__(self, app: QueueOwner, name: str) -> None:
        super().__init__(app, name)
        self._pull = QueuePull(self)
        self._admin = QueueAdmin(self)
        self._events = QueueEvents(self)

    def __repr__(self) -> str:
        return f"<Queue {self.name!r}>"

    # ------------------------------------------------------------------ the pull API
    reserve = held("_pull", QueuePull.reserve)
    reservation_from = held("_pull", QueuePull.reservation_from)
    complete = held("_pull", QueuePull.complete)
    fail = held("_pull", QueuePull.fail)
    release = held("_pull", QueuePull.release)
    extend = held("_pull", QueuePull.extend)

    # ------------------------------------------------------------------ the operator's
    jobs = held("_admin", QueueAdmin.jobs)
    search = held("_admin", QueueAdmin.search)
    trends = held("_admin", QueueAdmin.trends)
    backlog = held("_admin", QueueAdmin.backlog)
    finished_counts = held("_admin", QueueAdmin.finished_counts)
    job_detail = held("_admin", QueueAdmin.job_detail)
    why = held("_admin", QueueAdmin.why)
    change_job = held("_admin", QueueAdmin.change_job)
    throughput = held("_admin", QueueAdmin.throughput)
    wait_time = held("_admin", QueueAdmin.wait_time)
    is_paused = held("_admin", QueueAdmin.is_paused)
    groups = held("_admin", QueueAdmin.groups)
    requeue = held("_admin", QueueAdmin.requeue)
    promote = held("_admin", QueueAdmin.promote)
    purge = held("_admin", QueueAdmin.purge)
    purge_queue = held("_admin", QueueAdmin.purge_queue)
    cancel = held("_admin", QueueAdmin.cancel)

    # ------------------------------------------------------------------ job events
    set_events = held("_events", QueueEvents.set_events)
    events_maxlen = held("_events", QueueEvents.events_maxlen)
    events_page = held("_events", QueueEvents.events_page)

    # ------------------------------------------------------------------ producer side
    async def enqueue(
        self,
        task: str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        delay: float | timedelta | None = None,
        at: datetime | float | None = None,
        job_id: str | None = None,
        priority: int | None = None,
        group: str | None = None,
        max_attempts: int | None = None,
        timeout: float | timedelta | None = None,
        result_ttl: float | timedelta | None = None,
        expires: datetime | float | timedelta | None = None,
        unique: bool = False,
        unique_key: str | None = None,
        unique_for: float | timedelta | None = None,
        unique_scope: UniqueScope | None = None,
        on_conflict: OnConflict | None = None,
        allow_unknown: bool = False,
    ) -> Job[Any]:
        """Enqueue a job by task name, for producers that do not import the task's code.

        The options are those of ``Task.options``. Those not given (``max_attempts``,
        ``priority``) are the task's as its live workers declared them (docs/tasks.md).

        Raises:
            UnknownTask: live workers serve this queue and none declared the task (the message
                suggests close names); ``allow_unknown=True`` enqueues it anyway (a worker
                that does not know it hands it back, then dead-letters it). With no live
                worker on the queue, the job is enqueued without a check.
        """
        spec = unique_options(
            unique,
            unique_key,
            unique_for,
            unique_scope,
            on_conflict,
            delay is not None or at is not None,
        )
        check_task_name(task)
        if not isinstance(args, list | tuple):
            raise ConfigurationError(f"args must be a list or tuple, not {type(args).__name__}")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise ConfigurationError(f"kwargs must be a mapping, not {type(kwargs).__name__}")
        if delay is not None and at is not None:
            raise ConfigurationError("give delay= or at=, not both")
        extra: dict[str, float] = {}
        t = to_seconds(timeout, "timeout")
        if t is not None:
            extra["timeout"] = t
        rt = to_seconds(result_ttl, "result_ttl")
        if rt is not None:
            extra["result_ttl"] = rt
        if expires is not None:
            key, value = expiry_option(expires)
            extra[key] = value
        known = await self._declared(task, allow_unknown)
        if max_attempts is None:
            max_attempts = self.app.max_attempts if known is None else known.max_attempts
        if priority is None:
            priority = 0 if known is None else known.priority
        codec = self.app.codec
        template = Template(
            task,
            check_attempts(max_attempts),
            -1 if delay is None else to_ms(delay, "delay"),
            -1 if at is None else at_to_ms(at),
            check_priority(priority),
            "" if group is None else check_group(group),
            options=codec.dump_options(extra) if extra else b"",
            unique="" if spec is None else spec.template_value,
        )
        jid = new_job_id() if job_id is None else check_job_id(job_id)
        ukey = "" if spec is None else spec.key or derived_key(task, args, kwargs or {})

        def record(_: int = 0, holder: str | None = None) -> JobRecord:
            job_id = holder or jid
            payload = codec.dump_args(
                self.name, job_id, task, tuple(args), dict(kwargs or {}), template.options
            )
            return JobRecord(job_id, payload, template, ukey)

        if spec is not None:
            return (await enqueue_unique(self, [record()], spec, record))[0]
        return (await store_jobs(self, [record()]))[0]

    async def _declared(self, task: str, allow_unknown: bool) -> Declared | None:
        """The defaults live workers declared for ``task`` (``_tasktable.py``)."""
        seen = self._known.get(task)
        if seen is not None:
            return seen[0]
        found = await lookup(self._scripts, self.name, task)
        known = found.check(allow_unknown)  # UnknownTask: not remembered, asked again
        if known is not None or not found.live:  # (an allowed unknown name is asked again)
            self._known.put(task, known)
        return known

    def job(self, job_id: str) -> Job[Any]:
        """A handle on a job of this queue by id (no I/O).

        Raises:
            ConfigurationError: ``job_id`` is not a valid job id (empty, too long, not UTF-8).
        """
        return Job(self, check_job_id(job_id))

    async def cancel_jobs(self, job_ids: Sequence[str]) -> int:
        """Cancel jobs of this queue from any process: queued and scheduled ones at once;
        running ones are stopped by their worker at its next heartbeat and recorded as
        cancelled. Finished jobs are left alone. Returns how many were cancelled at once.

        The ids go to the server in chunks of ``CANCEL_CHUNK`` (500), one script call each:
        each chunk is atomic, the whole call is not, so one large call never holds the
        server up for long (30,000 ids in one script took 0.44 s, during which the server
        answered nobody).

        Raises:
            ConfigurationError: an id is not a valid job id (empty, too long, not UTF-8);
                nothing was cancelled.
        """
        return await cancel_ids(self, [check_job_id(job_id) for job_id in job_ids])

    async def counts(self) -> dict[str, int]:
        """Jobs per state: scheduled, queued, active, failed (dead letters)."""
        return state_counts(await self._scripts.lane_counts(), await self.group_counts())

    async def group_counts(self) -> dict[str, int]:
        """Queued jobs per group, for every group that has any."""
        return await self._scripts.group_counts()

    # ------------------------------------------------------------------ quality of service
    async def pause(self, group: str | None = None) -> None:
        """Stop handing out jobs of this queue (or of one group), from any process; jobs
        already running finish. Enqueueing still works."""
        await self._scripts.configure("pause", _group_arg(group))

    async def resume(self, group: str | None = None) -> None:
        """Undo ``pause`` for the queue (or one group); idle consumers wake at once."""
        await self._scripts.configure("resume", _group_arg(group))

    async def set_group_limit(self, group: str | None, limit: int | None) -> None:
        """At most ``limit`` jobs of ``group`` active at once, across every consumer
        (``None``: no limit of its own). ``group=None`` sets the default for every group
        without its own limit."""
        await self._scripts.configure("limit", _group_arg(group), _count_arg(limit, "limit"))

    async def set_rate_limit(
        self, limit: int | None, period: float | timedelta = 1.0, *, group: str | None = None
    ) -> None:
        """At most ``limit`` jobs of this queue (or of ``group``) start per ``period``
        seconds, across every consumer, in fixed windows (``None``: no limit)."""
        n = _count_arg(limit, "limit")
        await self._scripts.configure("rate", _group_arg(group), n, _period_arg(n, period))

    async def set_max_queued(
        self, limit: int | None, *, wait: float | timedelta | None = None
    ) -> None:
        """Backpressure: an enqueue that would take this queue's backlog (``backlog()``: its
        jobs queued in any lane or group, waiting aside on a limiter, or scheduled; counted
        exactly) past ``limit`` stores nothing and raises
        ``QueueFull``, after waiting up to ``wait`` seconds for room (backing off). Stored on
        the server, so every producer obeys it; ``None``: no limit (docs/flow-control.md)."""
        n = _count_arg(limit, "limit")
        wait_ms = to_ms(wait, "wait") if n and wait is not None else 0
        await self._scripts.configure("max_queued", "", n, str(wait_ms) if n else "")

    async def max_queued(self) -> tuple[int, float] | None:
        """The backpressure setting: (limit, wait seconds), or None when there is none."""
        conf = await self._scripts.queue_settings()
        n, wait = conf.get(b"maxq", b""), conf.get(b"maxq_wait", b"0")
        if not n.isdigit() or not 0 < int(n) < 2**53:  # absent or garbage: none, as in Lua
            return None
        return int(n), int(wait) / 1000 if wait.isdigit() else 0.0

    async def set_default_group_rate_limit(
        self, limit: int | None, period: float | timedelta = 1.0
    ) -> None:
        """The rate limit of every group without one of its own (``None``: none)."""
        n = _count_arg(limit, "limit")
        await self._scripts.configure("group_rate", "", n, _period_arg(n, period))

    async def stats(self) -> dict[str, int]:
        """Lifetime counters: enqueued, completed, failed, retried, expired (leases)."""
        raw = await self._scripts.stats()
        # a garbled counter is left out (the next script to count it sets it aside)
        return {k.decode(errors="replace"): int(v) for k, v in raw.items() if v.isdigit()}

    async def job_state(self, job_id: str) -> JobState:
        """What ``Job.status()`` reads (an internal of ``Job``, left out of the API reference)."""
        state, _, _ = await self._scripts.watch(job_id, register=False)
        if not state:
            raise JobNotFound(job_id)
        return parse_state(job_id, state)

    async def wait_result(self, job_id: str, seconds: float | None) -> Any:
        """What ``Job.result()`` waits for, at most ``seconds`` (an internal of ``Job``, as
        ``job_state``)."""
        codec = self.app.codec

        async def check() -> tuple[bool, Any]:
            return watched_outcome(
                codec, self.name, job_id, await self._scripts.watch(job_id, register=True)
            )

        waiter = self.app.result_waiter
        channel = self._keys.done_channel
        return await waiter.wait(channel, job_id, check, seconds, f"job {job_id!r}")

    async def workers(self) -> list[WorkerInfo]:
        """The workers registered on this queue (at most 1,000), from their heartbeats; a
        worker that missed three heartbeats shows ``alive=False`` until it is buried."""
        return await read_workers(self._scripts)

    async def reap(self, limit: int = MAX_JOBS_PER_CALL) -> dict[str, int]:
        """Run queue maintenance now: bury workers that missed their heartbeats (handing
        their jobs back at once), recover expired leases, promote due delayed jobs, trim
        old dead letters, hand over outcomes of sub-jobs whose batch lives on another queue.
        Workers do this on their own; this is for pull-API-only setups."""
        rec = pro = trimmed = 0
        while True:  # the script moves at most MAX_JOBS_PER_CALL jobs per step
            r, p, t = await self.leases.reap(min(limit, MAX_JOBS_PER_CALL))
            rec, pro, trimmed = rec + r, pro + p, trimmed + t
            limit -= max(r, p)
            if limit <= 0 or max(r, p) < MAX_JOBS_PER_CALL:
                break
        forwarded = await forward_outbox(self, limit)
        return {
            "recovered": rec,
            "promoted": pro,
            "dead_trimmed": trimmed,
            "batch_outcomes_forwarded": forwarded,
        }

    async def rekey(self, *, batch: int = 200) -> RekeyReport:
        """Sign and encrypt again, with the first of the App's ``signing_key`` and
        ``encryption_key`` lists, every stored payload and result of this queue sealed with
        another listed key (jobs in every state, and its batches' results): ``batch`` records
        a step, each written back only if unchanged meanwhile. Values no listed key accepts
        are left and counted as ``unreadable`` (docs/security.md, key rotation)."""
        return await rekey_queue(self, check_int(batch, 1, "batch"))


async def store_jobs(
    queue: OwnedQueue, jobs: Sequence[JobRecord], convert: Convert | None = None
) -> list[Job[Any]]:
    """Store prepared jobs on ``queue`` in one round trip (``convert``: their task's result
    decoder), with the App's before/after-enqueue hooks (``_app/hooks.py``)."""
    if not jobs:
        return []
    hooks = queue.app.hooks
    if hooks.on_enqueue:
        event = hooks.before(queue.name, jobs[0].template.task, tuple(j.id for j in jobs))
        await _store(queue, jobs)
        hooks.after(event)
    else:
        await _store(queue, jobs)
    return [Job(queue, job.id, convert) for job in jobs]


async def _store(queue: OwnedQueue, jobs: Sequence[JobRecord]) -> None:
    await put_blobs(queue.app.codec.claim, queue.name, (j.id for j in jobs))
    # one job shares the round trip of the others enqueued meanwhile (coalesce.py)
    if len(jobs) == 1:
        await queue.coalescer.enqueue(jobs[0])
    else:
        await queue.door.enqueue(jobs)


async def store_run(
    queue: OwnedQueue, template: Template, pairs: list[Any], convert: Convert | None = None
) -> list[Job[Any]]:
    """Store jobs on ``queue`` that share one template: ``pairs`` is id, payload, id,
    payload, ... (the fast path of ``enqueue_many``)."""
    if not pairs:
        return []
    await put_blobs(queue.app.codec.claim, queue.name, pairs[::2])
    hooks = queue.app.hooks
    if hooks.on_enqueue:  # before/after-enqueue hooks (_app/hooks.py)
        event = hooks.before(queue.name, template.task, tuple(pairs[::2]))
        await queue.door.enqueue_run(template, pairs)
        hooks.after(event)
    else:
        await queue.door.enqueue_run(template, pairs)
    return [Job(queue, pairs[i], convert) for i in range(0, len(pairs), 2)]


async def cancel_ids(queue: OwnedQueue, ids: Sequence[str]) -> int:
    """``Queue.cancel_jobs`` without the checks of the ids (ids read back from Redis)."""
    cancelled = 0
    for i in range(0, len(ids), CANCEL_CHUNK):
        now, _ = await queue.door.cancel(ids[i : i + CANCEL_CHUNK], queue.app.dead_ttl_ms)
        cancelled += now
    return cancelled


def state_counts(lanes: tuple[int, int, int, int, int], groups: dict[str, int]) -> dict[str, int]:
    """``Queue.counts()`` from the lane sizes and the queued jobs per group."""
    ready, prio, sched, active, dead = lanes
    queued = ready + prio + sum(groups.values())
    return {"scheduled": sched, "queued": queued, "active": active, "failed": dead}


def watched_outcome(
    codec: Codec, queue: str, job_id: str, watched: tuple[str, bytes, bytes]
) -> tuple[bool, Any]:
    """What a result waiter makes of watch.lua's reply: (True, result) once completed,
    (False, None) while unfinished.

    Raises:
        JobNotFound: no record of the job.
        JobFailed / JobCancelled: it was dead-lettered or cancelled.
    """
    state, result, error = watched
    if not state:
        raise JobNotFound(job_id)
    state = parse_state(job_id, state)
    if state == JobState.COMPLETED:
        return True, codec.load_result(result, queue=queue, job_id=job_id)
    if state in (JobState.FAILED, JobState.CANCELLED):
        raise_for_outcome(job_id, state, codec.load_error(error) if error else None)
    return False, None


def _group_arg(group: str | None) -> str:
    return "" if group is None else check_group(group)


def _count_arg(value: int | None, what: str) -> str:
    if value is None:
        return ""
    return str(check_int(value, 1, what, " or None"))


def _period_arg(n: str, period: float | timedelta) -> str:
    if not n:
        return ""
    ms = to_ms(period, "period")
    if ms < 1:
        raise ConfigurationError("period must be at least 1 ms")
    return str(ms)
