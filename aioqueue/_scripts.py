"""The Lua scripts: loaded from ``lua/*.lua``, run with EVALSHA, one typed method each.

Each script file starts with a header listing its KEYS, ARGV and return codes; ``lua/_lib.lua`` is
prepended to every script. Scripts are run with EVALSHA and reloaded transparently after a
``SCRIPT FLUSH`` or a failover to a server that has not seen them (NOSCRIPT).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final

import redis.asyncio as aioredis
import redis.exceptions as rexc

from ._exceptions import ConnectionError as AQConnectionError
from ._exceptions import JobNotFound, LeaseLost
from ._keys import QueueKeys

#: return codes shared by the fenced scripts
OK: Final = 1
NO_JOB: Final = -1
STALE: Final = -2
CANCEL_REQUESTED: Final = -3  # extend: renewed, but the job was cancelled meanwhile


def check_code(code: int, job_id: str) -> None:
    """Map a fenced script's per-job return code to an exception (the one table)."""
    if code == NO_JOB:
        raise JobNotFound(job_id)
    if code == STALE:
        raise LeaseLost(job_id)


class Script:
    """One Lua script: its source (with the shared library prepended) and its SHA1."""

    __slots__ = ("name", "sha", "source")

    def __init__(self, name: str, lib: str) -> None:
        body = resources.files("aioqueue").joinpath(f"lua/{name}.lua").read_text("utf-8")
        self.name = name
        self.source = f"{lib}\n{body}"
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()


_LIB = resources.files("aioqueue").joinpath("lua/_lib.lua").read_text("utf-8")
SCRIPTS: Final = {
    name: Script(name, _LIB)
    for name in (
        "enqueue",
        "claim",
        "complete",
        "complete_claim",
        "fail",
        "release",
        "extend",
        "watch",
        "reap",
        "configure",
        "batch",
        "cancel",
    )
}


def wrap_redis_error(exc: Exception) -> Exception:
    """Translate redis-py connection errors at the boundary; other errors pass through."""
    if isinstance(exc, rexc.ConnectionError | rexc.TimeoutError | OSError):
        return AQConnectionError(f"Redis connection failed: {exc}")
    return exc


async def evalsha(
    client: aioredis.Redis, script: Script, keys: Sequence[str], args: Sequence[Any]
) -> Any:
    """Run a script with EVALSHA, loading it first if the server does not know it."""
    try:
        try:
            return await client.execute_command(  # type: ignore[no-untyped-call]
                "EVALSHA", script.sha, len(keys), *keys, *args
            )
        except rexc.NoScriptError:
            await client.execute_command(  # type: ignore[no-untyped-call]
                "SCRIPT", "LOAD", script.source
            )
            return await client.execute_command(  # type: ignore[no-untyped-call]
                "EVALSHA", script.sha, len(keys), *keys, *args
            )
    except (rexc.ConnectionError, rexc.TimeoutError, OSError) as exc:
        raise wrap_redis_error(exc) from exc


async def evalsha_many(
    client: aioredis.Redis, calls: Sequence[tuple[Script, Sequence[str], Sequence[Any]]]
) -> list[Any]:
    """Run many script calls in one round trip (a non-transactional pipeline). Calls that met
    NOSCRIPT did not run, so they are run again, alone, once their script is loaded."""
    try:
        pipe = client.pipeline(transaction=False)
        for script, keys, args in calls:
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        results: list[Any] = await pipe.execute(raise_on_error=False)
        for i, res in enumerate(results):
            if isinstance(res, rexc.NoScriptError):
                results[i] = await evalsha(client, calls[i][0], calls[i][1], calls[i][2])
            elif isinstance(res, Exception):
                raise res
        return results
    except (rexc.ConnectionError, rexc.TimeoutError, OSError) as exc:
        raise wrap_redis_error(exc) from exc


@dataclass(slots=True)
class Claimed:
    """One job leased by ``claim``."""

    id: str
    token: str
    attempt: int
    task: str
    payload: bytes
    options: bytes
    max_attempts: int


@dataclass(slots=True)
class ClaimResult:
    now_ms: int
    next_wake_ms: int
    jobs: list[Claimed]


