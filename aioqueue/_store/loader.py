"""The Lua scripts and how they run: loaded from ``lua/*.lua``, each headed by its KEYS, ARGV
and return codes, with the parts of the library in ``lua/lib/`` that it needs prepended
(``LIB``, ``SCRIPTS``); all of them also form one function library (``LIBRARY``, see
``_funclib``): run with FCALL where the server has functions (Redis/Valkey 7+), else with
EVALSHA, and reloaded transparently after a ``FUNCTION FLUSH``/``SCRIPT FLUSH`` or a failover
to a server that has not seen them (function not found / NOSCRIPT); every call bounded by the App's
socket timeout, its errors wrapped (``ServerUnavailable``, ``ServerRefused``). The per-job codes
of the scripts become ``Outcome`` values here and nowhere else. ``QueueScripts`` (in
``_scripts``) is the typed door built on this.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import secrets
from collections.abc import Awaitable, Sequence
from importlib import resources
from typing import Any, Final, TypeVar, cast

import redis.asyncio as aioredis
import redis.exceptions as rexc

from .._model.exceptions import QueueFull, ServerRefused, ServerUnavailable
from .._model.keys import QueueKeys, counters_pattern, queue_head, schedule_defs_pattern
from .._model.limits import MAX_JOBS_PER_CALL
from .._model.record import (
    JobRecord,
    Template,
    enqueue_args,
    runs_args,
)
from .clock import virtual_build, virtual_clock_on
from .cluster import MOVING_ERRORS, every_primary, is_cluster, on_each_primary, slot_runs
from .funclib import FunctionLibrary
from .funclib import function_missing as function_missing
from .wire import build_of, call_timeout, evalsha_command, functions_on, use_functions

T = TypeVar("T")


def _nonce(n: int) -> str:
    """The random material of a claim of up to ``n`` jobs: 16 hex digits (64 bits) for each
    lease token it may make, each used once (REC.token in lib/leasing.lua); a parked worker's
    registration keeps what its claim left for the hand-off. At least 128 bits."""
    return secrets.token_hex(8 * max(min(n, MAX_JOBS_PER_CALL), 2))


def text_of(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


#: The Lua library, lua/lib/<part>.lua, in the order its parts are prepended to a script; each
#: part uses only parts before it (its header says which).
LIB: Final = (
    "core",
    "trends",
    "events",
    "lanes",
    "limiters",
    "batches",
    "deadletter",
    "deps",
    "history",
    "acks",
    "giveback",
    "maintenance",
    "parking",
    "workers",
    "leasing",
    "handoff",
)


def _lua(path: str) -> str:
    return resources.files("aioqueue._store").joinpath(f"lua/{path}.lua").read_text("utf-8")


_LIB: Final = {part: _lua(f"lib/{part}") for part in LIB}
#: the library's test build: now_ms() adds the virtual clock's offset (see _store/clock.py)
_TEST_LIB: Final = {**_LIB, "core": virtual_build(_LIB["core"])}


class Script:
    """One Lua script: its source (the library parts it needs, in ``LIB`` order, then its own
    file), its SHA1, its function's name in ``LIBRARY``, its ``test`` build (see clock.py).
    The source, its SHA1 and the test build are made when first asked for: a worker on a
    server with functions never needs them (they cost its start about 10 ms)."""

    __slots__ = ("_sha", "_source", "_test", "function", "lib", "name", "own", "parts")

    def __init__(self, name: str, parts: str, lib: dict[str, str] = _LIB) -> None:
        needs = parts.split()
        if unknown := set(needs) - set(LIB):
            raise ValueError(f"{name}: no library parts {sorted(unknown)}")
        self.name = name
        self.parts = tuple(part for part in LIB if part in needs)
        self.lib = lib
        self.own = _lua(name)
        self.function = ""  # set below, once LIBRARY is made
        self._source: str | None = None
        self._sha: str | None = None
        self._test: Script | None = None

    @property
    def source(self) -> str:
        if self._source is None:
            self._source = "\n".join([*(self.lib[part] for part in self.parts), self.own])
        return self._source

    @property
    def sha(self) -> str:
        if self._sha is None:
            self._sha = hashlib.sha1(self.source.encode()).hexdigest()
        return self._sha

    @property
    def test(self) -> Script:
        """The test build (now_ms() on the virtual clock), its function in the test library."""
        if self._test is None:
            if self.lib is _TEST_LIB:
                self._test = self
            else:
                self._test = Script(self.name, " ".join(self.parts), _TEST_LIB)
                self._test.function = testing_library().functions[self.name]
        return self._test


#: every script, with the library parts it needs: only those, as each part prepended costs
#: every call of the script the definition of that part's functions (tests/test_scripts.py
#: checks that these are exactly the parts each script uses)
SCRIPTS: Final = {
    name: Script(name, parts)
    for name, parts in (
        (
            "enqueue",
            "core events lanes limiters batches deadletter deps history maintenance parking"
            " workers leasing handoff",
        ),
        (
            "claim",
            "core events lanes limiters batches deadletter deps history maintenance parking"
            " workers leasing",
        ),
        ("complete", "core trends events lanes limiters batches deadletter deps acks"),
        (
            "complete_claim",
            "core trends events lanes limiters batches deadletter deps history acks maintenance"
            " parking workers leasing",
        ),
        ("fail", "core trends events lanes limiters batches deadletter deps history acks"),
        (
            "release",
            "core trends events lanes limiters batches deadletter deps history acks giveback",
        ),
        ("extend", "core"),
        ("limit", "core events lanes limiters"),
        ("watch", "core"),
        (
            "reap",
            "core events lanes limiters batches deadletter deps history maintenance parking"
            " workers",
        ),
        (
            "beat",
            "core trends events lanes limiters batches deadletter deps history maintenance parking"
            " workers",
        ),
        ("configure", "core events lanes"),
        ("deps", "core events lanes limiters batches deadletter deps"),
        ("batch", "core events lanes batches deadletter deps"),
        ("cancel", "core events lanes batches deadletter deps"),
        ("schedule", "core events lanes"),
        ("schedules", "core"),
        ("requeue", "core events lanes"),
        ("promote", "core events lanes"),
        ("purge", "core events lanes batches deadletter deps"),
        ("replace", "core events lanes"),
        ("page", ""),
        ("peek", "core"),
        ("progress", "core events"),
        ("step", "core"),
        ("joblog", "core"),
        (
            "wait",
            "core trends events lanes limiters batches deadletter deps history acks giveback",
        ),
        ("signal", "core events lanes"),
        ("change", "core events lanes"),
        ("rekey", "core"),
        ("tasks", "core"),
        ("why", "core events lanes limiters"),
    )
}


#: every script in one function library, loaded once (``load_scripts``)
LIBRARY: Final = FunctionLibrary([_LIB[p] for p in LIB], [(n, s.own) for n, s in SCRIPTS.items()])
for _script in SCRIPTS.values():
    _script.function = LIBRARY.functions[_script.name]


@functools.cache
def testing_library() -> FunctionLibrary:
    """The library's test build (see clock.py), made when first asked for."""
    own = [(n, s.own) for n, s in SCRIPTS.items()]
    return FunctionLibrary([_TEST_LIB[p] for p in LIB], own)


