"""Connections of their own for the hot paths: the enqueue calls of an App's coalescers
(``HotConnection``) and a busy worker's two claims in flight (``OrderedLine``), each held
outside the pool, with redis-py's read path taken out of the round trip.

Taking a connection from redis-py's blocking pool and giving it back costs a lock, a
readiness check of the socket (a system call) and redis-py's retry and command layers on
every call: measured, about as much as the rest of a one-job enqueue on the client. The
coalescer sends one call at a time per queue, so a held connection is free most of the time;
when it is busy (another queue's call is in flight), a call takes the pool's path as before.

**The wire** (``_Wire``). A held connection connects as the pool connects its own, with
redis-py's ``connect()`` (its handshake, AUTH, TLS, and for Sentinel the primary asked for
there: I11, see ``_sentinel.PrimaryConnection``); then its transport is taken over from
redis-py's stream: a call writes its packed command to the transport and waits on a future,
and the replies are parsed as their bytes arrive (hiredis, configured as redis-py's own
parser) and handed to the futures in the order the calls were written. redis-py's read path
(its stream reader, its parser's layers, its timeout scopes) cost about half of a one-job
enqueue's client CPU (measured: 120 against 62 µs a round trip under asyncio's loop). It
relies on redis-py internals, which ``_wire.FastPack`` reads for it (checked by
tests/test_hot.py); a connection whose replies hiredis does not parse is not held, and its
calls take the pool's path.

Only enqueue calls use the held connection: they are idempotent on the job id, so a call
whose connection failed is simply sent again by the pool's path (with its retries and its
reloading of the scripts). A connection that failed, timed out or was cancelled mid-call is
disconnected (its reply could still arrive) and connects again on its next use.

``OrderedLine``: a busy worker's two claims in flight go over one connection of their own, so
that the server runs them in the order the worker takes their replies.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence
from typing import Any, Literal

import hiredis
import redis.exceptions as rexc

from .wire import FastPack

#: hiredis's answer while a reply is not complete (a reply of its own can be False: RESP3)
_NOT_YET: Any = object()


class _Wire(asyncio.Protocol):
    """A connected redis-py connection's transport, taken over from its stream: ``send``
    writes a command and returns the future its reply is set on, in the order of the
    sends. The stream's own protocol still hears of the connection's end, so redis-py's
    ``disconnect`` works as before."""

    def __init__(self, conn: FastPack) -> None:
        self.transport: asyncio.Transport = conn.wire_transport()
        self.inner: asyncio.BaseProtocol = self.transport.get_protocol()
        self.reader = hiredis.Reader(notEnoughData=_NOT_YET, **conn.reader_options())
        self.waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.lost = False
        self.transport.set_protocol(self)

    def send(self, chunks: Sequence[bytes]) -> asyncio.Future[Any]:
        if self.lost or self.transport.is_closing():  # (a closing transport drops writes)
            raise rexc.ConnectionError("Connection closed by server.")
        reply = asyncio.get_running_loop().create_future()
        self.waiting.append(reply)
        self.transport.writelines(chunks)
        return reply

    def data_received(self, data: bytes) -> None:
        reader, waiting = self.reader, self.waiting
        try:
            reader.feed(data)
            while (reply := reader.gets()) is not _NOT_YET:
                waiter = waiting.popleft()  # (none left: a reply nobody asked for, below)
                if not waiter.done():  # (a call that timed out or was cancelled)
                    waiter.set_result(reply)
        except Exception as exc:  # garbage on the wire, or a reply nobody asked for
            self._fail(rexc.InvalidResponse(f"unexpected reply from the server: {exc!r}"))
            self.transport.abort()

    def eof_received(self) -> bool:
        self._fail(rexc.ConnectionError("Connection closed by server."))
        self.inner.eof_received()  # type: ignore[attr-defined]
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(rexc.ConnectionError("Connection closed by server."))
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def _fail(self, exc: Exception) -> None:
        self.lost = True
        while self.waiting:
            waiter = self.waiting.popleft()
            if not waiter.done():
                waiter.set_exception(exc)


class _Held:
    """One connection of an App's pool class, held outside the pool, over its wire."""

    __slots__ = ("conn", "wire")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.wire: _Wire | None = None

    async def _send(self, command: Sequence[Any], timeout: float | None) -> asyncio.Future[Any]:
        """Write one command on the wire (connected first if it is not, within ``timeout``:
        the pool's own way to connect, so a Sentinel connection asks for the primary there,
        never the bare socket a send would open); the future its reply is set on. Any
        failure (or a cancellation) on the way disconnects it."""
        wire, conn = self.wire, self.conn
        try:
            if wire is None or wire.lost or not conn.is_connected:
                self.wire = None
                async with asyncio.timeout(timeout):
                    if wire is not None or conn.is_connected:
                        # the server closed it, or it was never ours: redis-py has not heard
                        await conn.disconnect(nowait=True)
                    await conn.connect()
                wire = self.wire = _Wire(conn)
            return wire.send(conn.pack_command(*command))
        except BaseException:
            await self._drop()
            raise

    async def _reply(self, reply: asyncio.Future[Any], timeout: float | None) -> Any:
        """Wait for a reply: an error reply is raised as redis-py's ``ResponseError`` and
        keeps the connection (one redis-py reads as a connection's failure, such as
        ``LOADING``, is raised as that and disconnects it, as redis-py's read path does); a
        timeout or a cancellation disconnects it, since its reply could still arrive."""
        try:
            if timeout is None:
                answer = await reply
            else:
                async with asyncio.timeout(timeout):
                    answer = await reply
        except BaseException:
            await self._drop()
            raise
        if isinstance(answer, Exception):  # an error reply, as redis-py's parser made it
            if not isinstance(answer, rexc.ResponseError):  # LOADING, MASTERDOWN...: as lost
                await self._drop()
            raise answer
        return answer

    async def _drop(self) -> None:
        self.wire = None
        await self.conn.disconnect(nowait=True)

    async def close(self) -> None:
        self.wire = None
        await self.conn.disconnect()


