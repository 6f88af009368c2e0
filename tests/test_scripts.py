"""The Lua scripts: each file carries its contract, and every operation survives the server
forgetting the scripts (SCRIPT FLUSH, or a failover to a server that never saw them)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from importlib import resources

import pytest
from redis.asyncio import Redis

from aioqueue import App, JobState
from aioqueue._model import limits as _limits
from aioqueue._store.embedded import EmbeddedServer
from aioqueue._store.loader import LIB, LIBRARY, SCRIPTS
from aioqueue._store.wire import functions_on, use_functions

from .support.apps import open_app
from .support.invariants import check_invariants
from .support.server import server_ms, text
from .support.waiting import wait_until

LUA = resources.files("aioqueue._store").joinpath("lua")
SCRIPT_FILES = sorted(
    p.name[: -len(".lua")] for p in LUA.iterdir() if p.name.endswith(".lua") and p.name[0] != "_"
)
LIB_FILES = sorted(
    p.name[: -len(".lua")] for p in LUA.joinpath("lib").iterdir() if p.name.endswith(".lua")
)
HEADER = re.compile(r"\A--\[\[ (?P<name>[a-z_]+): (?P<body>.*?)\]\]", re.DOTALL)


def read_lua(name: str) -> str:
    return LUA.joinpath(f"{name}.lua").read_text("utf-8")


def test_every_script_file_is_registered_and_every_registered_script_has_a_file() -> None:
    assert SCRIPT_FILES, "no Lua scripts found"
    assert set(SCRIPT_FILES) == set(SCRIPTS)


def test_every_library_file_is_in_the_library_order_once() -> None:
    assert sorted(LIB) == LIB_FILES
    assert LIB[0] == "core"


@pytest.mark.parametrize("name", [*(f"lib/{part}" for part in LIB), *SCRIPT_FILES])
def test_each_lua_file_starts_with_its_contract(name: str) -> None:
    source = read_lua(name)
    header = HEADER.match(source)
    stem = name.removeprefix("lib/")
    assert header is not None, f"{name}.lua does not start with a --[[ {stem}: ... ]] header"
    assert header["name"] == stem
    doc = header["body"]
    if name.startswith("lib/"):
        # a library part says what it holds and what it needs (checked below); core documents
        # the KEYS and ARGV[1] every script shares
        assert re.search(r"^  Needs: ", doc, re.MULTILINE), f"{name}.lua does not say what it needs"
        if stem == "core":
            assert "KEYS[" in doc
            assert "ARGV[" in doc
        return
    assert "KEYS[" in doc
    assert "ARGV[" in doc
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


def test_the_library_uses_only_the_keys_and_arguments_core_documents() -> None:
    for part in LIB:
        source = read_lua(f"lib/{part}")
        body = source[HEADER.match(source).end() :]  # type: ignore[union-attr]
        assert {int(i) for i in re.findall(r"KEYS\[(\d+)\]", body)} <= set(range(1, 14)), part
        assert {int(i) for i in re.findall(r"ARGV\[(\d+)\]", body)} <= {1}, part


@pytest.mark.parametrize("name", [*(f"lib/{part}" for part in LIB), *SCRIPT_FILES])
def test_scripts_touch_no_key_they_were_not_given(name: str) -> None:
    """Every key is a KEYS entry or built from the queue's key base (ARGV[1], same hash tag):
    no command's first argument is a literal key name, and no global server state is used."""
    source = read_lua(name)
    assert not re.search(r"redis\.p?call\(\s*'[A-Za-z]+'\s*,\s*'", source), (
        f"{name}.lua names a key literally"
    )
    for forbidden in ("'KEYS'", "'FUNCTION'", "'SCAN'", "'FLUSHALL'", "'SELECT'"):
        assert forbidden not in source.upper(), f"{name}.lua uses {forbidden}"


# ---------------------------------------------------------------------------- library parts


def _code(source: str) -> str:
    """Lua source without its comments and the contents of its strings."""
    source = re.sub(r"--\[\[.*?\]\]", "", source, flags=re.DOTALL)
    source = re.sub(r"--[^\n]*", "", source)
    return re.sub(r"'(?:\\.|[^'\\])*'", "''", source)


def _defined(code: str) -> set[str]:
    """The names a Lua file defines at its top level (unindented ``local`` lines)."""
    names = set(re.findall(r"^local function (\w+)", code, re.MULTILINE))
    # a forward declaration (``local f``, assigned below)
    names.update(re.findall(r"^local (\w+)[ \t]*$", code, re.MULTILINE))
    for group in re.findall(r"^local ([\w, ]+?) =", code, re.MULTILINE):
        names.update(n.strip() for n in group.split(","))
    return names


def _used(code: str) -> set[str]:
    """The names a Lua file refers to (fields after ``.`` and ``:`` are not names)."""
    return set(re.findall(r"(?<![.:\w])[A-Za-z_]\w*", code))


