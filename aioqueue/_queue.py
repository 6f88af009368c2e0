"""One queue, from the producer's side: enqueue, counts, job records, and the pull API
(``reserve`` / ``complete`` / ``fail`` / ``release`` / ``extend``) for consumers that are not
workers, such as people working through jobs in a web app."""

from __future__ import annotations

import asyncio
import contextlib
import traceback as tb
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

import redis.exceptions as rexc

from ._exceptions import ConfigurationError, JobCancelled, JobNotFound
from ._job import Job, JobInfo, JobState, raise_for_outcome
from ._keys import QueueKeys, check_name
from ._limits import CLAIMED_JOB_VALUES, MAX_JOBS_PER_CALL
from ._scripts import (
    CANCEL_REQUESTED,
    Claimed,
    QueueScripts,
    check_code,
    parse_claimed,
    wrap_redis_error,
)
from ._task import (
    check_attempts,
    check_group,
    check_int,
    check_job_id,
    check_priority,
    new_job_id,
)
from ._timeutil import at_to_ms, to_ms, to_seconds

if TYPE_CHECKING:
    from ._app import App


@dataclass(slots=True)
class Reservation:
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


def error_record(app: App, error: BaseException | str, *, with_traceback: bool = True) -> bytes:
    """The stored form of a failure: JSON with type, message and traceback."""
    if isinstance(error, BaseException):
        rec = {
            "type": getattr(error, "kind", None) or type(error).__name__,
            "message": str(error),
            "traceback": "".join(tb.format_exception(error)) if with_traceback else None,
        }
    else:
        rec = {"type": "Error", "message": str(error), "traceback": None}
    return app.json.dumps(rec)


