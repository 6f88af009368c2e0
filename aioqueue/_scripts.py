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

import asyncio
import contextlib
import enum
import hashlib
import json
import secrets
import time
from collections.abc import Awaitable, Sequence
from importlib import resources
from typing import Any, Final, TypeVar, cast

import redis.asyncio as aioredis
import redis.exceptions as rexc

from ._exceptions import JobNotFound, LeaseLost, ServerRefused, ServerUnavailable
from ._keys import QueueKeys
from ._limits import CLAIMED_JOB_VALUES, MAX_JOBS_PER_CALL
from ._record import (
    Claimed,
    ClaimResult,
    JobRecord,
    Template,
    enqueue_args,
    parse_claim,
    parse_claimed,
    runs_args,
)
from ._wire import call_timeout, evalsha_command

T = TypeVar("T")


class Outcome(enum.Enum):
    """What a fenced script did to one job (its per-job return code, by name)."""

    OK = "ok"
    #: complete: done, and its outcome waits in the outbox for a batch on another queue
    FORWARD = "forward"
    #: fail: a retry was scheduled
    RETRY = "retry"
    #: fail: dead-lettered
    DEAD = "dead"
    #: fail: recorded as cancelled
    CANCELLED = "cancelled"
    #: extend: renewed, but cancellation was requested: stop the job, record it cancelled
    CANCEL_REQUESTED = "cancel_requested"
    NO_JOB = "no_job"
    #: the lease token does not match: the lease ran out and the job moved on
    STALE = "stale"

    def check(self, job_id: str) -> None:
        """Raise for the codes that mean the caller no longer holds the job."""
        if self is Outcome.NO_JOB:
            raise JobNotFound(job_id)
        if self is Outcome.STALE:
            raise LeaseLost(job_id)

    @property
    def lost(self) -> bool:
        """The caller no longer holds the job (no record, or another lease)."""
        return self is Outcome.NO_JOB or self is Outcome.STALE


#: a worker's report in a claim: (leases it started or gave up, free slots), None for none
Started = tuple[int, int] | None


def _nonce() -> str:
    """The random part of the lease tokens of one claim (so no token can be guessed)."""
    return secrets.token_hex(8)