PART_CODE = {part: _code(read_lua(f"lib/{part}")) for part in LIB}
DEFINED_BY = {name: part for part in LIB for name in _defined(PART_CODE[part])}


def _parts_used(code: str, own: str | None = None) -> set[str]:
    """The library parts whose names this code uses (other than its own part's)."""
    return {DEFINED_BY[n] for n in _used(code) if n in DEFINED_BY} - {own}


#: a function one part declares ahead (``local f``) and a later part defines (``f = function``):
#: a script with the first part needs the second too (lib/batches' deps_outcome, lib/deps)
ASSIGNED_BY = {
    name: part
    for part in LIB
    for name in re.findall(r"^(\w+) = function", PART_CODE[part], re.MULTILINE)
}


def _completions(part: str) -> set[str]:
    """The later parts that define what ``part`` declares ahead."""
    return {ASSIGNED_BY[n] for n in _defined(PART_CODE[part]) if n in ASSIGNED_BY} - {part}


def _with_needs(parts: set[str]) -> tuple[str, ...]:
    """These parts and every part they need, in library order."""
    todo, found = list(parts), set(parts)
    while todo:
        this = todo.pop()
        for part in _parts_used(PART_CODE[this]) | _completions(this):
            if part not in found:
                found.add(part)
                todo.append(part)
    return tuple(part for part in LIB if part in found)


def test_no_library_part_defines_a_name_another_defines() -> None:
    seen: dict[str, str] = {}
    for part in LIB:
        for name in _defined(PART_CODE[part]):
            assert name not in seen, f"{name} is defined in {seen[name]} and in {part}"
            seen[name] = part


@pytest.mark.parametrize("part", LIB)
def test_each_library_part_needs_only_earlier_parts_and_says_which(part: str) -> None:
    header = HEADER.match(read_lua(f"lib/{part}"))
    assert header is not None
    # "Needs: core, lanes (push_ready, ...), ..." up to the sentence's full stop
    needs_line = re.search(r"^  Needs: (.*?)\.(?:\s|$)", header["body"], re.MULTILINE | re.DOTALL)
    assert needs_line is not None
    said = {word for word in re.findall(r"\w+", needs_line[1]) if word in LIB}
    used = _parts_used(PART_CODE[part], own=part)
    earlier = set(LIB[: LIB.index(part)])
    assert used <= earlier, f"{part} uses later parts {sorted(used - earlier)}"
    assert said == used, f"{part} says it needs {sorted(said)} but uses {sorted(used)}"


@pytest.mark.parametrize("name", SCRIPT_FILES)
def test_each_script_gets_exactly_the_library_parts_it_uses(name: str) -> None:
    """Enough for it to run, and no more: every part prepended costs each call the definition
    of that part's functions."""
    needed = _with_needs(_parts_used(_code(read_lua(name))))
    assert SCRIPTS[name].parts == needed


def test_the_limits_shared_with_python_agree() -> None:
    """lua/lib/core.lua's block of shared limits and aioqueue/_model/limits.py: the same names with
    the same values."""
    core = read_lua("lib/core")
    block = core[core.index("-- Limits shared with Python") :].split("\n\n", 1)[0]
    in_lua = {
        name: int(value)
        for name, value in re.findall(r"^local (\w+) = (-?\d+)$", block, re.MULTILINE)
    }
    in_python = {name: value for name, value in vars(_limits).items() if name.isupper()}
    assert in_lua, "no shared limits found in lib/core.lua"
    assert in_lua == in_python


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


async def _library_loaded(redis: Redis) -> bool:
    found = await redis.execute_command("FUNCTION", "LIST", "LIBRARYNAME", LIBRARY.name)  # type: ignore[no-untyped-call]
    return bool(found)  # (the pattern has no wildcard: this library, or none)


@pytest.mark.parametrize("mode", ["functions", "scripts"])
async def test_every_operation_works_after_script_flush(
    private_app: tuple[App, Redis], mode: str
) -> None:
    """FCALL after FUNCTION FLUSH ("function not found"), and EVALSHA after SCRIPT FLUSH
    (NOSCRIPT, the calls of a server without functions): each call loads and runs again."""
    app, observer = private_app
    q = app.queue()
    assert functions_on(app.redis)  # the embedded Valkey has functions
    if mode == "scripts":
        use_functions(app.redis, False)

    async def flushed() -> None:
        if mode == "functions":
            await observer.function_flush()
            assert not await _library_loaded(observer)
            return
        await observer.script_flush()
        assert not any(await observer.script_exists(*(s.sha for s in SCRIPTS.values())))

    async def reloaded(name: str) -> bool:
        if mode == "functions":
            return await _library_loaded(observer)
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
    assert await one.state() is JobState.QUEUED
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
    # (a delay long enough that the reserve below cannot promote it on a busy machine)
    assert await q.fail(b, "retry me", delay=1.0) is True
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
    assert await q.job(b.id).state() is JobState.QUEUED
    await check_invariants(observer, q._keys)


async def _server_at(redis: Redis, ms: int) -> bool:
    return await server_ms(redis) >= ms