class HotConnection(_Held):
    """One connection of an App's pool class, held for enqueue calls; ``busy`` while one is
    in flight."""

    __slots__ = ("busy",)

    def __init__(self, conn: Any) -> None:
        super().__init__(conn)
        self.busy = False

    async def call(self, command: Sequence[Any], timeout: float | None) -> Any:
        """Send one command and read its reply (an error reply is raised as redis-py's
        ``ResponseError``, and leaves the connection usable)."""
        self.busy = True
        try:
            return await self._reply(await self._send(command, timeout), timeout)
        finally:
            self.busy = False


def _app_pool(client: Any) -> Any:
    """The client's pool if it is an App's (aioqueue's pool class), else None (a cluster
    client, or a client of the user's own: see ``_wire.use_fast_packing``)."""
    pool = getattr(client, "connection_pool", None)
    if pool is None or not hasattr(pool, "aioqueue_timeout"):
        return None
    return pool


def _held_conn(pool: Any) -> Any:
    """A new connection of the App's pool class whose wire can be taken over, or None."""
    conn = pool.make_connection()
    return conn if isinstance(conn, FastPack) and conn.reads_with_hiredis() else None


def hot_connection(client: Any) -> HotConnection | None:
    """The App's held connection (made on first use), or None for a client that is not an
    App's (or whose connections' replies cannot be read off their wire)."""
    pool = _app_pool(client)
    if pool is None:
        return None
    hot: HotConnection | Literal[False] | None = getattr(pool, "aioqueue_hot", None)
    if hot is None:
        conn = _held_conn(pool)
        hot = pool.aioqueue_hot = HotConnection(conn) if conn is not None else False
    return hot or None


async def close_hot_connection(client: Any) -> None:
    """Close the App's held connection, if it has one (before the App closes its pool)."""
    pool = getattr(client, "connection_pool", None)
    hot: HotConnection | Literal[False] | None = getattr(pool, "aioqueue_hot", None)
    if hot is not None:
        pool.aioqueue_hot = None  # type: ignore[union-attr]
        if hot:
            await hot.close()


class OrderedLine(_Held):
    """A connection of the App's pool class held by one worker's fetch loop, for claims it
    keeps two of in flight: they are written in the order they are made and their replies
    read in that order, so the server runs them in the order the worker takes their jobs
    (the worker registry numbers a worker's leases in the order the server gives them)."""

    __slots__ = ("connecting",)

    def __init__(self, conn: Any) -> None:
        super().__init__(conn)
        self.connecting = asyncio.Lock()  # FIFO: a call behind one that connects waits

    async def call(self, command: Sequence[Any], timeout: float | None) -> Any:
        """Send one command behind those sent before it, and read its reply after theirs
        (an error reply is raised as redis-py's ``ResponseError``; any other failure
        disconnects, and the calls behind it fail as well)."""
        async with self.connecting:
            reply = await self._send(command, timeout)
        return await self._reply(reply, timeout)


def ordered_line(client: Any) -> OrderedLine | None:
    """A new ordered line on the App's pool class, or None for a client that is not an
    App's (or whose connections' replies cannot be read off their wire)."""
    pool = _app_pool(client)
    conn = None if pool is None else _held_conn(pool)
    return None if conn is None else OrderedLine(conn)
