"""A connection of its own for the producer's hot path: the enqueue calls of an App's
coalescers (``_coalesce``) go over one connection held outside the pool while it is free.

Taking a connection from redis-py's blocking pool and giving it back costs a lock, a
readiness check of the socket (a system call) and redis-py's retry and command layers on
every call: measured, about as much as the rest of a one-job enqueue on the client. The
coalescer sends one call at a time per queue, so a held connection is free most of the time;
when it is busy (another queue's call is in flight), a call takes the pool's path as before.

Only enqueue calls use it: they are idempotent on the job id, so a call whose connection
failed is simply sent again by the pool's path (with its retries and its reloading of the
scripts). A connection that failed, timed out or was cancelled mid-call is disconnected
(its reply could still arrive) and connects again on its next use, with ``connect()``, as the
pool connects its own (I11: to the App's endpoint, see ``_sentinel.PrimaryConnection``).

``OrderedLine``: a busy worker's two claims in flight go over one connection of their own, so
that the server runs them in the order the worker takes their replies.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import redis.exceptions as rexc


class HotConnection:
    """One connection of an App's pool class, held for enqueue calls; ``busy`` while one is
    in flight."""

    __slots__ = ("busy", "conn")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.busy = False

    async def call(self, command: Sequence[Any], timeout: float | None) -> Any:
        """Send one command and read its reply (an error reply is raised as redis-py's
        ``ResponseError``, and leaves the connection usable)."""
        self.busy = True
        conn = self.conn
        try:
            async with _kept_in_step(conn), asyncio.timeout(timeout):
                await _send(conn, command)
                return await conn.read_response()
        finally:
            self.busy = False


async def _send(conn: Any, command: Sequence[Any]) -> None:
    if not conn.is_connected:
        # the pool's own way to connect (a Sentinel connection asks for the primary there),
        # never the bare socket a send would open
        await conn.connect()
    await conn.send_command(*command)


@contextlib.asynccontextmanager
async def _kept_in_step(conn: Any) -> AsyncIterator[None]:
    """An error reply leaves the connection usable; any other failure (lost, timed out,
    cancelled mid-call) disconnects it, since its reply could still arrive."""
    try:
        yield
    except rexc.ResponseError:
        raise
    except BaseException:
        await conn.disconnect(nowait=True)
        raise


def _app_pool(client: Any) -> Any:
    """The client's pool if it is an App's (aioqueue's pool class), else None (a cluster
    client, or a client of the user's own: see ``_wire.use_fast_packing``)."""
    pool = getattr(client, "connection_pool", None)
    if pool is None or not hasattr(pool, "aioqueue_timeout"):
        return None
    return pool


def hot_connection(client: Any) -> HotConnection | None:
    """The App's held connection (made on first use), or None for a client that is not an
    App's."""
    pool = _app_pool(client)
    if pool is None:
        return None
    hot: HotConnection | None = getattr(pool, "aioqueue_hot", None)
    if hot is None:
        hot = pool.aioqueue_hot = HotConnection(pool.make_connection())
    return hot


async def close_hot_connection(client: Any) -> None:
    """Close the App's held connection, if it has one (before the App closes its pool)."""
    pool = getattr(client, "connection_pool", None)
    hot: HotConnection | None = getattr(pool, "aioqueue_hot", None)
    if hot is not None:
        pool.aioqueue_hot = None  # type: ignore[union-attr]
        await hot.conn.disconnect()


class OrderedLine:
    """A connection of the App's pool class held by one worker's fetch loop, for claims it
    keeps two of in flight: they are written in the order they are made and their replies
    read in that order, so the server runs them in the order the worker takes their jobs
    (the worker registry numbers a worker's leases in the order the server gives them)."""

    __slots__ = ("conn", "reading", "sending")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.sending = asyncio.Lock()  # FIFO: writes in the order the calls were made
        self.reading: asyncio.Future[None] | None = None  # the reply read before ours

    async def call(self, command: Sequence[Any], timeout: float | None) -> Any:
        """Send one command behind those sent before it, and read its reply after theirs
        (an error reply is raised as redis-py's ``ResponseError``; any other failure
        disconnects, and the calls behind it fail as well)."""
        conn = self.conn
        turn = asyncio.get_running_loop().create_future()
        try:
            async with _kept_in_step(conn):
                async with self.sending:
                    async with asyncio.timeout(timeout):
                        await _send(conn, command)
                    before, self.reading = self.reading, turn
                if before is not None:
                    await asyncio.shield(before)
                async with asyncio.timeout(timeout):
                    return await conn.read_response()
        finally:
            if not turn.done():
                turn.set_result(None)

    async def close(self) -> None:
        await self.conn.disconnect()


def ordered_line(client: Any) -> OrderedLine | None:
    """A new ordered line on the App's pool class, or None for a client that is not an
    App's."""
    pool = _app_pool(client)
    return None if pool is None else OrderedLine(pool.make_connection())
