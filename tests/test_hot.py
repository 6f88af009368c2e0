"""The App's held connection for enqueue calls (_hot.py): used while free, replaced when it
fails (the call then goes through the pool), closed with the App."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from aioqueue import App, Queue
from aioqueue._store.embedded import EmbeddedServer
from aioqueue._store.hot import HotConnection, hot_connection

from .support.apps import open_app
from .support.server import text
from .support.waiting import wait_until


def local_port(conn: object) -> int:
    writer = getattr(conn, "_writer", None)
    assert writer is not None, "not connected"
    return int(writer.get_extra_info("sockname")[1])


async def held_after_an_enqueue(app: App) -> tuple[Queue, HotConnection, int]:
    """The App's default queue after an enqueue of job "a", its held connection, and that
    connection's local port."""
    q = app.queue()
    await q.enqueue("t", job_id="a")
    hot = hot_connection(app.redis)
    assert hot is not None
    return q, hot, local_port(hot.conn)


async def kill(admin: Redis, port: int) -> None:
    await admin.execute_command("CLIENT", "KILL", "ADDR", f"127.0.0.1:{port}")  # type: ignore[no-untyped-call]


async def ready_ids(admin: Redis, q: Queue) -> list[str]:
    return [text(x) for x in await admin.lrange(q._keys.ready, 0, -1)]


async def test_enqueues_use_the_held_connection_and_the_app_closes_it(
    fresh_server: EmbeddedServer,
) -> None:
    admin = Redis.from_url(fresh_server.url)
    try:
        async with open_app(fresh_server.url) as app:
            q = app.queue()
            await q.enqueue("t", job_id="a")
            hot = hot_connection(app.redis)
            assert hot is not None
            assert hot.conn.is_connected
            port = local_port(hot.conn)
            clients = {int(c["addr"].rsplit(":", 1)[1]): c for c in await admin.client_list()}
            assert clients[port]["cmd"] == "fcall"  # the enqueue went over it
        assert not hot.conn.is_connected  # closed with the App

        async def server_saw_it_go() -> bool:  # the server drops it once it reads the close
            return all(int(c["addr"].rsplit(":", 1)[1]) != port for c in await admin.client_list())

        await wait_until(server_saw_it_go, timeout=10, what="the server to drop the connection")
    finally:
        await admin.aclose()


async def test_a_killed_held_connection_loses_no_enqueue(fresh_server: EmbeddedServer) -> None:
    admin = Redis.from_url(fresh_server.url)
    try:
        async with open_app(fresh_server.url) as app:
            q, hot, port = await held_after_an_enqueue(app)
            await kill(admin, port)
            await q.enqueue("t", job_id="b")  # its connection is dead: sent again by the pool
            await q.enqueue("t", job_id="c")  # and the held one connects again
            assert hot.conn.is_connected
            assert local_port(hot.conn) != port
            assert await ready_ids(admin, q) == ["a", "b", "c"]
    finally:
        await admin.aclose()


async def test_while_it_is_busy_other_queues_use_the_pool(app: App, redis: Redis) -> None:
    queues = [app.queue(f"h{i}") for i in range(5)]
    jobs = await asyncio.gather(
        *(q.enqueue("t", job_id=f"{q.name}-{i}") for q in queues for i in range(20))
    )
    assert len({j.id for j in jobs}) == 100
    for q in queues:
        assert await redis.llen(q._keys.ready) == 20
    hot = hot_connection(app.redis)
    assert hot is not None
    assert not hot.busy


async def test_the_held_connection_reads_its_replies_off_the_wire(app: App, redis: Redis) -> None:
    """Its transport is taken over from redis-py's stream (``_Wire``): replies are parsed as
    they arrive and handed over in the order of the calls; an error reply is raised and
    keeps the connection; a call that times out disconnects it, and the next connects again
    (the redis-py internals this relies on are checked here: a redis-py upgrade that moves
    them fails this test, not a user's enqueue)."""
    import redis.exceptions as rexc

    q = app.queue()
    await q.enqueue("t", job_id="a")
    hot = hot_connection(app.redis)
    assert hot is not None
    wire = hot.wire
    assert wire is not None
    assert not wire.lost
    assert wire.transport.get_protocol() is wire
    key = f"{app.prefix}:wire-test"
    await redis.set(key, "not a number")
    with pytest.raises(rexc.ResponseError, match="not an integer"):
        await hot.call(("INCR", key), 10.0)
    assert hot.wire is wire  # the connection is kept
    assert await hot.call(("GET", key), 10.0) == b"not a number"
    big = b"x" * 300_000  # a reply read in many pieces
    await redis.set(key, big)
    assert await hot.call(("GET", key), 10.0) == big
    port = local_port(hot.conn)
    blocked = f"{app.prefix}:wire-empty"
    with pytest.raises(TimeoutError):
        await hot.call(("BLPOP", blocked, "5"), 0.1)
    assert hot.wire is None  # its reply could still come: disconnected
    assert not hot.conn.is_connected
    await q.enqueue("t", job_id="b")
    assert hot.wire is not None
    assert hot.wire is not wire
    assert local_port(hot.conn) != port
    assert await redis.llen(q._keys.ready) == 2


async def test_connections_whose_replies_cannot_be_read_off_the_wire_are_not_held(
    fresh_server: EmbeddedServer,
) -> None:
    """A pool whose connections parse with redis-py's pure-Python parser (not hiredis's): no
    held connection and no ordered line; enqueues go through the pool."""
    from redis._parsers import _AsyncRESP2Parser

    from aioqueue._store.hot import ordered_line

    admin = Redis.from_url(fresh_server.url)
    try:
        async with open_app(fresh_server.url) as app:
            app.redis.connection_pool.connection_kwargs["parser_class"] = _AsyncRESP2Parser
            assert hot_connection(app.redis) is None
            assert ordered_line(app.redis) is None
            q = app.queue()
            await q.enqueue("t", job_id="a")
            await q.enqueue("t", job_id="b")
            ids = [text(x) for x in await admin.lrange(q._keys.ready, 0, -1)]
            assert ids == ["a", "b"]
    finally:
        await admin.aclose()


async def test_a_call_in_flight_fails_when_the_server_closes_the_connection(
    fresh_server: EmbeddedServer,
) -> None:
    """The server closing the held connection fails the call waiting on it at once (a
    ``ConnectionError``, not its timeout), and the next call connects again."""
    import redis.exceptions as rexc

    admin = Redis.from_url(fresh_server.url)
    try:
        async with open_app(fresh_server.url) as app:
            q, hot, port = await held_after_an_enqueue(app)
            key = f"{app.prefix}:wire-blocked"
            waiting = asyncio.ensure_future(hot.call(("BLPOP", key, "0"), None))

            async def blocked() -> bool:
                clients = {int(c["addr"].rsplit(":", 1)[1]): c for c in await admin.client_list()}
                return port in clients and clients[port]["cmd"] == "blpop"

            await wait_until(blocked, timeout=10, what="the held connection to block")
            await kill(admin, port)
            with pytest.raises(rexc.ConnectionError):
                await asyncio.wait_for(waiting, 30)
            assert hot.wire is None  # dropped: the next call connects again
            await q.enqueue("t", job_id="b")
            assert local_port(hot.conn) != port
            assert await ready_ids(admin, q) == ["a", "b"]
    finally:
        await admin.aclose()
