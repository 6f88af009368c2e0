"""Shared checks for the store tests (enqueue, pull API, delays, atomicity, scripts).

- ``check_invariants``: I1 on a real server — every job in exactly one state structure, in
  agreement with its hash;
- ``server_ms``: the server's clock, the one clock leases and due times are judged by (I6);
- ``clients_named`` / ``blocked_in``: find an App's connections (``client_name``) in
  ``CLIENT LIST``, to see that a consumer is blocked on the server rather than polling;
- ``ReplyDropProxy``: a TCP proxy in front of the real server that, once armed, lets a command
  through but loses its reply, as a network failure after the server executed it would.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit
from uuid import uuid4

import pytest
from redis.asyncio import Redis

from aioqueue import App
from aioqueue._keys import QueueKeys

#: the structure a job id must be in, by its hash's ``s`` field (None: in no structure)
_HOME: dict[str, frozenset[str]] = {
    "queued": frozenset({"ready", "prio"}),  # or its group's lane, "g:<group>"
    "scheduled": frozenset({"scheduled"}),
    "active": frozenset({"active"}),
    "failed": frozenset({"dead"}),
    "completed": frozenset(),
    "cancelled": frozenset(),  # a runnable lane may still name it until claim drops it
    "waiting": frozenset(),  # a batch's callback, released when the batch finishes
}
_RUNNABLE = frozenset({"ready", "prio"})
_STRUCTURES = ("ready", "prio", "scheduled", "active", "dead")


def text(value: object) -> str:
    """A reply (bytes, as the fixtures' clients return) as a str."""
    return value.decode() if isinstance(value, bytes) else str(value)


def unique_prefix() -> str:
    """A key prefix no other test uses."""
    return f"t{uuid4().hex[:12]}"


@contextlib.asynccontextmanager
async def open_app(url: str, **options: Any) -> AsyncIterator[App]:
    """An open App on ``url`` with a unique prefix unless ``prefix=`` is given."""
    options.setdefault("prefix", unique_prefix())
    async with App(url, **options) as app:
        yield app


async def server_ms(redis: Redis) -> int:
    """The server's clock in epoch milliseconds, computed the way the scripts compute it."""
    sec, usec = await redis.time()
    return int(sec) * 1000 + int(usec) // 1000


async def clients_named(redis: Redis, name: str) -> list[dict[str, str]]:
    """The server's view (``CLIENT LIST``) of the connections called ``name``."""
    return [c for c in await redis.client_list() if c.get("name") == name]


async def blocked_in(redis: Redis, name: str, command: str = "") -> bool:
    """Whether a connection called ``name`` is blocked on the server in ``command`` (default:
    in an idle wait, a worker's BLMPOP or a pull-API consumer's BLPOP)."""
    commands = (command,) if command else ("blpop", "blmpop")
    return any("b" in c["flags"] and c["cmd"] in commands for c in await clients_named(redis, name))


async def job_keys(redis: Redis, keys: QueueKeys) -> list[str]:
    """The ids of every job hash of a queue (SCAN, so only for a quiescent queue)."""
    prefix = keys.base + "job:"
    found = redis.scan_iter(match=prefix + "*", count=1000)
    return [text(k)[len(prefix) :] async for k in found]


async def check_invariants(
    redis: Redis, keys: QueueKeys, *, allow_expired_dead: bool = True
) -> dict[str, str]:
    """Assert I1 for one queue and return ``{job id: state}`` of every job hash.

    Checks that each id is in at most one of ready/prio/scheduled/active/dead or a group's
    lane (and at most once in the ready list); that a queued job is in its group's lane, or
    without a group in ready (priority 0) or prio (otherwise); a scheduled one in scheduled,
    an active one in active (holding a lease token), a failed one in dead, a completed or
    waiting one in none, a cancelled one in none but a runnable lane (dropped lazily); and
    that no structure names a job whose hash is gone, except dead letters whose record
    expired before ``reap`` trimmed the dead set. Call it only when nothing else is
    changing the queue: it reads with several commands.
    """
    members: dict[str, list[str]] = {
        "ready": [text(m) for m in await redis.lrange(keys.ready, 0, -1)]
    }
    for name in _STRUCTURES[1:]:
        members[name] = [text(m) for m in await redis.zrange(getattr(keys, name), 0, -1)]
    # groups' lanes (base.."g:"..group ZSETs), where a queued job with a group waits
    async for lane in redis.scan_iter(match=keys.base + "g:*", count=1000):
        name = text(lane)[len(keys.base) :]
        members[name] = [text(m) for m in await redis.zrange(lane, 0, -1)]
    assert len(members["ready"]) == len(set(members["ready"])), "an id is twice in ready"

    where: dict[str, str] = {}
    for name, held in members.items():
        for job_id in held:
            assert job_id not in where, f"job {job_id} is in both {where[job_id]} and {name}"
            where[job_id] = name

    ids = await job_keys(redis, keys)
    records: dict[str, tuple[str, bytes | None, bytes | None, bytes | None]] = {}
    for start in range(0, len(ids), 1000):
        chunk = ids[start : start + 1000]
        pipe = redis.pipeline(transaction=False)
        for job_id in chunk:
            pipe.hmget(keys.job(job_id), ["s", "pr", "l", "g"])
        for job_id, (s, pr, lease, group) in zip(chunk, await pipe.execute(), strict=True):
            if s is not None:  # None: expired between SCAN and HMGET
                records[job_id] = (s.decode(), pr, lease, group)

    for job_id, name in where.items():
        if job_id not in records:
            expired_dead = allow_expired_dead and name == "dead"
            assert expired_dead, f"{name} holds job {job_id}, which has no record"
    for job_id, (state, pr, lease, group) in records.items():
        assert state in _HOME, f"job {job_id} has unknown state {state!r}"
        found = where.get(job_id)
        if state == "queued":
            lane = "ready" if int(pr or 0) == 0 else "prio"
            expected = "g:" + group.decode() if group else lane
            assert found == expected, f"queued job {job_id} (priority {pr!r}) is in {found}"
        elif state == "cancelled":
            lazy = found is None or found in _RUNNABLE or found.startswith("g:")
            assert lazy, f"cancelled job {job_id} is still in {found}"
        elif _HOME[state]:
            assert found in _HOME[state], f"{state} job {job_id} is in {found or 'no structure'}"
        else:
            assert found is None, f"{state} job {job_id} is still in {found}"
        # an active job always holds a lease token; the last token stays after it leaves
        # active, so that an ack resent after a lost reply is recognised (lua/_lib.lua)
        if state == "active":
            assert lease is not None, f"active job {job_id} has no lease token"
    # jobs handed to a parked worker (7 values each, as claim replies) hold its current lease
    async for hand in redis.scan_iter(match=keys.base + "hand:*", count=1000):
        values = await redis.lrange(hand, 0, -1)
        assert len(values) % 7 == 0, f"{text(hand)} holds a partial record"
        for i in range(0, len(values), 7):
            job_id, token = text(values[i]), text(values[i + 1])
            state, _, lease, _ = records.get(job_id, ("gone", None, None, None))
            assert state == "active", f"job {job_id} handed over in {text(hand)} is {state}"
            assert text(lease) == token, f"job {job_id} handed over with a stale lease"
    return {job_id: rec[0] for job_id, rec in records.items()}


class ReplyDropProxy:
    """A TCP proxy to a real server that can lose one reply.

    ``arm(marker)``: the next request containing ``marker`` goes through to the server and
    runs there, but its reply never reaches the client: the proxy cuts the client's
    connection instead. Everything else is forwarded untouched.
    ``mute()``: from then on no reply reaches any client, and no connection is closed (a
    server, or a network, that silently stops answering).
    """

    def __init__(self, redis_url: str) -> None:
        parts = urlsplit(redis_url)
        if parts.scheme != "redis" or not parts.hostname or not parts.port:
            pytest.skip("the reply-dropping proxy needs a redis:// TCP URL")
        self._target = (parts.hostname, parts.port)
        self._db = parts.path or "/0"
        self._server: asyncio.Server | None = None
        self._marker: bytes | None = None
        self._muted = False
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self.dropped = 0

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"redis://127.0.0.1:{port}{self._db}"

    def mute(self) -> None:
        """Swallow every reply from now on, leaving the connections open."""
        self._muted = True

    def arm(self, marker: bytes) -> None:
        """Lose the reply to the next request that contains ``marker``."""
        self._marker = marker

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()  # each forwarding task then sees its streams end
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        await self._server.wait_closed()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            server_r, server_w = await asyncio.open_connection(*self._target)
        except OSError:
            client_w.transport.abort()
            self._tasks.discard(task)
            return
        self._writers += [client_w, server_w]
        drop = False

        async def upstream() -> None:
            nonlocal drop
            while data := await client_r.read(65536):
                if self._marker is not None and self._marker in data:
                    self._marker = None
                    drop = True
                server_w.write(data)
                await server_w.drain()
            server_w.transport.abort()  # the client hung up: hang up on the server too

        async def downstream() -> None:
            while data := await server_r.read(65536):
                if drop:
                    self.dropped += 1
                    client_w.transport.abort()
                    server_w.transport.abort()
                    return
                if self._muted:
                    continue
                client_w.write(data)
                await client_w.drain()
            client_w.transport.abort()

        try:
            await asyncio.gather(upstream(), downstream(), return_exceptions=True)
        finally:
            client_w.transport.abort()
            server_w.transport.abort()
            self._tasks.discard(task)