def library_of(client: Any) -> FunctionLibrary:
    return testing_library() if virtual_clock_on(client) else LIBRARY  # test mode: see clock.py


#: one script call of a pipeline: the script, its KEYS, its ARGV (ARGV[1]: the key base)
ScriptCall = tuple[Script, Sequence[str], Sequence[Any]]


def wrap_redis_error(exc: Exception) -> Exception:
    """Translate redis-py errors at the boundary: a lost connection is ``ServerUnavailable``,
    an error reply ``ServerRefused`` (enqueue.lua's QUEUEFULL: ``QueueFull``); other errors pass
    through."""
    if isinstance(exc, rexc.ConnectionError | rexc.TimeoutError | OSError):
        return ServerUnavailable(f"Redis connection failed: {exc}")
    if isinstance(exc, MOVING_ERRORS):  # a cluster's slot on the move: the call did not run
        return ServerUnavailable(f"Redis Cluster is moving the slot: {exc}")
    if isinstance(exc, rexc.ResponseError):
        full = str(exc).split()
        if len(full) == 4 and full[0] == "QUEUEFULL" and all(n.isdigit() for n in full[1:]):
            return QueueFull(int(full[1]), int(full[2]), int(full[3]))
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
        if isinstance(res, rexc.NoScriptError) or (
            isinstance(res, rexc.ResponseError) and function_missing(res)
        ):
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
    except (
        rexc.ConnectionError,
        rexc.TimeoutError,
        rexc.ResponseError,
        *MOVING_ERRORS,
        OSError,
    ) as exc:
        # OSError covers TimeoutError: the call outlived the App's socket_timeout
        raise wrap_redis_error(exc) from exc


async def evalsha(
    client: aioredis.Redis, script: Script, keys: Sequence[str], args: Sequence[Any]
) -> Any:
    """Run a script (FCALL, or EVALSHA without functions), loading it first if the server
    does not know it. ``args[0]`` is always the queue's key base (every script's ARGV[1])."""
    return await bounded(client, _evalsha(client, script, keys, args))


async def _evalsha(
    client: aioredis.Redis, script: Script, keys: Sequence[str], args: Sequence[Any]
) -> Any:
    command = evalsha_command(client, script, keys, args)
    try:
        return await client.execute_command(*command)  # type: ignore[no-untyped-call]
    except rexc.NoScriptError:
        # on a cluster, on every primary: one just promoted or given slots has none
        load = ("SCRIPT", "LOAD", build_of(client, script).source)
        await client.execute_command(*load, **every_primary(client))  # type: ignore[no-untyped-call]
    except rexc.ResponseError as exc:
        if not function_missing(exc):
            raise
        await load_library(client)
    return await client.execute_command(*command)  # type: ignore[no-untyped-call]


