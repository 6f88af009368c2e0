"""The Lua scripts: each file carries its contract, and every operation survives the server
forgetting the scripts (SCRIPT FLUSH, or a failover to a server that never saw them)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from importlib import resources

import pytest
from redis.asyncio import Redis

from aioqueue import App, JobStatus
from aioqueue._embedded import EmbeddedServer
from aioqueue._scripts import SCRIPTS

from .helpers import wait_until
from .store_checks import check_invariants, open_app, server_ms, text

LUA = resources.files("aioqueue").joinpath("lua")
SCRIPT_FILES = sorted(
    p.name[: -len(".lua")] for p in LUA.iterdir() if p.name.endswith(".lua") and p.name[0] != "_"
)
HEADER = re.compile(r"\A--\[\[ (?P<name>[a-z_]+): (?P<body>.*?)\]\]", re.DOTALL)


def read_lua(name: str) -> str:
    return LUA.joinpath(f"{name}.lua").read_text("utf-8")


def test_every_script_file_is_registered_and_every_registered_script_has_a_file() -> None:
    assert SCRIPT_FILES, "no Lua scripts found"
    assert set(SCRIPT_FILES) == set(SCRIPTS)


@pytest.mark.parametrize("name", ["_lib", *SCRIPT_FILES])
def test_each_lua_file_starts_with_its_contract(name: str) -> None:
    source = read_lua(name)
    header = HEADER.match(source)
    assert header is not None, f"{name}.lua does not start with a --[[ {name}: ... ]] header"
    assert header["name"] == name
    doc = header["body"]
    assert "KEYS[" in doc
    assert "ARGV[" in doc
    if name.startswith("_"):
        return
    assert "Returns" in doc, f"{name}.lua does not document what it returns"

    body = source[header.end() :]
    documented_keys: set[int] = set()
    for first, last in re.findall(r"KEYS\[(\d+)(?:\.\.(\d+))?\]", doc):
        documented_keys.update(range(int(first), int(last or first) + 1))
    used_keys = {int(i) for i in re.findall(r"KEYS\[(\d+)\]", body)}
    assert used_keys <= documented_keys, f"{name}.lua uses undocumented KEYS {used_keys}"
    documented_argv = {int(i) for i in re.findall(r"ARGV\[(\d+)\]", doc)}
    open_ended = [int(i) for i in re.findall(r"ARGV\[(\d+)\.\.\]", doc)]  # "ARGV[10..]"
    used_argv = {int(i) for i in re.findall(r"ARGV\[(\d+)\]", body)}
    undocumented = {
        i for i in used_argv - documented_argv if not any(i >= start for start in open_ended)
    }
    assert not undocumented, f"{name}.lua uses undocumented ARGV {sorted(undocumented)}"


@pytest.mark.parametrize("name", ["_lib", *SCRIPT_FILES])
def test_scripts_touch_no_key_they_were_not_given(name: str) -> None:
    """Every key is a KEYS entry or built from the queue's key base (ARGV[1], same hash tag):
    no command's first argument is a literal key name, and no global server state is used."""
    source = read_lua(name)
    assert not re.search(r"redis\.p?call\(\s*'[A-Za-z]+'\s*,\s*'", source), (
        f"{name}.lua names a key literally"
    )
    for forbidden in ("'KEYS'", "'FUNCTION'", "'SCAN'", "'FLUSHALL'", "'SELECT'"):
        assert forbidden not in source.upper(), f"{name}.lua uses {forbidden}"


async def test_the_sha_of_each_script_is_what_the_server_computes(redis: Redis) -> None:
    for name, script in SCRIPTS.items():
        assert await redis.script_load(script.source) == script.sha, name


# ---------------------------------------------------------------------------- NOSCRIPT


@pytest.fixture
async def private_app(fresh_server: EmbeddedServer) -> AsyncIterator[tuple[App, Redis]]:
    """An App and a raw client on a private server: SCRIPT FLUSH must not disturb the other
    tests running against the shared one."""
    observer = Redis.from_url(fresh_server.url)
    try:
        async with open_app(fresh_server.url, lease=0.2) as app:
            yield app, observer
    finally:
        await observer.aclose()


async def test_every_operation_works_after_script_flush(private_app: tuple[App, Redis]) -> None:
    app, observer = private_app
    q = app.queue()

    async def flushed() -> None:
        await observer.script_flush()
        assert not any(await observer.script_exists(*(s.sha for s in SCRIPTS.values())))

    async def reloaded(name: str) -> bool:
        return (await observer.script_exists(SCRIPTS[name].sha)) == [True]

    @app.task
    async def add(x: int, y: int) -> int:
        return x + y

    # once with the scripts loaded, then each operation right after a flush
    first = await add.enqueue(1, 2)
    (r,) = await q.reserve()
    await q.complete(r, 3)
    assert await first.result(timeout=5) == 3

    await flushed()
    one = await add.enqueue(2, 3)
    assert await reloaded("enqueue")
    await flushed()
    assert await one.status() is JobStatus.QUEUED
    assert await reloaded("watch")

    await flushed()
    many = await add.enqueue_many([((i, i), {}) for i in range(1200)])  # pipelined script calls
    ready = [text(m) for m in await observer.lrange(q._keys.ready, 0, -1)]
    assert ready == [one.id] + [j.id for j in many]  # each once, in order

    await flushed()
    got = await q.reserve(3)
    assert await reloaded("claim")
    assert [x.id for x in got] == [one.id, many[0].id, many[1].id]
    a, b, c = got

    await flushed()
    await q.complete(a, 5)
    assert await reloaded("complete")
    await flushed()
    assert await one.result(timeout=5) == 5  # watch again, and the result listener

    await flushed()
    await q.extend(b, lease=30)
    assert await reloaded("extend")
    await flushed()
    assert await q.fail(b, "retry me", delay=0.05) is True
    assert await reloaded("fail")
    await flushed()
    await q.release(c, delay=0)
    assert await reloaded("release")

    await flushed()
    (again,) = await q.reserve(wait=5)
    assert again.id == c.id  # released to the front of the queue
    due = int(await observer.hget(q._keys.job(b.id), "due") or 0)
    await wait_until(lambda: _server_at(observer, due), what="the retry to fall due")

    await flushed()
    assert (await q.reap())["promoted"] == 1  # the retried job
    assert await reloaded("reap")
    assert await q.job(b.id).status() is JobStatus.QUEUED
    await check_invariants(observer, q._keys)


async def _server_at(redis: Redis, ms: int) -> bool:
    return await server_ms(redis) >= ms