class QueueScripts:
    """The scripts bound to one queue's keys and one client."""

    __slots__ = ("base", "client", "keys", "lanes")

    def __init__(self, client: aioredis.Redis, keys: QueueKeys) -> None:
        self.client = client
        self.keys = keys
        self.lanes = keys.lanes()
        self.base = keys.base

    async def enqueue(self, jobs: Sequence[Sequence[Any]], chunk: int = 500) -> list[int]:
        """Add jobs (11 values each, see enqueue.lua); returns one code per job."""
        calls = []
        for i in range(0, len(jobs), chunk):
            part = jobs[i : i + chunk]
            args: list[Any] = [self.base, len(part)]
            for job in part:
                args.extend(job)
            calls.append((SCRIPTS["enqueue"], self.lanes, args))
        if len(calls) == 1:
            results = [await evalsha(self.client, *calls[0])]
        else:
            results = await evalsha_many(self.client, calls)
        codes: list[int] = []
        for res in results:
            codes.extend(res[1:])
        return codes

    async def claim(self, n: int, lease_ms: int, dead_ttl_ms: int) -> ClaimResult:
        res = await evalsha(
            self.client, SCRIPTS["claim"], self.lanes, (self.base, n, lease_ms, dead_ttl_ms)
        )
        return parse_claim(res)

    async def complete_claim(
        self,
        items: Sequence[tuple[str, str, bytes, int]],
        n: int,
        lease_ms: int,
        dead_ttl_ms: int,
    ) -> tuple[ClaimResult, list[int]]:
        """Complete ``items`` and lease up to ``n`` jobs in one round trip."""
        args: list[Any] = [self.base, n, lease_ms, dead_ttl_ms, len(items)]
        for item in items:
            args.extend(item)
        res = await evalsha(self.client, SCRIPTS["complete_claim"], self.lanes, args)
        m = len(items)
        if not m:
            return parse_claim(res), []
        return parse_claim(res[:-m]), list(res[-m:])

    async def complete(self, items: Sequence[tuple[str, str, bytes, int]]) -> list[int]:
        args: list[Any] = [self.base, len(items)]
        for item in items:
            args.extend(item)
        return list(await evalsha(self.client, SCRIPTS["complete"], self.lanes, args))

    async def fail(
        self, job_id: str, token: str, error: bytes, retry_delay_ms: int, dead_ttl_ms: int
    ) -> int:
        args = (self.base, job_id, token, error, retry_delay_ms, dead_ttl_ms)
        return int(await evalsha(self.client, SCRIPTS["fail"], self.lanes, args))

    async def release(
        self, pairs: Sequence[tuple[str, str]], delay_ms: int = 0, refund: bool = False
    ) -> list[int]:
        args: list[Any] = [self.base, delay_ms, 1 if refund else 0, len(pairs)]
        for job_id, token in pairs:
            args += (job_id, token)
        return list(await evalsha(self.client, SCRIPTS["release"], self.lanes, args))

    async def extend(self, pairs: Sequence[tuple[str, str]], lease_ms: int) -> list[int]:
        args: list[Any] = [self.base, lease_ms, len(pairs)]
        for job_id, token in pairs:
            args += (job_id, token)
        res = await evalsha(self.client, SCRIPTS["extend"], self.lanes, args)
        return list(res[1:])

    async def cancel(self, ids: Sequence[str], dead_ttl_ms: int) -> tuple[int, int]:
        """Cancel jobs (see cancel.lua); returns (cancelled now, running ones asked to stop)."""
        res = await evalsha(
            self.client, SCRIPTS["cancel"], self.lanes, (self.base, dead_ttl_ms, *ids)
        )
        return int(res[0]), int(res[1])

    async def configure(self, op: str, group: str = "", v1: object = "", v2: object = "") -> None:
        """Change a queue or group setting (see configure.lua)."""
        args = (self.base, op, group, v1, v2)
        await evalsha(self.client, SCRIPTS["configure"], self.lanes, args)

    async def watch(
        self, job_id: str, register: bool, kind: str = "job"
    ) -> tuple[str, bytes, bytes]:
        args = (self.base, job_id, 1 if register else 0, kind)
        res = await evalsha(self.client, SCRIPTS["watch"], self.lanes, args)
        return res[0].decode(), res[1], res[2]

    async def reap(self, limit: int, dead_ttl_ms: int, lock_ms: int = 0) -> tuple[int, int, int]:
        """Maintenance; returns (recovered, promoted, dead_trimmed), all -1 when another
        process did it in this lock period."""
        keys = [*self.lanes, self.keys.reap_lock]
        res = await evalsha(
            self.client, SCRIPTS["reap"], keys, (self.base, limit, dead_ttl_ms, lock_ms)
        )
        return int(res[1]), int(res[2]), int(res[3])


def parse_claim(res: list[Any]) -> ClaimResult:
    jobs = [
        Claimed(
            res[i].decode(),
            str(res[i + 1]),
            int(res[i + 2]),
            res[i + 3].decode(),
            res[i + 4],
            res[i + 5],
            int(res[i + 6]),
        )
        for i in range(2, len(res), 7)
    ]
    return ClaimResult(int(res[0]), int(res[1]), jobs)