def text_of(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


# the one table per script: Lua's return code -> Outcome (see each .lua header)
_FENCED = {-1: Outcome.NO_JOB, -2: Outcome.STALE}
_COMPLETE: Final = {1: Outcome.OK, 2: Outcome.FORWARD, **_FENCED}
_FAIL: Final = {1: Outcome.RETRY, 2: Outcome.DEAD, 3: Outcome.CANCELLED, **_FENCED}
_EXTEND: Final = {1: Outcome.OK, -3: Outcome.CANCEL_REQUESTED, **_FENCED}
_RELEASE: Final = {1: Outcome.OK, **_FENCED}


class TickOutcome(enum.Enum):
    """What ``schedule.lua`` did with one tick of a periodic schedule."""

    #: the tick's job was enqueued and the stored tick moved on
    FIRED = "fired"
    #: the stored tick moved on without a new job (missed ticks skipped, or its job existed)
    ADVANCED = "advanced"
    #: the tick is not due yet by the server's clock
    NOT_DUE = "not_due"
    NO_SCHEDULE = "no_schedule"
    #: the stored tick is another one: another scheduler fired this tick
    STALE = "stale"


_TICK: Final = {
    1: TickOutcome.FIRED,
    2: TickOutcome.ADVANCED,
    0: TickOutcome.NOT_DUE,
    -1: TickOutcome.NO_SCHEDULE,
    -2: TickOutcome.STALE,
}


class FailMode(enum.Enum):
    """What ``fail`` does with a failed attempt."""

    #: run again after the delay while attempts are left, else dead-letter
    RETRY = "retry"
    #: dead-letter now
    DEAD = "dead"
    #: record the job as cancelled (its cancellation was requested)
    CANCELLED = "cancelled"


# fail.lua's ARGV[5] (retry delay ms) carries the two other modes as -1 and -2
_FAIL_SIGNAL: Final = {FailMode.DEAD: -1, FailMode.CANCELLED: -2}


#: The Lua library, lua/lib/<part>.lua, in the order its parts are prepended to a script; each
#: part uses only parts before it (its header says which).
LIB: Final = (
    "core",
    "lanes",
    "batches",
    "deadletter",
    "history",
    "acks",
    "maintenance",
    "parking",
    "workers",
    "leasing",
    "handoff",
)


def _lua(path: str) -> str:
    return resources.files("aioqueue").joinpath(f"lua/{path}.lua").read_text("utf-8")


_LIB: Final = {part: _lua(f"lib/{part}") for part in LIB}


class Script:
    """One Lua script: its source (the library parts it needs, in ``LIB`` order, then its own
    file) and its SHA1."""

    __slots__ = ("name", "parts", "sha", "source")

    def __init__(self, name: str, parts: str) -> None:
        needs = parts.split()
        if unknown := set(needs) - set(LIB):
            raise ValueError(f"{name}: no library parts {sorted(unknown)}")
        self.name = name
        self.parts = tuple(part for part in LIB if part in needs)
        self.source = "\n".join([*(_LIB[part] for part in self.parts), _lua(name)])
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()


#: every script, with the library parts it needs: only those, as each part prepended costs
#: every call of the script the definition of that part's functions (tests/test_scripts.py
#: checks that these are exactly the parts each script uses)
SCRIPTS: Final = {
    name: Script(name, parts)
    for name, parts in (
        (
            "enqueue",
            "core lanes batches deadletter history maintenance parking workers leasing handoff",
        ),
        ("claim", "core lanes batches deadletter history maintenance parking workers leasing"),
        ("complete", "core lanes batches acks"),
        (
            "complete_claim",
            "core lanes batches deadletter history acks maintenance parking workers leasing",
        ),
        ("fail", "core lanes batches deadletter history acks"),
        ("release", "core lanes batches deadletter history acks"),
        ("extend", "core"),
        ("watch", "core"),
        ("reap", "core lanes batches deadletter history maintenance parking workers"),
        ("beat", "core"),
        ("configure", "core lanes"),
        ("batch", "core lanes batches"),
        ("cancel", "core lanes batches"),
        ("schedule", "core lanes"),
        ("schedules", ""),
        ("requeue", "core lanes"),
        ("promote", "core lanes"),
        ("purge", "core lanes batches"),
        ("page", ""),
        ("peek", "core"),
    )
}


#: one script call of a pipeline: the script, its KEYS, its ARGV (ARGV[1]: the key base)
ScriptCall = tuple[Script, Sequence[str], Sequence[Any]]


def wrap_redis_error(exc: Exception) -> Exception:
    """Translate redis-py errors at the boundary: a lost connection is ``ServerUnavailable``,
    an error reply ``ServerRefused``; other errors pass through."""
    if isinstance(exc, rexc.ConnectionError | rexc.TimeoutError | OSError):
        return ServerUnavailable(f"Redis connection failed: {exc}")
    if isinstance(exc, rexc.ResponseError):
        return ServerRefused(f"Redis refused the call: {exc}")
    return exc


def enqueue_calls(
    lanes: Sequence[str], base: str, jobs: Sequence[JobRecord], chunk: int = 500
) -> list[ScriptCall]:
    """The enqueue.lua calls that store ``jobs`` (``chunk`` a call), for a pipeline."""
    return [
        (SCRIPTS["enqueue"], lanes, enqueue_args(base, jobs[i : i + chunk]))
        for i in range(0, len(jobs), chunk)
    ]


def enqueue_run_calls(
    lanes: Sequence[str], base: str, template: Template, pairs: list[Any], chunk: int = 500
) -> list[ScriptCall]:
    """The enqueue.lua calls that store jobs sharing one template (``pairs``: id, payload,
    id, payload, ...), ``chunk`` jobs a call."""
    step = 2 * chunk
    values = template.values()
    return [
        (SCRIPTS["enqueue"], lanes, runs_args(base, [(values, pairs[i : i + step])]))
        for i in range(0, len(pairs), step)
    ]


def pipeline_failures(results: list[Any]) -> list[int]:
    """The calls of a pipeline (run with ``raise_on_error=False``) that met NOSCRIPT and must
    run again once their script is loaded; any other error is raised (wrapped)."""
    again = []
    for i, res in enumerate(results):
        if isinstance(res, rexc.NoScriptError):
            again.append(i)
        elif isinstance(res, Exception):
            wrapped = wrap_redis_error(res)
            if wrapped is res:
                raise res
            raise wrapped from res
    return again


def read_lane_counts(pipe: Any, k: QueueKeys) -> None:
    """Queue on a pipeline (async or blocking) the sizes of ready, prio, scheduled, active
    and dead."""
    pipe.llen(k.ready)
    for key in (k.prio, k.scheduled, k.active, k.dead):
        pipe.zcard(key)


def read_group_names(pipe: Any, k: QueueKeys) -> None:
    """Queue on a pipeline what ``group_names`` needs."""
    # a group with queued jobs is in the ring, or parked: by its limit (it has active
    # jobs), by its rate (gwait) or paused (gconf)
    pipe.zrange(k.ring, 0, -1)
    pipe.hkeys(k.gactive)
    pipe.zrange(k.gwait, 0, -1)
    pipe.hkeys(k.gconf)


def group_names(replies: Sequence[list[bytes]]) -> list[str]:
    """The groups that may have queued jobs, from the replies of ``read_group_names``."""
    ring, gactive, gwait, gconf = replies
    # (a group name that is not UTF-8 is garbage: it counts nothing rather than fail)
    names = {x.decode(errors="replace") for x in (*ring, *gactive, *gwait)}
    names |= {f.decode(errors="replace")[7:] for f in gconf if f.startswith(b"paused:")}
    names.discard("")
    return sorted(names)


def parse_watch(res: Any) -> tuple[str, bytes, bytes]:
    """watch.lua's reply: (state, or "" for no job; result; error)."""
    return res[0].decode(errors="replace"), res[1], res[2]  # a garbled state: CorruptRecord


async def bounded(client: aioredis.Redis, call: Awaitable[T], blocking: float | None = None) -> T:
    """Await one call to Redis within the App's socket timeout, with connection errors wrapped
    in aioqueue's. A blocking command that waits up to ``blocking`` seconds gets that long
    plus half the socket timeout (its waits are kept below it)."""
    limit = call_timeout(client)
    if limit is not None and blocking is not None:
        limit = blocking + limit / 2
    try:
        async with asyncio.timeout(limit):
            return await call
    except (rexc.ConnectionError, rexc.TimeoutError, rexc.ResponseError, OSError) as exc:
        # OSError covers TimeoutError: the call outlived the App's socket_timeout
        raise wrap_redis_error(exc) from exc


async def evalsha(
    client: aioredis.Redis, script: Script, keys: Sequence[str], args: Sequence[Any]
) -> Any:
    """Run a script with EVALSHA, loading it first if the server does not know it.
    ``args[0]`` is always the queue's key base (every script's ARGV[1])."""
    return await bounded(client, _evalsha(client, script, keys, args))


async def _evalsha(
    client: aioredis.Redis, script: Script, keys: Sequence[str], args: Sequence[Any]
) -> Any:
    command = evalsha_command(client, script.sha, keys, args)
    try:
        return await client.execute_command(*command)  # type: ignore[no-untyped-call]
    except rexc.NoScriptError:
        await client.execute_command("SCRIPT", "LOAD", script.source)  # type: ignore[no-untyped-call]
        return await client.execute_command(*command)  # type: ignore[no-untyped-call]


async def load_scripts(client: aioredis.Redis) -> None:
    """SCRIPT LOAD every script, in one round trip."""
    pipe = client.pipeline(transaction=False)
    for script in SCRIPTS.values():
        pipe.execute_command("SCRIPT", "LOAD", script.source)
    await pipe.execute()


async def check_script_access(client: aioredis.Redis, key: str) -> None:
    """Fail now, with the server's NOPERM error, if this connection's ACL user may not run
    scripts on keys like ``key``: an EVALSHA of a SHA no script has answers NOSCRIPT when it
    is allowed, and runs nothing."""
    with contextlib.suppress(rexc.NoScriptError):
        await client.execute_command("EVALSHA", "0" * 40, 1, key)  # type: ignore[no-untyped-call]


async def evalsha_many(client: aioredis.Redis, calls: Sequence[ScriptCall]) -> list[Any]:
    """Run many script calls in one round trip (a non-transactional pipeline). Calls that met
    NOSCRIPT did not run, so they are run again, alone, once their script is loaded."""
    pipe = client.pipeline(transaction=False)
    for script, keys, args in calls:
        pipe.execute_command(*evalsha_command(client, script.sha, keys, args))
    results: list[Any] = await bounded(client, pipe.execute(raise_on_error=False))
    for i in pipeline_failures(results):
        results[i] = await evalsha(client, *calls[i])
    return results


async def schedule_queues(client: aioredis.Redis, prefix: str) -> list[str]:
    """The queues that have schedules stored under ``prefix`` (a SCAN of the key space: for
    listings, not for hot paths)."""
    pattern = f"{prefix}:{{*}}:cron:defs"
    found: set[str] = set()
    cursor: int = 0
    while True:
        cursor, keys = await bounded(client, client.scan(cursor, match=pattern, count=1000))
        for key in cast(list[bytes], keys):
            name = key.decode(errors="replace")[len(prefix) + 2 :]
            found.add(name.rsplit("}:cron:defs", 1)[0])
        if not cursor:
            return sorted(found)


async def queue_names(client: aioredis.Redis, prefix: str, limit: int = 1000) -> list[str]:
    """The queues under ``prefix`` that have counters (every queue that was ever used), found
    with SCAN: O(keys in the database), for an operator's ``info`` without ``-q``."""
    head = f"{prefix}:{{"
    names: set[str] = set()

    async def scan() -> None:
        async for key in client.scan_iter(match=f"{prefix}:{{*}}:stats", count=1000):
            raw = key.decode(errors="replace") if isinstance(key, bytes) else str(key)
            if raw.startswith(head) and raw.endswith("}:stats"):
                names.add(raw[len(head) : -len("}:stats")])
                if len(names) >= limit:
                    return

    await bounded(client, scan())
    return sorted(names)


class QueueScripts:
    """The door to one queue's keys on one client: a typed method per script (and per batch
    operation) and every read, each bounded by the socket timeout."""

    __slots__ = ("base", "client", "keys", "lanes")

    def __init__(self, client: aioredis.Redis, keys: QueueKeys) -> None:
        self.client = client
        self.keys = keys
        self.lanes = tuple(keys.lanes())
        self.base = keys.base

    async def _run(self, name: str, args: Sequence[Any], keys: Sequence[str] = ()) -> Any:
        return await evalsha(self.client, SCRIPTS[name], keys or self.lanes, args)

    # ------------------------------------------------------------------ enqueue
    def enqueue_calls(self, jobs: Sequence[JobRecord], chunk: int = 500) -> list[ScriptCall]:
        """The enqueue.lua calls that store ``jobs`` (``chunk`` a call), for a pipeline."""
        return enqueue_calls(self.lanes, self.base, jobs, chunk)

    async def enqueue(self, jobs: Sequence[JobRecord], chunk: int = 500) -> None:
        """Store jobs; runs of jobs with the same template go as id/payload pairs."""
        await self._enqueue_calls(self.enqueue_calls(jobs, chunk))

    async def enqueue_run(self, template: Template, pairs: list[Any], chunk: int = 500) -> None:
        """Store jobs that share one template: ``pairs`` is id, payload, id, payload, ..."""
        await self._enqueue_calls(enqueue_run_calls(self.lanes, self.base, template, pairs, chunk))

    async def _enqueue_calls(self, calls: Sequence[ScriptCall]) -> None:
        if len(calls) == 1:
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
    ) -> ClaimResult:
        """Lease up to ``n`` jobs; a worker (``worker_id``) also takes back what was handed to
        it while parked, and parks for ``park_ms`` when it got fewer than ``n``. ``started``:
        a registered worker's report (leases started or given up, free slots; see beat)."""
        s, free = started or ("", "")
        args = (self.base, n, lease_ms, dead_ttl_ms, worker_id, park_ms, _nonce(), s, free)
        return parse_claim(await self._run("claim", args))

    async def complete_claim(
        self,
        items: Sequence[tuple[str, str, bytes, int]],
        n: int,
        lease_ms: int,
        dead_ttl_ms: int,
        worker_id: str = "",
        park_ms: int = 0,
        started: Started = None,
    ) -> tuple[ClaimResult, list[Outcome]]:
        """Complete ``items`` and lease up to ``n`` jobs in one round trip (see ``claim``)."""
        s, free = started or ("", "")
        args: list[Any] = [self.base, n, lease_ms, dead_ttl_ms, worker_id, park_ms, _nonce()]
        args += (s, free, len(items))
        for item in items:
            args.extend(item)
        res = await self._run("complete_claim", args)
        m = len(items)
        if not m:
            return parse_claim(res), []
        return parse_claim(res[:-m]), [_COMPLETE[c] for c in res[-m:]]

    async def complete(self, items: Sequence[tuple[str, str, bytes, int]]) -> list[Outcome]:
        """Finish jobs (id, token, result, result_ttl_ms each): OK, FORWARD, NO_JOB, STALE."""
        args: list[Any] = [self.base, len(items)]
        for item in items:
            args.extend(item)
        return [_COMPLETE[c] for c in await self._run("complete", args)]

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
        return _FAIL[int(await self._run("fail", args))]

    async def release(
        self,
        pairs: Sequence[tuple[str, str]],
        delay_ms: int = 0,
        refund: bool = False,
        dead_ttl_ms: int = 0,
    ) -> list[Outcome]:
        args: list[Any] = [self.base, delay_ms, 1 if refund else 0, dead_ttl_ms, len(pairs)]
        for job_id, token in pairs:
            args += (job_id, token)
        return [_RELEASE[c] for c in await self._run("release", args)]

    async def extend(self, pairs: Sequence[tuple[str, str]], lease_ms: int) -> list[Outcome]:
        """Renew leases: OK, CANCEL_REQUESTED (renewed, but stop it), NO_JOB or STALE."""
        args: list[Any] = [self.base, lease_ms, len(pairs)]
        for job_id, token in pairs:
            args += (job_id, token)
        res = await self._run("extend", args)
        return [_EXTEND[c] for c in res[1:]]

    async def beat(
        self,
        worker_id: str,
        period_ms: int,
        lease_ms: int,
        started: int,
        info: Sequence[object],
        pairs: Sequence[tuple[str, str]],
    ) -> list[Outcome]:
        """A worker's heartbeat (see beat.lua): register it until ``period_ms`` from now (0:
        leave the registry) with ``info`` (host, pid, version, queues, concurrency, start ms,
        done, failed) and renew the leases ``pairs``, as ``extend``."""
        args: list[Any] = [self.base, worker_id, period_ms, lease_ms, started, *info, len(pairs)]
        for job_id, token in pairs:
            args += (job_id, token)
        res = await self._run("beat", args)
        return [_EXTEND[c] for c in res[1:]]

    async def cancel(self, ids: Sequence[str], dead_ttl_ms: int) -> tuple[int, int]:
        """Cancel jobs (see cancel.lua); returns (cancelled now, running ones asked to stop)."""
        res = await self._run("cancel", (self.base, dead_ttl_ms, *ids))
        return int(res[0]), int(res[1])

    async def configure(self, op: str, group: str = "", v1: object = "", v2: object = "") -> None:
        """Change a queue or group setting (see configure.lua)."""
        await self._run("configure", (self.base, op, group, v1, v2))

    async def watch(
        self, job_id: str, register: bool, kind: str = "job"
    ) -> tuple[str, bytes, bytes]:
        return parse_watch(
            await self._run("watch", (self.base, job_id, 1 if register else 0, kind))
        )

    async def reap(self, limit: int, dead_ttl_ms: int, lock_ms: int = 0) -> tuple[int, int, int]:
        """Maintenance; returns (recovered, promoted, dead_trimmed), all -1 when another
        process did it in this lock period."""
        keys = [*self.lanes, self.keys.reap_lock]
        res = await self._run("reap", (self.base, limit, dead_ttl_ms, lock_ms), keys)
        return int(res[1]), int(res[2]), int(res[3])

    # ------------------------------------------------------------------ admin (an operator's)
    async def requeue(self, ids: Sequence[str]) -> tuple[int, int]:
        """Dead letters back to the queue, attempts reset (requeue.lua): (requeued, skipped)."""
        res = await self._run("requeue", (self.base, *ids))
        return int(res[0]), int(res[1])

    async def promote(self, ids: Sequence[str]) -> tuple[int, int]:
        """Scheduled jobs runnable now (promote.lua): (promoted, skipped)."""
        res = await self._run("promote", (self.base, *ids))
        return int(res[0]), int(res[1])

    async def purge_ids(self, ids: Sequence[str], states: Sequence[str]) -> tuple[int, int]:
        """Delete these jobs where their state is one of ``states`` (purge.lua):
        (purged, skipped)."""
        res = await self._run("purge", (self.base, "ids", " ".join(states), 0, *ids))
        return int(res[0]), int(res[1])

    async def purge_head(self, source: str, n: int, group: str = "") -> tuple[int, int]:
        """Delete the first ``n`` jobs of a structure: ``ready``, ``prio``, ``scheduled``,
        ``dead``, ``completed``, ``cancelled`` or ``lane`` (of ``group``) (purge.lua):
        (purged, skipped)."""
        res = await self._run("purge", (self.base, source, group, n))
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
        n = int(await self._run("batch", (self.base, "cancel", batch_id)))
        return None if n < 0 else n

    async def run_many(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Run script calls (of any queues) in one round trip."""
        return await evalsha_many(self.client, calls)

    # ------------------------------------------------------------------ reads
    async def read(self, call: Awaitable[T]) -> T:
        """Await a plain command (or pipeline) on this client, bounded and wrapped."""
        return await bounded(self.client, call)

    async def job_record(self, job_id: str) -> dict[bytes, bytes]:
        return cast(dict[bytes, bytes], await self.read(self.client.hgetall(self.keys.job(job_id))))

    async def job_age_ms(self, job_id: str) -> int | None:
        """How long ago a job was created, by the server's clock (None: no such job, or no
        readable creation time)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(self.keys.job(job_id), "ct")
        pipe.time()
        ct, (sec, usec) = await self.read(pipe.execute())
        try:
            return int(sec) * 1000 + int(usec) // 1000 - int(ct)
        except (TypeError, ValueError):
            return None

    async def workers(
        self, limit: int
    ) -> tuple[int, list[tuple[str, int, dict[bytes, bytes], int]]]:
        """The registry (see lib/workers.lua): the server time and, for up to ``limit``
        workers, (id, registration deadline ms, description, jobs held)."""
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        pipe.time()
        pipe.zrange(k.workers, 0, limit - 1, withscores=True)
        (sec, usec), entries = await self.read(pipe.execute())
        now = int(sec) * 1000 + int(usec) // 1000
        ids = [text_of(w) for w, _ in entries]
        pipe = self.client.pipeline(transaction=False)
        for wid in ids:
            pipe.hgetall(k.worker(wid))
            pipe.scard(k.worker_jobs(wid))
        res = await self.read(pipe.execute()) if ids else []
        return now, [
            (wid, int(score), res[2 * i], int(res[2 * i + 1]))
            for i, (wid, (_, score)) in enumerate(zip(ids, entries, strict=True))
        ]

    async def set_progress(self, job_id: str, data: bytes) -> None:
        """Record a running job's progress (JSON)."""
        await self.read(self.client.hset(self.keys.job(job_id), "pg", data))

    async def stats(self) -> dict[bytes, bytes]:
        return cast(dict[bytes, bytes], await self.read(self.client.hgetall(self.keys.stats)))

    async def lane_counts(self) -> tuple[int, int, int, int, int]:
        """Sizes of ready, prio, scheduled, active and dead."""
        pipe = self.client.pipeline(transaction=False)
        read_lane_counts(pipe, self.keys)
        ready, prio, sched, active, dead = await self.read(pipe.execute())
        return ready, prio, sched, active, dead

    async def group_counts(self) -> dict[str, int]:
        """Queued jobs per group, for every group that has any."""
        pipe = self.client.pipeline(transaction=False)
        read_group_names(pipe, self.keys)
        groups = group_names(await self.read(pipe.execute()))
        pipe = self.client.pipeline(transaction=False)
        for g in groups:
            pipe.zcard(self.keys.lane(g))
        sizes = await self.read(pipe.execute())
        return {g: n for g, n in zip(groups, sizes, strict=True) if n}

    async def zpage(
        self,
        key: str,
        start: float | str,
        n: int,
        offset: int,
        reverse: bool,
        stop: float | None = None,
    ) -> list[tuple[bytes, float]]:
        """Members of a ZSET from score ``start`` on (down, when ``reverse``), skipping
        ``offset``, at most ``n``, with their scores (bounded: one ZRANGE ... LIMIT)."""
        lo: object = "-inf" if stop is None else stop
        hi: object = start
        if not reverse:
            lo, hi = start, ("+inf" if stop is None else stop)
        if reverse:
            call = self.client.zrevrangebyscore(key, hi, lo, offset, n, withscores=True)  # type: ignore[arg-type]
        else:
            call = self.client.zrangebyscore(key, lo, hi, offset, n, withscores=True)  # type: ignore[arg-type]
        return cast(list[tuple[bytes, float]], await self.read(call))

    async def ready_page(
        self, n: int, newest_first: bool, pos: int, anchors: Sequence[str]
    ) -> tuple[int, list[bytes]]:
        """Up to ``n`` ids of the ready list after (before) the first of ``anchors`` still in
        it, oldest first, with the index of the first (page.lua); (-1, []) when newest first
        and the anchors are gone."""
        args = (self.base, n, 1 if newest_first else 0, pos, *anchors)
        res = await self._run("page", args, [self.keys.ready])
        return int(res[0]), list(res[1:])

    async def lrange(self, key: str, start: int, stop: int) -> list[bytes]:
        return cast(list[bytes], await self.read(self.client.lrange(key, start, stop)))

    async def job_fields(
        self, ids: Sequence[str], fields: Sequence[str]
    ) -> list[list[bytes | None]]:
        """The same fields of many jobs, in one call (peek.lua; at most 1,000 ids a call)."""
        k = len(fields)
        out: list[list[bytes | None]] = []
        for i in range(0, len(ids), MAX_JOBS_PER_CALL):
            chunk = ids[i : i + MAX_JOBS_PER_CALL]
            flat = await self._run("peek", (self.base, k, *fields, *chunk))
            out += [flat[j : j + k] for j in range(0, len(flat), k)]
        return out

    async def server_ms(self) -> int:
        """The server's clock (TIME), in ms."""
        sec, usec = await self.read(self.client.time())
        return int(sec) * 1000 + int(usec) // 1000

    async def throughput(self) -> dict[bytes, bytes]:
        """The per-minute counters (``<kind>:<minute>``), at most about two hours of them."""
        return cast(dict[bytes, bytes], await self.read(self.client.hgetall(self.keys.throughput)))

    async def group_settings(self) -> tuple[dict[bytes, bytes], dict[bytes, bytes], list[bytes]]:
        """gconf, gactive and the groups in gwait (bounded by configured and running groups)."""
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(k.gconf)
        pipe.hgetall(k.gactive)
        pipe.zrange(k.gwait, 0, -1)
        gconf, gactive, gwait = await self.read(pipe.execute())
        return gconf, gactive, gwait

    async def queue_settings(self) -> dict[bytes, bytes]:
        return cast(dict[bytes, bytes], await self.read(self.client.hgetall(self.keys.qconf)))

    async def lane_sizes(self, groups: Sequence[str]) -> list[int]:
        pipe = self.client.pipeline(transaction=False)
        for g in groups:
            pipe.zcard(self.keys.lane(g))
        return cast(list[int], await self.read(pipe.execute()))

    async def wake(self) -> None:
        """Leave a wake token: one idle consumer wakes up."""
        await self.read(self.client.lpush(self.keys.wake, b"1"))

    async def wait_for_wake(self, seconds: float) -> bool:
        """Block until a producer leaves a wake token or ``seconds`` pass (no polling);
        True if a token was taken."""
        call = self.client.blpop([self.keys.wake], max(seconds, 0.001))
        return await bounded(self.client, call, blocking=seconds) is not None

    async def wait_for_handoff(self, seconds: float, worker_id: str) -> list[Claimed]:
        """A parked worker's wait: block until jobs are handed to ``worker_id`` (returned,
        already leased to it), a wake token is left, or ``seconds`` pass (both: [])."""
        hand = self.keys.hand(worker_id)
        call = self.client.execute_command(  # type: ignore[no-untyped-call]
            "BLMPOP",
            max(seconds, 0.001),
            2,
            hand,
            self.keys.wake,
            "LEFT",
            "COUNT",
            CLAIMED_JOB_VALUES * MAX_JOBS_PER_CALL,
        )
        res = await bounded(self.client, call, blocking=seconds)
        if res is None or res[0] != hand.encode():
            return []
        return parse_claimed(res[1])

    async def batch_fields(self, batch_id: str, fields: Sequence[str]) -> list[bytes | None]:
        call = self.client.hmget(self.keys.batch(batch_id), list(fields))
        return cast(list[bytes | None], await self.read(call))

    async def batch_members(self, batch_id: str) -> list[bytes]:
        call = self.client.zrange(self.keys.batch(batch_id) + ":all", 0, -1)
        return cast(list[bytes], await self.read(call))

    async def batch_outcomes(
        self, batch_id: str, members: list[bytes]
    ) -> tuple[list[bytes | None], list[bytes | None]]:
        """Results and errors collected for these members (None where there is none)."""
        bk = self.keys.batch(batch_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(bk + ":res", members)
        pipe.hmget(bk + ":err", members)
        res, err = await self.read(pipe.execute())
        return res, err

    async def outbox(self, n: int) -> list[bytes]:
        """The first ``n`` entries of this queue's outbox (none when it is not a list: it is
        then set aside, as the scripts set aside a key of the wrong type)."""
        try:
            call = self.client.lrange(self.keys.outbox, 0, n - 1)
            return cast(list[bytes], await self.read(call))
        except ServerRefused as exc:
            if "WRONGTYPE" not in str(exc):
                raise
        await self.read(self._set_aside_outbox())
        return []

    async def _set_aside_outbox(self) -> None:
        k = self.keys
        async with self.client.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(k.outbox)
                kind = await pipe.type(k.outbox)
                if kind in (b"list", b"none", "list", "none"):
                    return
                now = int(time.time() * 1000)
                aside = f"{k.outbox}:garbled:{now}"
                why = f"wrong type for LRANGE: {kind.decode() if isinstance(kind, bytes) else kind}"
                pipe.multi()  # type: ignore[no-untyped-call]
                pipe.rename(k.outbox, aside)
                pipe.hset(k.garbled, aside, json.dumps({"key": k.outbox, "reason": why, "at": now}))
                pipe.hincrby(k.stats, "garbled", 1)
                await pipe.execute(raise_on_error=False)
            except rexc.WatchError:  # it changed meanwhile: the next look sees what it is now
                pass

    async def outbox_set_aside(self, entries: Sequence[bytes], reason: str) -> None:
        """Move outbox entries that cannot be read to ``outbox:garbled``, listed with the
        reason in ``garbled`` (and counted in stats), so the entries after them go on."""
        k = self.keys
        record = json.dumps({"key": k.outbox, "reason": reason, "at": int(time.time() * 1000)})
        pipe = self.client.pipeline(transaction=True)
        for raw in entries:
            pipe.rpush(k.outbox_garbled, raw)
            pipe.lrem(k.outbox, 1, raw)  # type: ignore[arg-type]
        pipe.hset(k.garbled, k.outbox_garbled, record)
        pipe.hincrby(k.stats, "garbled", len(entries))
        await self.read(pipe.execute())

    # ------------------------------------------------------------------ schedules
    async def schedule_tick(
        self,
        name: str,
        seen_ms: int,
        next_ms: int,
        job: JobRecord | None,
        run_at_ms: int = -1,
    ) -> tuple[int, TickOutcome]:
        """Fire one tick of a schedule (see schedule.lua): (server now, outcome)."""
        args: list[Any] = [self.base, name, seen_ms, next_ms]
        if job is None:
            args += ("", "", "", 1, -1, 0, "")
        else:
            t = job.template
            args += (job.id, job.payload, t.task, t.max_attempts, run_at_ms, t.priority)
            args.append(t.options)
        res = await self._run("schedule", args, [*self.lanes, self.keys.cron_next])
        return int(res[0]), _TICK[int(res[1])]

    async def schedule_put(self, name: str, definition: str, first_ms: int) -> int:
        """Store a schedule: 1 added, 2 changed (its next tick reset), 0 unchanged."""
        keys = [self.keys.cron_defs, self.keys.cron_next]
        args = (self.base, "put", name, definition, first_ms)
        return int(await self._run("schedules", args, keys))

    async def schedule_remove(self, name: str) -> bool:
        keys = [self.keys.cron_defs, self.keys.cron_next]
        return int(await self._run("schedules", (self.base, "remove", name), keys)) == 1

    async def schedule_ticks(self, limit: int = 10_000) -> tuple[int, list[tuple[str, int]]]:
        """The server's clock (ms) and the schedules' stored next ticks, earliest first."""
        pipe = self.client.pipeline(transaction=False)
        pipe.time()
        pipe.zrange(self.keys.cron_next, 0, limit - 1, withscores=True)
        (sec, usec), entries = await self.read(pipe.execute())
        now = int(sec) * 1000 + int(usec) // 1000
        return now, [(n.decode(errors="replace"), int(s)) for n, s in entries]

    async def schedule_defs(self, names: Sequence[str] | None = None) -> dict[str, bytes]:
        """Stored definitions: of ``names`` (those that exist), or all of them."""
        key = self.keys.cron_defs
        if names is None:
            raw = cast(dict[bytes, bytes], await self.read(self.client.hgetall(key)))
            return {k.decode(errors="replace"): v for k, v in raw.items()}
        if not names:
            return {}
        values = cast(list[bytes | None], await self.read(self.client.hmget(key, list(names))))
        return {n: v for n, v in zip(names, values, strict=True) if v is not None}

    async def outbox_remove(self, entries: Sequence[bytes]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for raw in entries:
            pipe.lrem(self.keys.outbox, 1, raw)  # type: ignore[arg-type]
        await self.read(pipe.execute())
