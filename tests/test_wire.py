"""The wire-level packing of script calls (aioqueue/_store/wire.py) depends on redis-py internals:
these tests fail loudly when a redis-py release changes them."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection, UnixDomainSocketConnection

from aioqueue import App
from aioqueue._model.keys import QueueKeys
from aioqueue._store.loader import SCRIPTS
from aioqueue._store.scripts import QueueScripts
from aioqueue._store.wire import FastPack, evalsha_command, use_fast_packing, use_functions


def test_the_connection_hooks_we_rely_on_still_exist() -> None:
    pool = aioredis.BlockingConnectionPool.from_url("redis://localhost:1/0")
    assert issubclass(pool.connection_class, Connection)
    for cls in (Connection, UnixDomainSocketConnection):
        params = list(inspect.signature(cls.pack_command).parameters.values())
        assert [p.kind for p in params[1:]] == [inspect.Parameter.VAR_POSITIONAL]
    # FastPack encodes arguments of other types with the connection's own encoder
    assert hasattr(pool.connection_class(**pool.connection_kwargs), "encoder")


@pytest.mark.parametrize("command", ["FCALL", "EVALSHA"])
def test_a_spliced_script_call_packs_to_the_same_bytes_as_redis_py(command: str) -> None:
    client = aioredis.Redis.from_url("redis://localhost:1/0")
    plain_pool = client.connection_pool
    plain = plain_pool.connection_class(**plain_pool.connection_kwargs)
    use_fast_packing(client, 5.0)
    use_functions(client, command == "FCALL")
    pool = client.connection_pool
    assert issubclass(pool.connection_class, FastPack)
    fast = pool.connection_class(**pool.connection_kwargs)
    keys = QueueKeys("aq", "wire")
    lanes = keys.lanes()
    args: list[Any] = [keys.base, 7, "w:1", b"\x00payload\xff", 2.5, -1, ""]
    script = SCRIPTS["claim"]
    command_args = evalsha_command(client, script, lanes, args)
    assert command_args[0] == command
    assert type(command_args[0]) is not str  # the pre-packed head
    target = script.function if command == "FCALL" else script.sha
    expected = plain.pack_command(command, target, len(lanes), *lanes, *args)
    assert b"".join(fast.pack_command(*command_args)) == b"".join(expected)
    # any other command is packed by redis-py itself
    assert fast.pack_command("GET", "k") == plain.pack_command("GET", "k")


async def test_script_calls_run_on_fast_connections(app: App) -> None:
    assert issubclass(app.redis.connection_pool.connection_class, FastPack)
    scripts = QueueScripts(app.redis, QueueKeys(app.prefix, "wire"))
    res = await scripts.claim(1, 1000, 0)
    assert res.jobs == []
    assert res.now_ms > 0


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["c", "id1", "3-ab", b"null", 86_400_000, "", "é"], id="text-bytes-ints"),
        pytest.param(["adds"] + [f"step-{i}" for i in range(20_000)], id="large"),
        pytest.param(["e", 2.5, -7, b"\x00\xff"], id="float"),
    ],
)
def test_every_kind_of_arguments_packs_to_the_same_bytes_as_redis_py(args: list[Any]) -> None:
    """Text, bytes and integers are packed by hiredis (a large call's body is not copied:
    a memoryview), anything else by the loop with the connection's encoder: the bytes on
    the wire are redis-py's own either way."""
    client = aioredis.Redis.from_url("redis://localhost:1/0")
    plain_pool = client.connection_pool
    plain = plain_pool.connection_class(**plain_pool.connection_kwargs)
    use_fast_packing(client, 5.0)
    use_functions(client, True)
    pool = client.connection_pool
    fast = pool.connection_class(**pool.connection_kwargs)
    keys = QueueKeys("aq", "wire")
    script = SCRIPTS["deps"]
    command_args = evalsha_command(client, script, keys.lanes(), [keys.base, *args])
    lanes = keys.lanes()
    expected = plain.pack_command("FCALL", script.function, len(lanes), *lanes, keys.base, *args)
    got = fast.pack_command(*command_args)
    assert b"".join(bytes(chunk) for chunk in got) == b"".join(expected)
    if len(args) > 1000:
        assert isinstance(got[-1], memoryview)