class Queue:
    """A named queue of an App: ``app.queue("emails")``. Cheap; cached by the App."""

    def __init__(self, app: App, name: str) -> None:
        self.app = app
        self.name = check_name("queue name", name)
        self.keys = QueueKeys(app.prefix, name)
        self._scripts_obj: QueueScripts | None = None

    def __repr__(self) -> str:
        return f"<Queue {self.name!r}>"

    @property
    def _scripts(self) -> QueueScripts:
        s = self._scripts_obj
        if s is None or s.client is not self.app.redis:
            s = self._scripts_obj = QueueScripts(self.app.redis, self.keys)
        return s

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
    ) -> Job[Any]:
        """Enqueue a job by task name, for producers that do not import the task's code.

        The worker checks the name; an unknown one is dead-lettered with the reason.
        """
        if not isinstance(task, str) or not task:
            raise ConfigurationError(f"task name must be a non-empty string, not {task!r}")
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
        jid = new_job_id() if job_id is None else check_job_id(job_id)
        spec = [
            jid,
            task,
            self.app.dump_args(jid, task, tuple(args), dict(kwargs or {})),
            check_attempts(max_attempts if max_attempts is not None else self.app.max_attempts),
            -1 if delay is None else to_ms(delay, "delay"),
            -1 if at is None else at_to_ms(at),
            check_priority(priority),
            "" if group is None else check_group(group),
            "",
            "",
            self.app.dump_options(extra) if extra else "",
        ]
        return (await self.enqueue_specs([spec]))[0]

    async def enqueue_specs(self, specs: Sequence[Sequence[Any]]) -> list[Job[Any]]:
        """Store prepared jobs (11 enqueue.lua values each) in one round trip."""
        if not specs:
            return []
        await self._scripts.enqueue(specs)
        return [Job(self, spec[0]) for spec in specs]

    async def enqueue_run(self, template: Sequence[Any], pairs: list[Any]) -> list[Job[Any]]:
        """Store jobs that share one template (enqueue.lua's 9 values): ``pairs`` is id,
        payload, id, payload, ... (the fast path of ``enqueue_many``)."""
        if not pairs:
            return []
        await self._scripts.enqueue_run(template, pairs)
        return [Job(self, pairs[i]) for i in range(0, len(pairs), 2)]

    def job(self, job_id: str) -> Job[Any]:
        """A handle on a job of this queue by id (no I/O)."""
        return Job(self, job_id)

    async def cancel_jobs(self, job_ids: Sequence[str]) -> int:
        """Cancel jobs of this queue from any process: queued and scheduled ones at once;
        running ones are stopped by their worker at its next heartbeat and recorded as
        cancelled. Finished jobs are left alone. Returns how many were cancelled at once."""
        if not job_ids:
            return 0
        now, _ = await self._scripts.cancel(list(job_ids), self.app.dead_ttl_ms)
        return now

    async def counts(self) -> dict[str, int]:
        """Jobs per state: scheduled, queued, active, failed (dead letters)."""
        k = self.keys
        r = self.app.redis
        try:
            pipe = r.pipeline(transaction=False)
            pipe.llen(k.ready)
            for key in (k.prio, k.scheduled, k.active, k.dead):
                pipe.zcard(key)
            ready, prio, sched, active, dead = await pipe.execute()
            queued = ready + prio + sum((await self.group_counts()).values())
        except (rexc.ConnectionError, rexc.TimeoutError, OSError) as exc:
            raise wrap_redis_error(exc) from exc
        return {"scheduled": sched, "queued": queued, "active": active, "failed": dead}

    async def group_counts(self) -> dict[str, int]:
        """Queued jobs per group, for every group that has any."""
        k = self.keys
        r = self.app.redis
        # a group with queued jobs is in the ring, or parked: by its limit (it has active
        # jobs), by its rate (gwait) or paused (gconf)
        pipe = r.pipeline(transaction=False)
        pipe.zrange(k.ring, 0, -1)
        pipe.hkeys(k.gactive)
        pipe.zrange(k.gwait, 0, -1)
        pipe.hkeys(k.gconf)
        ring, gactive, gwait, gconf = await pipe.execute()
        names = {x.decode() for x in (*ring, *gactive, *gwait)}
        names |= {f.decode()[7:] for f in gconf if f.startswith(b"paused:")}
        names.discard("")
        groups = sorted(names)
        pipe = r.pipeline(transaction=False)
        for g in groups:
            pipe.zcard(k.lane(g))
        sizes = await pipe.execute()
        return {g: n for g, n in zip(groups, sizes, strict=True) if n}

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
        raw = cast(dict[bytes, bytes], await self.app.redis.hgetall(self.keys.stats))
        return {k.decode(): int(v) for k, v in raw.items()}

    async def job_info(self, job_id: str) -> JobInfo:
        raw = cast(dict[bytes, bytes], await self.app.redis.hgetall(self.keys.job(job_id)))
        if not raw:
            raise JobNotFound(job_id)
        h = {k.decode(): v for k, v in raw.items()}

        def num(name: str) -> int | None:
            return int(h[name]) if name in h else None

        args: tuple[Any, ...] | None = None
        kwargs: dict[str, Any] | None = None
        with contextlib.suppress(Exception):  # a corrupt payload still has an inspectable record
            task = h.get("t", b"").decode(errors="replace")
            args, kwargs = self.app.load_args(job_id, task, h.get("p", b""))
        return JobInfo(
            id=job_id,
            queue=self.name,
            task=h.get("t", b"").decode(errors="replace"),
            state=JobState(h["s"].decode()),
            attempts=num("a") or 0,
            max_attempts=num("m") or 1,
            priority=num("pr") or 0,
            created_ms=num("ct") or 0,
            due_ms=num("due"),
            finished_ms=num("f"),
            error=self.app.load_error(h["e"]) if "e" in h else None,
            args=args,
            kwargs=kwargs,
            progress=self.app.json.loads(h["pg"]) if "pg" in h else None,
        )

    async def _wait_result(self, job_id: str, timeout: float | None) -> Any:
        async def check() -> tuple[bool, Any]:
            state, result, error = await self._scripts.watch(job_id, register=True)
            if not state:
                raise JobNotFound(job_id)
            if state == JobState.COMPLETED:
                return True, self.app.load_result(result)
            if state in (JobState.FAILED, JobState.CANCELLED):
                err = self.app.load_error(error) if error else None
                raise_for_outcome(job_id, state, err)
            return False, None

        waiter = self.app.result_waiter
        return await waiter.wait(self.keys.done_channel, job_id, check, timeout, f"job {job_id!r}")

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
        lease_ms = to_ms(self.app.lease if lease is None else lease, "lease")
        if lease_ms < 1:
            raise ConfigurationError("lease must be at least 1 ms")
        wait_s = to_seconds(wait, "wait")
        loop = asyncio.get_running_loop()
        deadline = None if wait_s is None else loop.time() + wait_s
        woken = False
        while True:
            res = await self._scripts.claim(
                min(n, MAX_JOBS_PER_CALL), lease_ms, self.app.dead_ttl_ms
            )
            out = []
            for c in res.jobs:
                r = await self._decode(c)
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
                    await self.app.redis.lpush(self.keys.wake, b"1")
                return []
            # below the socket timeout, so a long wait never looks like a dead connection
            block = min(remaining, self.app.socket_timeout / 2)
            if res.next_wake_ms >= 0:
                block = min(block, max((res.next_wake_ms - res.now_ms) / 1000, 0.001))
            woken = await self.wait_for_wake(block) or woken

    async def wait_for_wake(self, seconds: float) -> bool:
        """Block until a producer leaves a wake token or ``seconds`` pass (no polling);
        True if a token was taken."""
        try:
            async with asyncio.timeout(seconds + self.app.socket_timeout / 2):
                return await self.app.redis.blpop([self.keys.wake], max(seconds, 0.001)) is not None
        except (rexc.ConnectionError, rexc.TimeoutError, OSError) as exc:
            raise wrap_redis_error(exc) from exc

    async def wait_for_handoff(self, seconds: float, worker_id: str) -> list[Claimed]:
        """A parked worker's wait: block until jobs are handed to ``worker_id`` (returned,
        already leased to it), a wake token is left, or ``seconds`` pass (both: [])."""
        hand = self.keys.hand(worker_id)
        try:
            async with asyncio.timeout(seconds + self.app.socket_timeout / 2):
                res = await self.app.redis.execute_command(  # type: ignore[no-untyped-call]
                    "BLMPOP", max(seconds, 0.001), 2, hand, self.keys.wake,
                    "LEFT", "COUNT", CLAIMED_JOB_VALUES * MAX_JOBS_PER_CALL,
                )  # fmt: skip
        except (rexc.ConnectionError, rexc.TimeoutError, OSError) as exc:
            raise wrap_redis_error(exc) from exc
        if res is None or res[0] != hand.encode():
            return []
        return parse_claimed(res[1])

    async def _decode(self, c: Claimed) -> Reservation | None:
        try:
            args, kwargs = self.app.load_args(c.id, c.task, c.payload)
            options = self.app.load_options(c.options)
        except Exception as exc:
            err = error_record(self.app, exc)
            await self._scripts.fail(c.id, c.token, err, -1, self.app.dead_ttl_ms)
            return None
        return Reservation(
            c.id, c.token, c.task, args, kwargs, c.attempt, c.max_attempts, self.name, options
        )

    async def complete(self, reservation: Reservation, result: Any = None) -> None:
        """Finish a reserved job with its result.

        Raises:
            LeaseLost: the lease ran out and the job went to another consumer, or it finished.
            JobNotFound: the job's record is gone.
            SerializationError: the result cannot be serialised (nothing is changed).
        """
        data = self.app.dump_result(result)
        ttl = self.app.result_ttl_ms(reservation.options, self.app.tasks.get(reservation.task))
        code = (await self._scripts.complete([(reservation.id, reservation.token, data, ttl)]))[0]
        check_code(code, reservation.id)
        if code == 2:  # its batch lives on another queue: hand the outcome over now
            from ._batch import forward_outbox

            await forward_outbox(self)

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
        if retry:
            d = to_seconds(delay, "delay")
            delay_ms = to_ms(
                self.app.backoff.delay(reservation.attempt) if d is None else d, "delay"
            )
        else:
            delay_ms = -1
        code = await self._scripts.fail(
            reservation.id,
            reservation.token,
            error_record(self.app, error),
            delay_ms,
            self.app.dead_ttl_ms,
        )
        check_code(code, reservation.id)
        return code == 1

    async def release(
        self, reservation: Reservation, *, delay: float | timedelta = 0, refund: bool = True
    ) -> None:
        """Give a reserved job back unfinished; by default its attempt is not counted."""
        code = (
            await self._scripts.release(
                [(reservation.id, reservation.token)],
                to_ms(delay, "delay"),
                refund,
                self.app.dead_ttl_ms,
            )
        )[0]
        check_code(code, reservation.id)

    async def extend(
        self, reservation: Reservation, *, lease: float | timedelta | None = None
    ) -> None:
        """Renew a reservation's lease to ``lease`` seconds from now (server clock).

        Raises:
            JobCancelled: the job was cancelled meanwhile; it is now recorded as cancelled
                and the reservation is over.
            LeaseLost, JobNotFound: as for ``complete``.
        """
        lease_ms = to_ms(self.app.lease if lease is None else lease, "lease")
        code = (await self._scripts.extend([(reservation.id, reservation.token)], lease_ms))[0]
        if code == CANCEL_REQUESTED:
            err = error_record(self.app, "cancelled while reserved")
            await self._scripts.fail(
                reservation.id, reservation.token, err, -2, self.app.dead_ttl_ms
            )
            raise JobCancelled(reservation.id)
        check_code(code, reservation.id)

    async def reap(self, limit: int = 1000) -> dict[str, int]:
        """Run queue maintenance now: recover expired leases, promote due delayed jobs, trim
        old dead letters, hand over outcomes of sub-jobs whose batch lives on another queue.
        Workers do this on their own; this is for pull-API-only setups."""
        from ._batch import forward_outbox

        rec = pro = trimmed = 0
        while True:  # the script moves at most MAX_JOBS_PER_CALL jobs per step
            r, p, t = await self._scripts.reap(min(limit, MAX_JOBS_PER_CALL), self.app.dead_ttl_ms)
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
