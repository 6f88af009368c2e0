"""The read side of the door to one queue's keys (``QueueReads``, held by ``QueueScripts``):
its plumbing (the client, the keys, ``run`` and ``read``, each bounded by the socket timeout)
and every read of a queue's keys and records, the operator's reads and the schedules' calls.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar, cast

import redis.asyncio as aioredis
import redis.exceptions as rexc

from .._model.exceptions import ServerRefused
from .._model.keys import QueueKeys, aside_key
from .._model.limits import BACKLOG_TASKS, CLAIMED_JOB_VALUES, JOB_LOG_LINES, MAX_JOBS_PER_CALL
from .._model.record import (
    Claimed,
    JobRecord,
    parse_claimed,
)
from .._model.timeutil import score_ms
from .cluster import server_time
from .loader import (
    SCRIPTS,
    bounded,
    evalsha,
    group_names,
    read_group_names,
    read_lane_counts,
    text_of,
)
from .outcomes import _TICK, TickOutcome

T = TypeVar("T")


class QueueReads:
    """One queue's keys on one client: the plumbing and every read (``QueueScripts`` holds
    one, and adds a typed method per transition script)."""

    __slots__ = ("base", "client", "keys", "lanes")

    def __init__(self, client: aioredis.Redis, keys: QueueKeys) -> None:
        self.client = client
        self.keys = keys
        self.lanes = tuple(keys.lanes())
        self.base = keys.base

    async def run(self, name: str, args: Sequence[Any], keys: Sequence[str] = ()) -> Any:
        """Call script ``name`` on this queue's lanes (or ``keys``): the raw reply."""
        return await evalsha(self.client, SCRIPTS[name], keys or self.lanes, args)

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
        server_time(pipe, self.client, self.keys.testclock)
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
        server_time(pipe, self.client, k.testclock)
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
            (wid, score_ms(score), res[2 * i], int(res[2 * i + 1]))
            for i, (wid, (_, score)) in enumerate(zip(ids, entries, strict=True))
        ]

    async def set_progress(self, job_id: str, data: bytes) -> None:
        """Record a running job's progress (JSON)."""
        await self.run("progress", (self.base, job_id, data))

    async def step(self, job_id: str, token: str, name: str, value: bytes | None) -> Any:
        """A durable step's recorded result (``value`` None), or record it (step.lua): the
        script's reply, ``[1, value]``, ``[0]`` or a negative code."""
        op = "get" if value is None else "put"
        return await self.run("step", (self.base, job_id, token, op, name, value or b""))

    async def change(
        self, job_id: str, priority: int | None, delay_ms: int, at_ms: int
    ) -> tuple[int, str]:
        """Change a job that has not started (change.lua): (1, state after), (0, state
        found: it started or finished, unchanged) or (-1, "": no such job)."""
        pr = "" if priority is None else str(priority)
        reply = await self.run("change", (self.base, job_id, pr, delay_ms, at_ms))
        return int(reply[0]), text_of(reply[1]) if len(reply) > 1 else ""

    async def job_log(self, job_id: str) -> list[bytes]:
        """A job's log lines, oldest first (the newest JOB_LOG_LINES; none if its log key
        holds garbage of another type)."""
        key = self.keys.job_log(job_id)
        try:
            lines = await self.read(self.client.lrange(key, -JOB_LOG_LINES, -1))
        except ServerRefused:
            return []
        return cast(list[bytes], lines)

    async def wait(
        self, job_id: str, token: str, n: int, ms: int, event: str, dead_ttl_ms: int
    ) -> Any:
        """A durable wait of a running job (wait.lua): its reply, ``[1, payload]`` (a
        signal's), ``[2]`` (over by time), ``[3, end ms]`` (parked) or a negative code."""
        args = (self.base, job_id, token, n, ms, event, dead_ttl_ms)
        return await self.run("wait", args)

    async def signal(self, event: str, payload: bytes) -> tuple[int, int]:
        """Wake up to 1,000 jobs waiting for ``event`` (signal.lua): (woken, still waiting)."""
        woken, left = await self.run("signal", (self.base, event, payload))
        return int(woken), int(left)

    async def append_log(self, job_id: str, token: str, lines: Sequence[str]) -> int:
        """Append lines to a running job's log (joblog.lua): 1, or a negative code."""
        return int(await self.run("joblog", (self.base, job_id, token, *lines)))

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
        res = await self.run("page", args, [self.keys.ready])
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
            flat = await self.run("peek", (self.base, k, *fields, *chunk))
            out += [flat[j : j + k] for j in range(0, len(flat), k)]
        return out

    async def why(self, job_id: str) -> bytes:
        """Why a job is (not) running, as why.lua's JSON (see ``JobWhy.read``)."""
        return cast(bytes, await self.run("why", (self.base, job_id)))

    async def server_ms(self) -> int:
        """The server's clock (TIME), in ms."""
        sec, usec = await self.read(server_time(self.client, self.client, self.keys.testclock))
        return int(sec) * 1000 + int(usec) // 1000

    async def throughput(self) -> dict[bytes, bytes]:
        """The per-minute counters (``<kind>:<minute>``), at most about two hours of them."""
        return cast(dict[bytes, bytes], await self.read(self.client.hgetall(self.keys.throughput)))

    async def trend_buckets(self, res: str, buckets: Sequence[int]) -> list[dict[bytes, bytes]]:
        """The trend hashes of these buckets (lib/trends.lua), each with its per-task
        samples' hash (``:t``), in one pipeline; a hash of the wrong type reads as empty."""
        pipe = self.client.pipeline(transaction=False)
        for b in buckets:
            pipe.hgetall(self.keys.trend(res, b))
            pipe.hgetall(self.keys.trend(res, b) + ":t")  # the per-task samples
        rows = await self.read(pipe.execute(raise_on_error=False))
        got = [r if isinstance(r, dict) else {} for r in rows]
        return [{**got[i + 1], **got[i]} for i in range(0, len(got), 2)]

    async def finished_counts(self) -> tuple[int, int]:
        """Sizes of the completed and cancelled indexes (a listing's totals)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(self.keys.completed)
        pipe.zcard(self.keys.cancelled)
        done, cancelled = await self.read(pipe.execute())
        return int(done), int(cancelled)

    async def backlog(self) -> dict[str, int]:
        """The backlog's counts per task (lib/core.lua; "*": the tasks past the first 100),
        tolerantly: a hash past its bound, of the wrong type, or a count that is not digits
        is left out (the next enqueue with ``max_queued`` sets it aside)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.type(self.keys.backlog)
        pipe.hlen(self.keys.backlog)
        kind, n = await self.read(pipe.execute(raise_on_error=False))
        if kind not in (b"hash", "hash") or not isinstance(n, int) or n > BACKLOG_TASKS + 1:
            return {}
        raw = cast(dict[bytes, bytes], await self.read(self.client.hgetall(self.keys.backlog)))
        out: dict[str, int] = {}
        for f, v in raw.items():
            name = f.decode(errors="replace")
            if v.isdigit() and (name == "*" or name.startswith("t:")):
                out[name if name == "*" else name[2:]] = int(v)
        return out

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
                aside = aside_key(k.outbox, now)
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
        res = await self.run("schedule", args, [*self.lanes, self.keys.cron_next])
        return int(res[0]), _TICK[int(res[1])]

    def _schedule_keys(self) -> list[str]:
        k = self.keys
        return [k.cron_defs, k.cron_next, k.garbled, k.stats]

    async def schedule_put(self, name: str, definition: str, first_ms: int) -> int:
        """Store a schedule: 1 added, 2 changed (its next tick reset), 0 unchanged."""
        args = (self.base, "put", name, definition, first_ms)
        return int(await self.run("schedules", args, self._schedule_keys()))

    async def schedule_remove(self, name: str) -> bool:
        args = (self.base, "remove", name)
        return int(await self.run("schedules", args, self._schedule_keys())) == 1

    async def schedule_set_aside(self, name: str, definition: bytes, reason: str) -> bool:
        """Move a schedule's definition (if it is still ``definition``) out of the stored ones,
        listed in ``garbled`` with the reason; its tick is dropped."""
        args = (self.base, "aside_def", name, definition, reason)
        return int(await self.run("schedules", args, self._schedule_keys())) == 1

    async def schedule_ticks_aside(self, names: Sequence[str], reason: str) -> int:
        """Move the ticks of ``names`` that have no definition or are not a valid time aside
        (one key, listed in ``garbled``); how many were moved."""
        args = (self.base, "aside_ticks", reason, *names)
        return int(await self.run("schedules", args, self._schedule_keys()))

    async def schedule_contain(self) -> int:
        """Rename schedule keys of the wrong type aside (listed in ``garbled``); how many."""
        return int(await self.run("schedules", (self.base, "contain"), self._schedule_keys()))

    async def schedule_ticks(self, limit: int = 10_000) -> tuple[int, list[tuple[str, float]]]:
        """The server's clock (ms) and the schedules' stored next ticks, earliest first (as
        stored: a planted score may be any float, even infinite)."""
        pipe = self.client.pipeline(transaction=False)
        server_time(pipe, self.client, self.keys.testclock)
        pipe.zrange(self.keys.cron_next, 0, limit - 1, withscores=True)
        (sec, usec), entries = await self.read(pipe.execute())
        now = int(sec) * 1000 + int(usec) // 1000
        return now, [(n.decode(errors="replace"), float(s)) for n, s in entries]

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
