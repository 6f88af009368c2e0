"""One queue, from the producer's side: enqueue, counts, job records, and the pull API
(``reserve`` / ``complete`` / ``fail`` / ``release`` / ``extend``) for consumers that are not
workers, such as people working through jobs in a web app."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from ._admin import QueueAdmin
from ._checks import (
    at_to_ms,
    check_attempts,
    check_group,
    check_int,
    check_job_id,
    check_name,
    check_priority,
    check_task_name,
    expiry_option,
    lease_ms,
    new_job_id,
    to_ms,
    to_seconds,
)
from ._codec import Codec, Unrunnable
from ._convert import Convert
from ._exceptions import ConfigurationError, JobCancelled, JobNotFound
from ._handle import HandleFields, dump_handle, load_handle
from ._job import ErrorInfo, Job, JobInfo, JobState, parse_state, raise_for_outcome
from ._keys import QueueKeys
from ._leases import Leases, forward_outbox
from ._limits import MAX_JOBS_PER_CALL
from ._record import Claimed, JobRecord, Template
from ._registry import WorkerInfo, read_workers
from ._scripts import FailMode, Outcome, QueueScripts
from ._unique import OnConflict, UniqueScope, derived_key, enqueue_unique, unique_options

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from ._app import App

T = TypeVar("T")

#: most job ids one cancel script call takes (cancel_jobs sends more in several calls)
CANCEL_CHUNK = 500


class _MadeBy:
    """The Queue that made a reservation, in a slot outside its dataclass fields: not
    compared, shown, copied by ``replace`` or deep-copied by ``asdict``."""

    __slots__ = ("_queue",)
    _queue: Queue | None

    def _made_by(self, queue: Queue) -> None:
        self._queue = queue


@dataclass(slots=True)
class Reservation(_MadeBy):
    """A job leased through the pull API; pass it back to complete/fail/release/extend."""

    id: str
    token: str
    task: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    attempt: int
    max_attempts: int
    queue: str
    options: dict[str, Any] = field(default_factory=dict)

    def handle(self) -> str:
        """This reservation as a short string, for a later request in any process:
        ``app.queue(name).reservation_from(handle)`` gives it back (without its arguments).
        Signed with the App's ``signing_key`` when there is one; it holds the lease token,
        so keep it as secret as the lease (see docs/pull-api.md).

        Raises:
            ConfigurationError: the reservation was built by hand, not by ``reserve`` or
                ``reservation_from``.
        """
        queue: Queue | None = getattr(self, "_queue", None)  # set by reserve, reservation_from
        if queue is None:
            raise ConfigurationError(
                "this Reservation was built by hand; only those from reserve() or "
                "reservation_from() have a handle"
            )
        fields = HandleFields(
            self.queue,
            self.id,
            self.token,
            self.task,
            self.attempt,
            self.max_attempts,
            self.options,
        )
        return dump_handle(queue.app.codec.signer, fields)


class Queue(QueueAdmin):
    """A named queue of an App: ``app.queue("emails")``. Cheap; cached by the App.

    The operator's methods (``jobs``, ``job_detail``, ``requeue``, ``purge``, ...) come from
    ``QueueAdmin``."""

    def __init__(self, app: App, name: str) -> None:
        self.app = app
        self.name = check_name("queue name", name)
        self._keys = QueueKeys(app.prefix, name)
        self._scripts_obj: QueueScripts | None = None
        self._leases_obj: Leases | None = None

    def __repr__(self) -> str:
        return f"<Queue {self.name!r}>"

    @property
    def _scripts(self) -> QueueScripts:
        s = self._scripts_obj
        if s is None or s.client is not self.app.redis:
            s = self._scripts_obj = QueueScripts(self.app.redis, self._keys)
        return s

    @property
    def _leases(self) -> Leases:
        leases = self._leases_obj
        if leases is None or leases.scripts is not self._scripts:
            leases = self._leases_obj = Leases(self)
        return leases

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
        priority: int = 0,
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
    ) -> Job[Any]:
        """Enqueue a job by task name, for producers that do not import the task's code.

        The worker checks the name; an unknown one is dead-lettered with the reason. The
        options are those of ``Task.options``.
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
        codec = self.app.codec
        template = Template(
            task,
            check_attempts(max_attempts if max_attempts is not None else self.app.max_attempts),
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
        return (await self._enqueue([record()]))[0]

    async def _enqueue(
        self, jobs: Sequence[JobRecord], convert: Convert | None = None
    ) -> list[Job[Any]]:
        """Store prepared jobs in one round trip (``convert``: their task's result decoder)."""
        if not jobs:
            return []
        hooks = self.app.hooks
        if hooks.on_enqueue:  # before/after-enqueue hooks (_hooks.py)
            event = hooks.before(self.name, jobs[0].template.task, tuple(j.id for j in jobs))
            await self._scripts.enqueue(jobs)
            hooks.after(event)
        else:
            await self._scripts.enqueue(jobs)
        return [Job(self, job.id, convert) for job in jobs]

    async def _enqueue_run(
        self, template: Template, pairs: list[Any], convert: Convert | None = None
    ) -> list[Job[Any]]:
        """Store jobs that share one template: ``pairs`` is id, payload, id, payload, ...
        (the fast path of ``enqueue_many``)."""
        if not pairs:
            return []
        hooks = self.app.hooks
        if hooks.on_enqueue:  # before/after-enqueue hooks (_hooks.py)
            event = hooks.before(self.name, template.task, tuple(pairs[::2]))
            await self._scripts.enqueue_run(template, pairs)
            hooks.after(event)
        else:
            await self._scripts.enqueue_run(template, pairs)
        return [Job(self, pairs[i], convert) for i in range(0, len(pairs), 2)]

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
        return await self._cancel([check_job_id(job_id) for job_id in job_ids])

    async def _cancel(self, ids: Sequence[str]) -> int:
        """``cancel_jobs`` without the checks of the ids (ids read back from Redis)."""
        cancelled = 0
        for i in range(0, len(ids), CANCEL_CHUNK):
            now, _ = await self._scripts.cancel(ids[i : i + CANCEL_CHUNK], self.app.dead_ttl_ms)
            cancelled += now
        return cancelled

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

    async def job_info(self, job_id: str) -> JobInfo:
        raw = await self._scripts.job_record(job_id)
        return job_info_from(self.app.codec, self.name, job_id, raw)

    async def _job_state(self, job_id: str) -> JobState:
        state, _, _ = await self._scripts.watch(job_id, register=False)
        if not state:
            raise JobNotFound(job_id)
        return parse_state(job_id, state)

    async def _wait_result(self, job_id: str, timeout: float | None) -> Any:
        codec = self.app.codec

        async def check() -> tuple[bool, Any]:
            return watched_outcome(
                codec, self.name, job_id, await self._scripts.watch(job_id, register=True)
            )

        waiter = self.app.result_waiter
        channel = self._keys.done_channel
        return await waiter.wait(channel, job_id, check, timeout, f"job {job_id!r}")

    # ------------------------------------------------------------------ pull API
    async def reserve(
        self,
        n: int = 1,
        *,
        lease: float | timedelta | None = None,
        wait: float | timedelta | None = None,
    ) -> list[Reservation]:
        """Lease up to ``n`` runnable jobs, highest priority first.

        Args:
            n: how many jobs at most (one call leases at most 1,000).
            lease: seconds until an abandoned reservation returns to the queue (default: the
                App's ``lease``); renew it with ``extend``.
            wait: when nothing is runnable, block up to this many seconds for a job (no
                polling); ``None`` returns at once.

        Returns:
            The reservations, possibly empty. Jobs whose payload cannot be decoded are
            dead-lettered with the reason instead of being returned.
        """
        check_int(n, 1, "n")
        lease_for = lease_ms(self.app.lease if lease is None else lease)
        wait_s = to_seconds(wait, "wait")
        loop = asyncio.get_running_loop()
        deadline = None if wait_s is None else loop.time() + wait_s
        woken = False
        leases = self._leases
        while True:
            res = await leases.claim(min(n, MAX_JOBS_PER_CALL), lease_for)
            out = []
            for c in res.jobs:
                r = await self._decode(leases, c)
                if r is not None:
                    out.append(r)
            if out or deadline is None:
                return out
            if res.jobs:  # all were undecodable: try again at once
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                if woken:
                    # leaving empty-handed with a wake-up we took: hand it back, another
                    # consumer may be blocked on an older, longer timeout
                    await leases.wake()
                return []
            # below the socket timeout, so a long wait never looks like a dead connection
            block = min(remaining, self.app.socket_timeout / 2)
            if res.next_wake_ms >= 0:
                block = min(block, max((res.next_wake_ms - res.now_ms) / 1000, 0.001))
            woken = await self._scripts.wait_for_wake(block) or woken

    async def _decode(self, leases: Leases, c: Claimed) -> Reservation | None:
        """A leased job as a Reservation, its arguments read by its task's type hints if this
        App has the task; one that cannot be decoded is dead-lettered with the reason
        (``CorruptPayload``, ``InvalidArguments`` or ``BadSignature``, as a worker would)."""
        try:
            args, kwargs, options = leases.decode(c)
            task = self.app.tasks.get(c.task)  # its hints, when this App has the task
            decode = None if task is None else task.args_decoder
            if decode is not None:
                try:
                    args, kwargs = decode(args, kwargs)
                except Exception as exc:
                    raise Unrunnable("InvalidArguments", str(exc)) from exc
        except Exception as exc:
            await leases.fail(c.id, c.token, exc, FailMode.DEAD)
            return None
        r = Reservation(
            c.id,
            c.token,
            c.task,
            args,
            kwargs,
            c.attempt,
            c.max_attempts,
            self.name,
            options,
        )
        r._made_by(self)
        return r

    def reservation_from(self, handle: str) -> Reservation:
        """The reservation a handle (``Reservation.handle()``) stands for, to ``complete``,
        ``fail``, ``release`` or ``extend`` in a later request, in any process. No I/O: a
        lease that is over is found out by those calls (``LeaseLost``), as with the
        reservation itself. Its ``args`` and ``kwargs`` are empty (a handle does not carry
        them; ``queue.job(r.id).info()`` reads them) and its ``options`` hold only what
        completing needs.

        Raises:
            InvalidHandle: not a handle of this queue: garbled, another queue's, or (with a
                ``signing_key``) tampered, unsigned or signed with a key not accepted here.
        """
        f = load_handle(self.app.codec.signer, self.name, handle)
        r = Reservation(
            f.job_id, f.token, f.task, (), {}, f.attempt, f.max_attempts, self.name, f.options
        )
        r._made_by(self)
        return r

    async def complete(self, reservation: Reservation, result: Any = None) -> None:
        """Finish a reserved job with its result.

        Raises:
            LeaseLost: the lease ran out and the job went to another consumer, or it finished.
            JobNotFound: the job's record is gone.
            SerializationError: the result cannot be serialised (nothing is changed).
        """
        codec = self.app.codec
        data = codec.dump_result(
            result,
            queue=self.name,
            job_id=reservation.id,
            task=reservation.task,
            options=reservation.options,
        )
        task = self.app.tasks.get(reservation.task)
        ttl = codec.result_ttl_ms(reservation.options, None if task is None else task.result_ttl)
        outcome = (await self._leases.complete([(reservation.id, reservation.token, data, ttl)]))[0]
        outcome.check(reservation.id)
        if outcome is Outcome.FORWARD:  # its batch lives on another queue: hand it over now
            try:
                await forward_outbox(self)
            except Exception as exc:  # the job completed; a worker's or reap's turn forwards it
                logger.warning(
                    "job %s completed; forwarding its batch outcome failed: %r", reservation.id, exc
                )

    async def fail(
        self,
        reservation: Reservation,
        error: BaseException | str,
        *,
        retry: bool = True,
        delay: float | timedelta | None = None,
    ) -> bool:
        """Record a failed attempt. With ``retry`` and attempts left, the job runs again after
        ``delay`` (default: the App's backoff); otherwise it is dead-lettered.

        Returns:
            True if a retry was scheduled, False if the job was dead-lettered.
        """
        mode, delay_ms = FailMode.DEAD, 0
        if retry:
            d = to_seconds(delay, "delay")
            mode = FailMode.RETRY
            delay_ms = to_ms(
                self.app.backoff.delay(reservation.attempt) if d is None else d, "delay"
            )
        outcome = await self._leases.fail(reservation.id, reservation.token, error, mode, delay_ms)
        outcome.check(reservation.id)
        return outcome is Outcome.RETRY

    async def release(
        self, reservation: Reservation, *, delay: float | timedelta = 0, refund: bool = True
    ) -> None:
        """Give a reserved job back unfinished; by default its attempt is not counted."""
        pairs = [(reservation.id, reservation.token)]
        outcome = (await self._leases.release(pairs, to_ms(delay, "delay"), refund))[0]
        outcome.check(reservation.id)

    async def extend(
        self, reservation: Reservation, *, lease: float | timedelta | None = None
    ) -> None:
        """Renew a reservation's lease to ``lease`` seconds from now (server clock).

        Raises:
            JobCancelled: the job was cancelled meanwhile; it is now recorded as cancelled
                and the reservation is over.
            LeaseLost, JobNotFound: as for ``complete``.
        """
        lease_for = lease_ms(self.app.lease if lease is None else lease)
        leases = self._leases
        outcome = (await leases.extend([(reservation.id, reservation.token)], lease_for))[0]
        if outcome is Outcome.CANCEL_REQUESTED:
            why = Unrunnable("Cancelled", "cancelled while reserved")
            await leases.fail(reservation.id, reservation.token, why, FailMode.CANCELLED)
            raise JobCancelled(reservation.id)
        outcome.check(reservation.id)

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
            r, p, t = await self._leases.reap(min(limit, MAX_JOBS_PER_CALL))
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


def state_counts(lanes: tuple[int, int, int, int, int], groups: dict[str, int]) -> dict[str, int]:
    """``Queue.counts()`` from the lane sizes and the queued jobs per group."""
    ready, prio, sched, active, dead = lanes
    queued = ready + prio + sum(groups.values())
    return {"scheduled": sched, "queued": queued, "active": active, "failed": dead}


def job_info_from(codec: Codec, queue: str, job_id: str, raw: Mapping[bytes, bytes]) -> JobInfo:
    """A JobInfo from a job's stored hash (``raw``): a field that cannot be read reads as
    absent and is named in ``JobInfo.garbled``.

    Raises:
        JobNotFound: there is no record (an empty hash).
        CorruptRecord: its state cannot be read.
    """
    if not raw:
        raise JobNotFound(job_id)
    return _RecordReader(codec, job_id, raw).info(queue)


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


class _RecordReader:
    """Reads a job's stored hash field by field: a field that cannot be read reads as absent
    and is named in ``garbled`` (only an unreadable state raises CorruptRecord)."""

    def __init__(self, codec: Codec, job_id: str, raw: Mapping[bytes, bytes]) -> None:
        self.codec = codec
        self.job_id = job_id
        self.h = {k.decode(errors="replace"): v for k, v in raw.items()}
        self.garbled: list[str] = []

    def _read(self, field: str, name: str, parse: Callable[[bytes], T]) -> T | None:
        if field not in self.h:
            return None
        try:
            return parse(self.h[field])
        except Exception:  # anything a foreign writer left: JSON, numbers, encodings
            self.garbled.append(name)
            return None

    def _int(self, field: str, name: str) -> int | None:
        return self._read(field, name, int)

    def info(self, queue: str) -> JobInfo:
        codec, h = self.codec, self.h
        state = parse_state(self.job_id, h.get("s", b""))
        task = h.get("t", b"").decode(errors="replace")
        args: tuple[Any, ...] | None = None
        kwargs: dict[str, Any] | None = None
        try:  # a corrupt or unverified payload still has an inspectable record
            args, kwargs = codec.load_args(
                queue, self.job_id, task, h.get("p", b""), h.get("o", b"")
            )
        except Exception:
            self.garbled += ["args", "kwargs"]
        error: ErrorInfo | None = codec.load_error(h["e"]) if "e" in h else None
        info = JobInfo(
            id=self.job_id,
            queue=queue,
            task=task,
            state=state,
            attempts=self._int("a", "attempts") or 0,
            max_attempts=self._int("m", "max_attempts") or 1,
            priority=self._int("pr", "priority") or 0,
            created_ms=self._int("ct", "created_ms") or 0,
            due_ms=self._int("due", "due_ms"),
            finished_ms=self._int("f", "finished_ms"),
            error=error,
            args=args,
            kwargs=kwargs,
            progress=self._read("pg", "progress", codec.json.loads),
        )
        if self.garbled:
            info = dataclasses.replace(info, garbled=tuple(self.garbled))
        return info


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