async def load_library(client: aioredis.Redis) -> None:
    """FUNCTION LOAD the library (one that is there already is kept: its name is its code)."""
    try:
        await client.execute_command("FUNCTION", "LOAD", library_of(client).source)  # type: ignore[no-untyped-call]
    except rexc.ResponseError as exc:
        if "already exists" not in str(exc):
            raise


async def load_scripts(client: aioredis.Redis) -> None:
    """Load every script once, on the server behind ``client``: the function library, after
    which this client's calls are FCALLs; or, where the server has no functions (Redis 6.2)
    or the ACL user may not load them, each script with SCRIPT LOAD (one round trip), after
    which its calls are EVALSHAs. For a client that may be a cluster's: ``load_everywhere``."""
    try:
        await load_library(client)
    except rexc.ResponseError:  # unknown command FUNCTION, or NOPERM: EVALSHA, as before 7.0
        use_functions(client, False)
        await load_script_sources(client)
    else:
        use_functions(client, True)


async def load_script_sources(client: aioredis.Redis) -> None:
    """SCRIPT LOAD every script, in one round trip (for EVALSHA)."""
    pipe = client.pipeline(transaction=False)
    for script in SCRIPTS.values():
        pipe.execute_command("SCRIPT", "LOAD", build_of(client, script).source)
    await pipe.execute()


async def load_everywhere(client: aioredis.Redis) -> None:
    """Load every script on the server behind ``client``: ``load_scripts`` (the function
    library, else the scripts), or, on a cluster client, ``load_script_sources`` on each of
    its primaries (a cluster client's calls are EVALSHAs)."""
    await on_each_primary(client, load_script_sources if is_cluster(client) else load_scripts)


async def check_script_access(client: aioredis.Redis, key: str) -> None:
    """Fail now, with the server's NOPERM error, if this connection's ACL user may not run
    scripts on keys like ``key``: an FCALL of a function no library has answers "function
    not found" when it is allowed (an EVALSHA of a SHA no script has, NOSCRIPT), and runs
    nothing."""
    if functions_on(client):
        try:
            await client.execute_command("FCALL", "aq_no_such_function", 1, key)  # type: ignore[no-untyped-call]
        except rexc.ResponseError as exc:
            if not function_missing(exc):
                raise
        return
    with contextlib.suppress(rexc.NoScriptError):
        await client.execute_command("EVALSHA", "0" * 40, 1, key)  # type: ignore[no-untyped-call]


async def evalsha_many(client: aioredis.Redis, calls: Sequence[ScriptCall]) -> list[Any]:
    """Run many script calls in one round trip (a non-transactional pipeline). Calls that met
    NOSCRIPT (or function not found) did not run, so they are run again, alone, once their
    script is loaded."""
    if is_cluster(client) and len(calls) > 1:
        # a cluster pipeline sends each node its calls at once: keep the order across slots
        # (a batch counts its members in before they exist) by running slot after slot
        results = []
        for run in slot_runs(calls, lambda call: call[1]):
            results += await _evalsha_pipeline(client, run)
        return results
    return await _evalsha_pipeline(client, calls)


async def _evalsha_pipeline(client: aioredis.Redis, calls: Sequence[ScriptCall]) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for script, keys, args in calls:
        pipe.execute_command(*evalsha_command(client, script, keys, args))
    results: list[Any] = await bounded(client, pipe.execute(raise_on_error=False))
    for i in pipeline_failures(results):
        results[i] = await evalsha(client, *calls[i])
    return results


async def schedule_queues(client: aioredis.Redis, prefix: str) -> list[str]:
    """The queues that have schedules stored under ``prefix`` (a SCAN of the key space: for
    listings, not for hot paths)."""
    pattern = schedule_defs_pattern(prefix)
    found: set[str] = set()

    async def scan() -> None:  # scan_iter: on a cluster, every primary's keys
        async for key in client.scan_iter(match=pattern, count=1000):
            name = cast(bytes, key).decode(errors="replace")[len(prefix) + 2 :]
            found.add(name.rsplit("}:cron:defs", 1)[0])

    await bounded(client, scan())
    return sorted(found)


async def queue_names(client: aioredis.Redis, prefix: str, limit: int = 1000) -> list[str]:
    """The queues under ``prefix`` that have counters (every queue that was ever used) or a
    worker registry (a queue a worker consumes before its first job), found with SCAN: O(keys
    in the database), for an operator's ``info`` without ``-q``."""
    head = queue_head(prefix)
    names: set[str] = set()

    async def scan() -> None:
        async for key in client.scan_iter(match=counters_pattern(prefix), count=1000):
            raw = key.decode(errors="replace") if isinstance(key, bytes) else str(key)
            tail = next((t for t in ("}:stats", "}:workers") if raw.endswith(t)), None)
            if raw.startswith(head) and tail is not None:
                names.add(raw[len(head) : -len(tail)])
                if len(names) >= limit:
                    return

    await bounded(client, scan())
    return sorted(names)
