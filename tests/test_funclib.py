"""The scripts as one function library (_funclib.py): FCALL where the server has functions,
a missing library loaded again and the call retried, two releases' libraries side by side,
and EVALSHA where the library cannot be loaded."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any, cast
from uuid import uuid4

import pytest
from redis.asyncio import Redis

from aioqueue import App
from aioqueue._store.embedded import EmbeddedServer
from aioqueue._store.funclib import FunctionLibrary
from aioqueue._store.loader import _LIB, LIB, LIBRARY, SCRIPTS, _lua
from aioqueue._store.wire import functions_on

from .support.apps import open_app
from .support.server import text


@pytest.fixture
async def observer(fresh_server: EmbeddedServer) -> AsyncIterator[Redis]:
    client = Redis.from_url(fresh_server.url)
    try:
        yield client
    finally:
        await client.aclose()


async def libraries(redis: Redis) -> set[str]:
    found = await redis.execute_command("FUNCTION", "LIST")  # type: ignore[no-untyped-call]
    names = set()
    for lib in found:  # a dict (redis-py parses it) or a flat list of names and values
        entry = lib if isinstance(lib, dict) else dict(zip(lib[::2], lib[1::2], strict=True))
        names.add(text(entry.get(b"library_name", entry.get("library_name", ""))))
    return names


async def fcalls(redis: Redis) -> int:
    entry = (await redis.info("commandstats")).get("cmdstat_fcall")
    return int(entry["calls"]) if entry else 0


async def test_an_app_loads_the_library_and_calls_functions(
    fresh_server: EmbeddedServer, observer: Redis
) -> None:
    async with open_app(fresh_server.url) as app:
        assert functions_on(app.redis)
        assert LIBRARY.name in await libraries(observer)
        await app.queue().enqueue("t", job_id="a")  # (its first reads the task table too)
        before = await fcalls(observer)
        await app.queue().enqueue("t", job_id="b")
        assert await fcalls(observer) == before + 1
        assert await observer.script_exists(SCRIPTS["enqueue"].sha) == [False]  # no EVALSHA


async def test_a_missing_library_is_loaded_again_and_the_call_retried(
    fresh_server: EmbeddedServer, observer: Redis
) -> None:
    async with open_app(fresh_server.url) as app:

        @app.task
        async def work(i: int) -> None:
            pass

        q = app.queue()
        await observer.function_flush()
        assert await libraries(observer) == set()
        job = await q.enqueue("t", job_id="one")  # function not found: loaded, run again
        assert LIBRARY.name in await libraries(observer)
        assert (await job.state()).value == "queued"
        await observer.function_flush()
        await work.enqueue_many([{"i": i} for i in range(3)])  # a pipeline's calls
        await observer.function_flush()
        sync = app.sync()
        try:  # the blocking door too
            await asyncio.to_thread(sync.enqueue_by_name, "default", "t")
        finally:
            sync.close()
        ids = [text(x) for x in await observer.lrange(q._keys.ready, 0, -1)]
        assert len(set(ids)) == 5
        assert ids[0] == "one"


async def test_two_releases_libraries_coexist(
    fresh_server: EmbeddedServer, observer: Redis
) -> None:
    # the next release: the same scripts, one changed (here only by a comment)
    scripts = [(n, _lua(n) + ("\n-- next release" if n == "enqueue" else "")) for n in SCRIPTS]
    other = FunctionLibrary([_LIB[p] for p in LIB], scripts)
    assert other.name != LIBRARY.name
    assert other.functions["enqueue"] != LIBRARY.functions["enqueue"]
    await observer.execute_command("FUNCTION", "LOAD", other.source)  # type: ignore[no-untyped-call]
    async with open_app(fresh_server.url) as app:  # this release loads its own beside it
        assert await libraries(observer) == {LIBRARY.name, other.name}
        q = app.queue("mixed")
        await q.enqueue("t", job_id="new")
        # a producer of the other release enqueues on the same queue with its own library
        keys = q._scripts.lanes
        args = [q._keys.base, 1, "t", 3, -1, -1, 0, "", "", "", "", "", 1, "old", b"[[],{}]"]
        fn = other.functions["enqueue"]
        res = await observer.execute_command("FCALL", fn, len(keys), *keys, *args)  # type: ignore[no-untyped-call]
        assert res[1] == 1
        assert [text(x) for x in await observer.lrange(q._keys.ready, 0, -1)] == ["new", "old"]
        # loading a library that is there already is no error
        async with open_app(fresh_server.url):
            pass
        assert await libraries(observer) == {LIBRARY.name, other.name}


async def test_each_call_gets_its_own_keys(app: App, redis: Redis) -> None:
    """The library's functions share its parts' state between calls: the keys each call
    binds first must be its own (two queues, alternating)."""
    a, b = app.queue("fa"), app.queue("fb")
    for i in range(3):
        await a.enqueue("t", job_id=f"a{i}")
        await b.enqueue("t", job_id=f"b{i}", group="g")
    assert [text(x) for x in await redis.lrange(a._keys.ready, 0, -1)] == ["a0", "a1", "a2"]
    assert await redis.llen(b._keys.ready) == 0
    assert (await b.counts())["queued"] == 3
    assert (await a.stats())["enqueued"] == 3
    # keys made from the key base are made again only for a new one (per base): each call
    # on the other queue still writes its own (the events stream, the completed index)
    await a.set_events(100)
    await b.set_events(100)
    for i in range(3):
        await a.enqueue("t", job_id=f"ea{i}")
        await b.enqueue("t", job_id=f"eb{i}")
        await a.enqueue("t", job_id=f"ea{i}x")
    for q, mine in ((a, "ea"), (b, "eb")):
        entries = cast(list[Any], await redis.xrange(q._keys.base + "events"))
        jobs = {text(e[b"j"]) for _, e in entries}
        assert jobs
        assert all(j.startswith(mine) for j in jobs), (q.name, jobs)
    for q, mine in ((b, "b"), (a, "a")):
        [r] = await q.reserve(1)
        await q.complete(r, 1)
        done = [text(x) for x in await redis.zrange(q._keys.base + "completed", 0, -1)]
        assert done == [r.id]
        assert r.id.startswith(mine)


async def test_without_function_load_the_scripts_run_with_evalsha(
    fresh_server: EmbeddedServer, observer: Redis
) -> None:
    user = f"nofn-{uuid4().hex[:8]}"
    rules = ["reset", "on", f">{user}-pw", "~*", "&*", "+@all", "-function"]
    await observer.execute_command("ACL", "SETUSER", user, *rules)  # type: ignore[no-untyped-call]
    url = f"redis://{user}:{user}-pw@127.0.0.1:{fresh_server.port}/0"
    async with App(url, prefix="nofn") as app:
        assert not functions_on(app.redis)
        q = app.queue()
        await q.enqueue("t", job_id="x")
        assert await observer.script_exists(SCRIPTS["enqueue"].sha) == [True]
        await observer.script_flush()
        await q.enqueue("t", job_id="y")  # NOSCRIPT: loaded, run again
        assert [text(x) for x in await observer.lrange(q._keys.ready, 0, -1)] == ["x", "y"]
    assert await libraries(observer) == set()


def test_every_top_level_local_a_function_assigns_is_reset_per_call() -> None:
    """A function library keeps its parts' top-level values from one call to the next, where
    EVALSHA runs each call afresh: a part's top-level local that its functions assign to (a
    cache, a buffer) must be marked ``-- per call`` (or depend on the call) so that the
    library resets it at the start of every call, or one call's state leaks into the next
    (a queue's events switch read by a call on another queue, say)."""
    from aioqueue._store.funclib import _PER_CALL, PER_CALL_MARK

    unmarked = []
    for part in LIB:
        source = _LIB[part]
        for line in source.splitlines():
            m = re.match(r"^local (?!function\b)([A-Za-z_][\w, ]*?)(?: = (.+))?$", line)
            if (
                not m
                or line.endswith(PER_CALL_MARK)
                or (m.group(2) and _PER_CALL.search(m.group(2)))
            ):
                continue
            for name in (n.strip() for n in m.group(1).split(",")):
                # assigned inside a function body (an indented statement), alone or in a list
                target = rf"^\s+(?:[\w.]+\s*,\s*)*{name}\s*(?:,\s*[\w.]+\s*)*=(?!=)"
                if re.search(target, source, re.M):
                    unmarked.append(f"{part}: {name}")
    assert not unmarked, unmarked


def test_no_function_assigns_a_local_made_once_per_key_base() -> None:
    """A part's top-level local made from the key base alone is assigned again only when a
    call's key base differs from the last call's: a function that assigned to it would carry
    its value into the next call on the same queue."""
    from aioqueue._store.funclib import _LOCAL, binding

    per_base, assigned = [], []
    # every part and every script's own file (a script's body runs in its function)
    everything = "\n".join([*_LIB.values(), *(s.own for s in SCRIPTS.values())])
    for part in LIB:
        for line in _LIB[part].splitlines():
            m = _LOCAL.match(line)
            if m is None or binding(line) != "base":
                continue
            for name in (n.strip() for n in m.group(1).split(",")):
                per_base.append(name)
                target = rf"^\s*(?:[\w.]+\s*,\s*)*{name}\s*(?:,\s*[\w.]+\s*)*=(?!=)"
                if re.search(target, everything, re.M):
                    assigned.append(f"{part}: {name}")
    assert "K_EVENTS" in per_base  # (the check sees them)
    assert not assigned, assigned
    source = LIBRARY.source
    bind = source[source.index("local function bind__") : source.index("local function main__")]
    assert "  if BASE ~= base__ then" in bind
    assert bind.index("K_EVENTS = BASE") > bind.index("if BASE ~= base__ then")
