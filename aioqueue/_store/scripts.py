"""The one door to Redis: every script call and every read of a queue's keys goes through here.

The Lua scripts are loaded from ``lua/*.lua``, each headed by its KEYS, ARGV and return codes;
the parts of the library in ``lua/lib/`` that a script needs are prepended to it (``LIB``,
``SCRIPTS``). They run with EVALSHA and are reloaded
transparently after a ``SCRIPT FLUSH`` or a failover to a server that has not seen them
(NOSCRIPT). ``QueueScripts`` has one typed method per script (and per batch operation); the
per-job codes of the scripts become ``Outcome`` values here and nowhere else. Every call, reads
included, is bounded by the App's socket timeout and raises ``ServerUnavailable`` when the
server cannot be reached, ``ServerRefused`` when it answers with an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions as rexc

from .._model.exceptions import QueueFull, ServerUnavailable
from .._model.held import held, own_held
from .._model.keys import QueueKeys
from .._model.record import (
    ClaimResult,
    JobRecord,
    Template,
    enqueue_args,
    parse_claim,
)
from .backpressure import with_room
from .durable import durability_of, durable_calls
from .hot import OrderedLine, hot_connection
from .loader import (
    SCRIPTS,
    ScriptCall,
    _nonce,
    enqueue_calls,
    enqueue_run_calls,
    evalsha,
    evalsha_many,
    parse_watch,
    text_of,
    wrap_redis_error,
)
from .outcomes import (
    _COMPLETE,
    _EXTEND,
    _FAIL,
    _FAIL_SIGNAL,
    _RELEASE,
    _REPLACE,
    FailMode,
    Outcome,
    ReplaceOutcome,
    Started,
)
from .scriptreads import QueueReads
from .wire import call_timeout, evalsha_command


@own_held
class QueueScripts:
    """The door to one queue's keys on one client: a typed method per script (and per batch
    operation), each bounded by the socket timeout, and every read of the ``QueueReads`` it
    holds (offered as its own methods: ``door.job_record(...)``)."""

    __slots__ = ("base", "client", "keys", "lanes", "read", "reads", "run")

    def __init__(self, client: aioredis.Redis, keys: QueueKeys) -> None:
        self.reads = reads = QueueReads(client, keys)
        self.client, self.keys, self.lanes, self.base = client, keys, reads.lanes, reads.base
        # the plumbing every script method uses: the reads' own bound methods, no hop
        self.run = reads.run
        self.read = reads.read

    # ------------------------------------------------------------------ the reads it holds
    job_record = held("reads", QueueReads.job_record)
    job_age_ms = held("reads", QueueReads.job_age_ms)
    workers = held("reads", QueueReads.workers)
    set_progress = held("reads", QueueReads.set_progress)
    step = held("reads", QueueReads.step)
    change = held("reads", QueueReads.change)
    job_log = held("reads", QueueReads.job_log)
    wait = held("reads", QueueReads.wait)
    signal = held("reads", QueueReads.signal)
    append_log = held("reads", QueueReads.append_log)
    stats = held("reads", QueueReads.stats)
    lane_counts = held("reads", QueueReads.lane_counts)
    group_counts = held("reads", QueueReads.group_counts)
    zpage = held("reads", QueueReads.zpage)
    ready_page = held("reads", QueueReads.ready_page)
    lrange = held("reads", QueueReads.lrange)
    job_fields = held("reads", QueueReads.job_fields)
    why = held("reads", QueueReads.why)
    server_ms = held("reads", QueueReads.server_ms)
    throughput = held("reads", QueueReads.throughput)
    trend_buckets = held("reads", QueueReads.trend_buckets)
    finished_counts = held("reads", QueueReads.finished_counts)
    backlog = held("reads", QueueReads.backlog)
    group_settings = held("reads", QueueReads.group_settings)
    queue_settings = held("reads", QueueReads.queue_settings)
    lane_sizes = held("reads", QueueReads.lane_sizes)
    wake = held("reads", QueueReads.wake)
    wait_for_wake = held("reads", QueueReads.wait_for_wake)
    wait_for_handoff = held("reads", QueueReads.wait_for_handoff)
    batch_fields = held("reads", QueueReads.batch_fields)
    batch_members = held("reads", QueueReads.batch_members)
    batch_outcomes = held("reads", QueueReads.batch_outcomes)
    outbox = held("reads", QueueReads.outbox)
    outbox_set_aside = held("reads", QueueReads.outbox_set_aside)
    schedule_tick = held("reads", QueueReads.schedule_tick)
    schedule_put = held("reads", QueueReads.schedule_put)
    schedule_remove = held("reads", QueueReads.schedule_remove)
    schedule_set_aside = held("reads", QueueReads.schedule_set_aside)
    schedule_ticks_aside = held("reads", QueueReads.schedule_ticks_aside)
    schedule_contain = held("reads", QueueReads.schedule_contain)
    schedule_ticks = held("reads", QueueReads.schedule_ticks)
    schedule_defs = held("reads", QueueReads.schedule_defs)
    outbox_remove = held("reads", QueueReads.outbox_remove)

    # ------------------------------------------------------------------ enqueue
    def enqueue_calls(self, jobs: Sequence[JobRecord], chunk: int = 500) -> list[ScriptCall]:
        """The enqueue.lua calls that store ``jobs`` (``chunk`` a call), for a pipeline."""
        return enqueue_calls(self.lanes, self.base, jobs, chunk)

    async def enqueue(self, jobs: Sequence[JobRecord], chunk: int = 500) -> None:
        """Store jobs; runs of jobs with the same template go as id/payload pairs. Each
        call is refused whole when the queue is full (``with_room``: waits as set)."""
        calls = self.enqueue_calls(jobs, chunk)
        await with_room(lambda: self._enqueue_calls(calls))

    async def enqueue_run(self, template: Template, pairs: list[Any], chunk: int = 500) -> None:
        """Store jobs that share one template: ``pairs`` is id, payload, id, payload, ..."""
        calls = enqueue_run_calls(self.lanes, self.base, template, pairs, chunk)
        await with_room(lambda: self._enqueue_calls(calls))

    async def enqueue_codes(self, jobs: Sequence[JobRecord]) -> list[Any]:
        """Store jobs in one call (at most 500): enqueue.lua's code per job, in order; over
        the App's held connection when it is free (``_hot``), else through the pool."""
        return await with_room(lambda: self._enqueue_codes(jobs))

    async def _enqueue_codes(self, jobs: Sequence[JobRecord]) -> list[Any]:
        args = enqueue_args(self.base, jobs)
        if durability_of(self.client) is not None:  # durability mode: WAIT in the same trip
            return list((await self._run_durable("enqueue", args))[1:])
        hot = hot_connection(self.client)
        if hot is None or hot.busy:
            return list((await self.run("enqueue", args))[1:])
        command = evalsha_command(self.client, SCRIPTS["enqueue"], self.lanes, args)
        try:
            res = await hot.call(command, call_timeout(self.client))
        except (TimeoutError, rexc.TimeoutError) as exc:  # slow: as the pool's path would say
            raise ServerUnavailable(f"Redis connection failed: {exc!r}") from exc
        except (rexc.RedisError, OSError) as exc:
            if isinstance(full := wrap_redis_error(exc), QueueFull):  # an answer: no resend
                raise full from exc
            # lost, or not run (the library or script missing, an error reply): the pool's
            # path sends it again, with its retries and reloading (enqueue is idempotent on
            # the job id: a call that did run stores nothing twice)
            return list((await self.run("enqueue", args))[1:])
        return list(res[1:])

    async def enqueue_unique(self, jobs: Sequence[JobRecord]) -> list[str | None]:
        """Store unique jobs in order (each job after the ones before it, so a conflict
        between two of them names the first): per job None when stored (or its id existed),
        else the id of the job that holds its lock."""
        out: list[str | None] = []
        for i in range(0, len(jobs), 500):
            args = enqueue_args(self.base, jobs[i : i + 500])
            res = await with_room(lambda: self._run_durable("enqueue", args))  # noqa: B023
            out += [text_of(c) if isinstance(c, bytes) else None for c in res[1:]]
        return out

    async def replace(
        self,
        key: str,
        holder: str,
        job: JobRecord,
        debounce: tuple[int, int] | None,
        ttl_ms: int,
    ) -> ReplaceOutcome:
        """Give the job ``holder``, which holds the unique lock ``key``, the payload and
        options of ``job`` (made for the holder's id) while it waits; ``debounce`` (delay
        ms, at ms; -1 none) also moves its due time and restarts the lock's TTL."""
        delay_ms, at_ms = debounce or (-1, -1)
        t = job.template
        args = (self.base, key, holder, job.payload, t.options, delay_ms, at_ms, ttl_ms)
        return _REPLACE[int(await self.run("replace", args))]

    async def _run_durable(self, name: str, args: Sequence[Any], strict: bool = True) -> Any:
        """``run`` with, in durability mode, WAIT in the same round trip."""
        durability = durability_of(self.client)
        if durability is None:
            return await self.run(name, args)
        call = (SCRIPTS[name], self.lanes, args)
        return (await durable_calls(self.client, durability, [call], strict))[0]

    async def _enqueue_calls(self, calls: Sequence[ScriptCall]) -> None:
        durability = durability_of(self.client)
        if durability is not None:  # durability mode: WAIT in the same round trip
            await durable_calls(self.client, durability, calls, strict=True)
        elif len(calls) == 1:
            await evalsha(self.client, *calls[0])
        elif calls:
            await evalsha_many(self.client, calls)

    # ------------------------------------------------------------------ leases
    async def claim(
        self,
        n: int,
        lease_ms: int,
        dead_ttl_ms: int,
        worker_id: str = "",
        park_ms: int = 0,
        started: Started = None,
        line: OrderedLine | None = None,
    ) -> ClaimResult:
        """Lease up to ``n`` jobs; a worker (``worker_id``) also takes back what was handed to
        it while parked, and parks for ``park_ms`` when it got fewer than ``n``. ``started``:
        a registered worker's report (leases started or given up, free slots; see beat).
        ``line``: sent over it, in order with the other claims sent there."""
        s, free = started or ("", "")
        args = (self.base, n, lease_ms, dead_ttl_ms, worker_id, park_ms, _nonce(n), s, free)
        return parse_claim(await self._run_on(line, "claim", args))

    async def complete_claim(
        self,
        items: Sequence[tuple[str, str, bytes, int]],
        n: int,
        lease_ms: int,
        dead_ttl_ms: int,
        worker_id: str = "",
        park_ms: int = 0,
        started: Started = None,
        line: OrderedLine | None = None,
    ) -> tuple[ClaimResult, list[Outcome]]:
        """Complete ``items`` and lease up to ``n`` jobs in one round trip (see ``claim``)."""
        s, free = started or ("", "")
        args: list[Any] = [self.base, n, lease_ms, dead_ttl_ms, worker_id, park_ms, _nonce(n)]
        args += (s, free, len(items))
        for item in items:
            args.extend(item)
        # a worker's completions: a missing acknowledgement is logged, not raised (raising
        # would lose the jobs this claim leased until their leases ran out)
        if items and durability_of(self.client) is not None:
            res = await self._run_durable("complete_claim", args, strict=False)
        else:
            res = await self._run_on(line, "complete_claim", args)
        m = len(items)
        if not m:
            return parse_claim(res), []
        return parse_claim(res[:-m]), [_COMPLETE[c] for c in res[-m:]]

    async def _run_on(self, line: OrderedLine | None, name: str, args: Sequence[Any]) -> Any:
        """``run`` over ``line`` when given: in order with the calls sent there before it. A
        call the server refused (a library or script missing: it did not run) goes again
        through the pool, with its reloading; a call lost on the way is not sent again (a
        claim's leases come back when they run out)."""
        if line is None:
            return await self.run(name, args)
        command = evalsha_command(self.client, SCRIPTS[name], self.lanes, args)
        try:
            return await line.call(command, call_timeout(self.client))
        except rexc.ResponseError:
            return await self.run(name, args)
        except (TimeoutError, rexc.RedisError, OSError) as exc:
            raise ServerUnavailable(f"Redis connection failed: {exc!r}") from exc

    async def complete(self, items: Sequence[tuple[str, str, bytes, int]]) -> list[Outcome]:
        """Finish jobs (id, token, result, result_ttl_ms each): OK, FORWARD, NO_JOB, STALE."""
        args: list[Any] = [self.base, len(items)]
        for item in items:
            args.extend(item)
        return [_COMPLETE[c] for c in await self._run_durable("complete", args)]

    async def fail(
        self,
        job_id: str,
        token: str,
        error: bytes,
        mode: FailMode,
        dead_ttl_ms: int,
        delay_ms: int = 0,
    ) -> Outcome:
        """Record a failed attempt: RETRY (scheduled), DEAD, CANCELLED, NO_JOB or STALE."""
        delay = _FAIL_SIGNAL.get(mode, max(delay_ms, 0))
        args = (self.base, job_id, token, error, delay, dead_ttl_ms)
        return _FAIL[int(await self.run("fail", args))]

    async def release(
        self,
        pairs: Sequence[tuple[str, str]],
        delay_ms: int = 0,
        refund: bool = False,
        dead_ttl_ms: int = 0,
        backoff: bool = False,
    ) -> list[Outcome]:
        """Give leased jobs back (release.lua); ``backoff``: refunded, and their rate limits
        back off (they raised ``RateLimited``)."""
        mode = 2 if backoff else 1 if refund else 0
        args: list[Any] = [self.base, delay_ms, mode, dead_ttl_ms, len(pairs)]
        for job_id, token in pairs:
            args += (job_id, token)
        return [_RELEASE[c] for c in await self.run("release", args)]

    async def extend(self, pairs: Sequence[tuple[str, str]], lease_ms: int) -> list[Outcome]:
        """Renew leases: OK, CANCEL_REQUESTED (renewed, but stop it), NO_JOB or STALE."""
        args: list[Any] = [self.base, lease_ms, len(pairs)]
        for job_id, token in pairs:
            args += (job_id, token)
        res = await self.run("extend", args)
        return [_EXTEND[c] for c in res[1:]]

    async def beat(
        self,
        worker_id: str,
        period_ms: int,
        lease_ms: int,
        started: int,
        info: Sequence[object],
        pairs: Sequence[tuple[str, str]],
        dead_ttl_ms: int,
        sample: tuple[int, int] | None = None,
    ) -> list[Outcome]:
        """A worker's heartbeat (see beat.lua): register it until ``period_ms`` from now (0:
        leave the registry) with ``info`` (host, pid, version, queues, concurrency, start ms,
        done, failed, signs), renew the leases ``pairs``, as ``extend``, bury a dead worker
        (the jobs it dead-letters kept ``dead_ttl_ms``) and store ``sample``, the queue's
        (backlog, wait ms), in its trends."""
        args: list[Any] = [self.base, worker_id, period_ms, lease_ms, started, *info]
        args += (dead_ttl_ms, len(pairs))
        for job_id, token in pairs:
            args += (job_id, token)
        if sample is not None:
            args += sample
        res = await self.run("beat", args)
        return [_EXTEND[c] for c in res[1:]]

    async def cancel(self, ids: Sequence[str], dead_ttl_ms: int) -> tuple[int, int]:
        """Cancel jobs (see cancel.lua); returns (cancelled now, running ones asked to stop)."""
        res = await self.run("cancel", (self.base, dead_ttl_ms, *ids))
        return int(res[0]), int(res[1])

    async def configure(self, op: str, group: str = "", v1: object = "", v2: object = "") -> None:
        """Change a queue or group setting (see configure.lua)."""
        await self.run("configure", (self.base, op, group, v1, v2))

    async def watch(
        self, job_id: str, register: bool, kind: str = "job"
    ) -> tuple[str, bytes, bytes]:
        return parse_watch(await self.run("watch", (self.base, job_id, 1 if register else 0, kind)))

    async def reap(self, limit: int, dead_ttl_ms: int, lock_ms: int = 0) -> tuple[int, int, int]:
        """Maintenance; returns (recovered, promoted, dead_trimmed), all -1 when another
        process did it in this lock period."""
        keys = [*self.lanes, self.keys.reap_lock]
        res = await self.run("reap", (self.base, limit, dead_ttl_ms, lock_ms), keys)
        return int(res[1]), int(res[2]), int(res[3])

    # ------------------------------------------------------------------ admin (an operator's)
    async def requeue(self, ids: Sequence[str]) -> tuple[int, int]:
        """Dead letters back to the queue, attempts reset (requeue.lua): (requeued, skipped)."""
        res = await self.run("requeue", (self.base, *ids))
        return int(res[0]), int(res[1])

    async def promote(self, ids: Sequence[str]) -> tuple[int, int]:
        """Scheduled jobs runnable now (promote.lua): (promoted, skipped)."""
        res = await self.run("promote", (self.base, *ids))
        return int(res[0]), int(res[1])

    async def purge_ids(self, ids: Sequence[str], states: Sequence[str]) -> tuple[int, int]:
        """Delete these jobs where their state is one of ``states`` (purge.lua):
        (purged, skipped)."""
        res = await self.run("purge", (self.base, "ids", " ".join(states), 0, *ids))
        return int(res[0]), int(res[1])

    async def purge_head(self, source: str, n: int, group: str = "") -> tuple[int, int]:
        """Delete the first ``n`` jobs of a structure: ``ready``, ``prio``, ``scheduled``,
        ``dead``, ``completed``, ``cancelled`` or ``lane`` (of ``group``) (purge.lua):
        (purged, skipped)."""
        res = await self.run("purge", (self.base, source, group, n))
        return int(res[0]), int(res[1])

    # ------------------------------------------------------------------ batches (batch.lua)
    def batch_open_call(
        self,
        batch_id: str,
        policy: str,
        retention_ms: int,
        group: str,
        concurrency: int | None,
        priority: int | None,
        callback: JobRecord | None,
    ) -> ScriptCall:
        """Open a batch homed on this queue, with its callback job (for a pipeline); a
        callback whose template names a batch is also a sub-job of that one (a chain)."""
        args: list[Any] = [
            self.base,
            "open",
            batch_id,
            policy,
            retention_ms,
            group,
            "" if concurrency is None else concurrency,
            "" if priority is None else priority,
            0,
        ]
        if callback is not None:
            t = callback.template
            args += (callback.id, t.task, callback.payload, t.max_attempts, t.priority, t.group)
            # a chain's step: the batch of the next link, which counts it as its sub-job
            args += (t.options, t.batch, t.batch_queue)
        return (SCRIPTS["batch"], self.lanes, args)

    def batch_add_call(self, batch_id: str, members: Sequence[str]) -> ScriptCall:
        """Count sub-jobs on other queues (``<their key base><id>``) into a batch."""
        return (SCRIPTS["batch"], self.lanes, [self.base, "add", batch_id, *members])

    def batch_seal_call(self, batch_id: str) -> ScriptCall:
        return (SCRIPTS["batch"], self.lanes, [self.base, "seal", batch_id])

    def batch_apply_call(self, outcomes: Sequence[bytes]) -> ScriptCall:
        """Apply outcomes handed over from other queues' outboxes (4 values each)."""
        return (SCRIPTS["batch"], self.lanes, [self.base, "apply", "", *outcomes])

    async def batch_seal(self, batch_id: str) -> bool:
        """Seal a batch; False when there is no such batch."""
        return int(await evalsha(self.client, *self.batch_seal_call(batch_id))) >= 0

    async def batch_cancel(self, batch_id: str) -> int | None:
        """Cancel a batch: how many of its sub-jobs on this queue were cancelled, None when
        there is no such batch."""
        n = int(await self.run("batch", (self.base, "cancel", batch_id)))
        return None if n < 0 else n

    async def run_many(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Run script calls (of any queues) in one round trip."""
        return await evalsha_many(self.client, calls)
