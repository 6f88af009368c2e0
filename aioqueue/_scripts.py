"""The Lua scripts: loaded from ``lua/*.lua``, run with EVALSHA, one typed method each.

Each script file starts with a header listing its KEYS, ARGV and return codes; the parts of the
library in ``lua/lib/`` that it needs are prepended to it (``LIB``, ``SCRIPTS``). Scripts are run
with EVALSHA and reloaded transparently after a ``SCRIPT FLUSH`` or a failover to a server that
has not seen them (NOSCRIPT).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final

import redis.asyncio as aioredis
import redis.exceptions as rexc

from ._exceptions import JobNotFound, LeaseLost, ServerUnavailable
from ._keys import QueueKeys
from ._limits import CLAIMED_JOB_VALUES

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


#: The Lua library, lua/lib/<part>.lua, in the order its parts are prepended to a script; each
#: part uses only parts before it (its header says which).
LIB: Final = (
    "core",
    "lanes",
    "batches",
    "deadletter",
    "acks",
    "maintenance",
    "parking",
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
        ("enqueue", "core lanes batches deadletter maintenance parking leasing handoff"),
        ("claim", "core lanes batches deadletter maintenance parking leasing"),
        ("complete", "core lanes batches acks"),
        ("complete_claim", "core lanes batches deadletter acks maintenance parking leasing"),
        ("fail", "core lanes batches deadletter acks"),
        ("release", "core lanes batches deadletter acks"),
        ("extend", "core"),
        ("watch", "core"),
        ("reap", "core lanes batches deadletter maintenance parking"),
        ("configure", "core lanes"),
        ("batch", "core lanes batches"),
        ("cancel", "core lanes batches"),
    )
}


def wrap_redis_error(exc: Exception) -> Exception:
    """Translate redis-py connection errors at the boundary; other errors pass through."""
    if isinstance(exc, rexc.ConnectionError | rexc.TimeoutError | OSError):
        return ServerUnavailable(f"Redis connection failed: {exc}")
    return exc


def _bulk(arg: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(arg), arg)


class Head(str):
    """The command name ``EVALSHA`` carrying the packed, unchanging start of a script call:
    the SHA, the KEYS and the key base (ARGV[1]). A connection of ``fast_connection_class``
    sends it as is, so a call only encodes its varying arguments."""

    packed: bytes
    nargs: int

    def __new__(cls, script: Script, keys: Sequence[str], base: str) -> Head:
        head = super().__new__(cls, "EVALSHA")
        fixed = [b"EVALSHA", script.sha.encode(), b"%d" % len(keys)]
        fixed += [k.encode() for k in keys]
        fixed.append(base.encode())
        head.packed = b"".join(_bulk(a) for a in fixed)
        head.nargs = len(fixed)
        return head


_HEADS: dict[tuple[str, tuple[str, ...], str], Head] = {}


def head_for(script: Script, keys: Sequence[str], base: str) -> Head:
    key = (script.sha, tuple(keys), base)
    head = _HEADS.get(key)
    if head is None:
        if len(_HEADS) > 10_000:  # many queues come and go: do not grow without bound
            _HEADS.clear()
        head = _HEADS[key] = Head(script, keys, base)
    return head


class _FastPack:
    """Mixin for redis-py connections: packs a script call that starts with a Head by
    splicing in its pre-packed bytes; every other command is packed by redis-py."""

    encoder: Any

    def pack_command(self, *args: Any) -> list[bytes]:
        head = args[0]
        if type(head) is not Head:
            return super().pack_command(*args)  # type: ignore[misc,no-any-return]
        parts = [b"*%d\r\n" % (head.nargs + len(args) - 1), head.packed]
        for arg in args[1:]:
            kind = type(arg)
            if kind is bytes:
                data = arg
            elif kind is str:
                data = arg.encode()
            elif kind is int:
                data = b"%d" % arg
            else:
                data = self.encoder.encode(arg)
            parts.append(b"$%d\r\n" % len(data))
            parts.append(data)
            parts.append(b"\r\n")
        return [b"".join(parts)]


_FAST: dict[type, type] = {}


def use_fast_packing(client: aioredis.Redis, timeout: float | None = None) -> None:
    """Make the client's pool create connections that splice pre-packed script heads, and
    give script calls on it a time limit (``timeout`` seconds)."""
    pool = client.connection_pool
    pool.aioqueue_timeout = timeout  # type: ignore[attr-defined]
    base = pool.connection_class
    if issubclass(base, _FastPack):
        return
    fast = _FAST.get(base)
    if fast is None:
        fast = _FAST[base] = type(f"Fast{base.__name__}", (_FastPack, base), {})
    pool.connection_class = fast


def _command(
    client: aioredis.Redis, script: Script, keys: Sequence[str], args: Sequence[Any]
) -> tuple[Any, ...]:
    if issubclass(client.connection_pool.connection_class, _FastPack):
        return (head_for(script, keys, args[0]), *args[1:])
    return ("EVALSHA", script.sha, len(keys), *keys, *args)


async def evalsha(
    client: aioredis.Redis, script: Script, keys: Sequence[str], args: Sequence[Any]
) -> Any:
    """Run a script with EVALSHA, loading it first if the server does not know it.
    ``args[0]`` is always the queue's key base (every script's ARGV[1])."""
    command = _command(client, script, keys, args)
    try:
        async with asyncio.timeout(getattr(client.connection_pool, "aioqueue_timeout", None)):
            try:
                return await client.execute_command(*command)  # type: ignore[no-untyped-call]
            except rexc.NoScriptError:
                await client.execute_command(  # type: ignore[no-untyped-call]
                    "SCRIPT", "LOAD", script.source
                )
                return await client.execute_command(*command)  # type: ignore[no-untyped-call]
    except (rexc.ConnectionError, rexc.TimeoutError, OSError) as exc:
        # OSError covers TimeoutError: the call outlived the App's socket_timeout
        raise wrap_redis_error(exc) from exc


async def load_scripts(client: aioredis.Redis) -> None:
    """SCRIPT LOAD every script, in one round trip."""
    pipe = client.pipeline(transaction=False)
    for script in SCRIPTS.values():
        pipe.execute_command("SCRIPT", "LOAD", script.source)
    await pipe.execute()


async def evalsha_many(
    client: aioredis.Redis, calls: Sequence[tuple[Script, Sequence[str], Sequence[Any]]]
) -> list[Any]:
    """Run many script calls in one round trip (a non-transactional pipeline). Calls that met
    NOSCRIPT did not run, so they are run again, alone, once their script is loaded."""
    try:
        pipe = client.pipeline(transaction=False)
        for script, keys, args in calls:
            pipe.execute_command(*_command(client, script, keys, args))
        async with asyncio.timeout(getattr(client.connection_pool, "aioqueue_timeout", None)):
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
        self.lanes = tuple(keys.lanes())
        self.base = keys.base

    async def enqueue(self, jobs: Sequence[Sequence[Any]], chunk: int = 500) -> list[int]:
        """Add jobs (11 values each: id, task, payload, then the template of enqueue.lua);
        returns one code per job. Runs of jobs with the same template go as id/payload pairs."""
        calls = [
            (SCRIPTS["enqueue"], self.lanes, enqueue_args(self.base, jobs[i : i + chunk]))
            for i in range(0, len(jobs), chunk)
        ]
        return await self._enqueue_calls(calls)

    async def enqueue_run(
        self, template: Sequence[Any], pairs: list[Any], chunk: int = 500
    ) -> list[int]:
        """Add jobs that share one template (9 values: task, then enqueue.lua's template):
        ``pairs`` is id, payload, id, payload, ...; returns one code per job."""
        step = 2 * chunk
        calls = [
            (
                SCRIPTS["enqueue"],
                self.lanes,
                runs_args(self.base, [(template, pairs[i : i + step])]),
            )
            for i in range(0, len(pairs), step)
        ]
        return await self._enqueue_calls(calls)

    async def _enqueue_calls(
        self, calls: Sequence[tuple[Script, Sequence[str], Sequence[Any]]]
    ) -> list[int]:
        if len(calls) == 1:
            results = [await evalsha(self.client, *calls[0])]
        else:
            results = await evalsha_many(self.client, calls)
        codes: list[int] = []
        for res in results:
            codes.extend(res[1:])
        return codes

    async def claim(
        self, n: int, lease_ms: int, dead_ttl_ms: int, worker_id: str = "", park_ms: int = 0
    ) -> ClaimResult:
        """Lease up to ``n`` jobs; a worker (``worker_id``) also takes back what was handed to
        it while parked, and parks for ``park_ms`` when it got fewer than ``n``."""
        args = (self.base, n, lease_ms, dead_ttl_ms, worker_id, park_ms)
        return parse_claim(await evalsha(self.client, SCRIPTS["claim"], self.lanes, args))

    async def complete_claim(
        self,
        items: Sequence[tuple[str, str, bytes, int]],
        n: int,
        lease_ms: int,
        dead_ttl_ms: int,
        worker_id: str = "",
        park_ms: int = 0,
    ) -> tuple[ClaimResult, list[int]]:
        """Complete ``items`` and lease up to ``n`` jobs in one round trip (see ``claim``)."""
        args: list[Any] = [self.base, n, lease_ms, dead_ttl_ms, worker_id, park_ms, len(items)]
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
        self,
        pairs: Sequence[tuple[str, str]],
        delay_ms: int = 0,
        refund: bool = False,
        dead_ttl_ms: int = 0,
    ) -> list[int]:
        args: list[Any] = [self.base, delay_ms, 1 if refund else 0, dead_ttl_ms, len(pairs)]
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


def enqueue_args(base: str, jobs: Sequence[Sequence[Any]]) -> list[Any]:
    """enqueue.lua's ARGV for jobs given as (id, task, payload, *template-rest): consecutive jobs
    with the same template go as one run."""
    runs: list[tuple[tuple[Any, ...], list[Any]]] = []
    for job in jobs:
        template = (job[1], *job[3:])
        if not runs or runs[-1][0] != template:
            runs.append((template, []))
        runs[-1][1].extend((job[0], job[2]))
    return runs_args(base, runs)


def runs_args(base: str, runs: Sequence[tuple[Sequence[Any], Sequence[Any]]]) -> list[Any]:
    """enqueue.lua's ARGV for runs of jobs: (template, [id, payload, id, payload, ...]) each."""
    args: list[Any] = [base, len(runs)]
    for template, pairs in runs:
        args.extend(template)
        args.append(len(pairs) // 2)
        args.extend(pairs)
    return args


def parse_claim(res: list[Any]) -> ClaimResult:
    """claim's reply: now, next wake-up, then the leased jobs."""
    return ClaimResult(int(res[0]), int(res[1]), parse_claimed(res, 2))


def parse_claimed(values: list[Any], first: int = 0) -> list[Claimed]:
    """Leased jobs, ``CLAIMED_JOB_VALUES`` values each from ``first`` on, as claim replies them
    and enqueue hands them to a parked worker (integers then arrive as bytes, from a list)."""
    return [
        Claimed(
            values[i].decode(),
            str(int(values[i + 1])),
            int(values[i + 2]),
            values[i + 3].decode(errors="replace"),  # an unknown task name is dead-lettered
            values[i + 4],
            values[i + 5],
            int(values[i + 6]),
        )
        for i in range(first, len(values), CLAIMED_JOB_VALUES)
    ]
