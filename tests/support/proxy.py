"""``ReplyDropProxy``: a TCP proxy in front of the real server that, once armed, lets a
command through but loses its reply, as a network failure after the server executed it would."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

import pytest


class ReplyDropProxy:
    """A TCP proxy to a real server that can lose one reply.

    ``arm(marker)``: the next request containing ``marker`` goes through to the server and
    runs there, but its reply never reaches the client: the proxy cuts the client's
    connection instead. Everything else is forwarded untouched.
    ``mute()``: from then on no reply reaches any client, and no connection is closed (a
    server, or a network, that silently stops answering).
    """

    def __init__(self, redis_url: str) -> None:
        parts = urlsplit(redis_url)
        if parts.scheme != "redis" or not parts.hostname or not parts.port:
            pytest.skip("the reply-dropping proxy needs a redis:// TCP URL")
        self._target = (parts.hostname, parts.port)
        self._db = parts.path or "/0"
        self._server: asyncio.Server | None = None
        self._marker: bytes | None = None
        self._muted = False
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self.dropped = 0

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"redis://127.0.0.1:{port}{self._db}"

    def mute(self) -> None:
        """Swallow every reply from now on, leaving the connections open."""
        self._muted = True

    def arm(self, marker: bytes) -> None:
        """Lose the reply to the next request that contains ``marker``."""
        self._marker = marker

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()  # each forwarding task then sees its streams end
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        await self._server.wait_closed()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            server_r, server_w = await asyncio.open_connection(*self._target)
        except OSError:
            client_w.transport.abort()
            self._tasks.discard(task)
            return
        self._writers += [client_w, server_w]
        drop = False

        async def upstream() -> None:
            nonlocal drop
            while data := await client_r.read(65536):
                if self._marker is not None and self._marker in data:
                    self._marker = None
                    drop = True
                server_w.write(data)
                await server_w.drain()
            server_w.transport.abort()  # the client hung up: hang up on the server too

        async def downstream() -> None:
            while data := await server_r.read(65536):
                if drop:
                    self.dropped += 1
                    client_w.transport.abort()
                    server_w.transport.abort()
                    return
                if self._muted:
                    continue
                client_w.write(data)
                await client_w.drain()
            client_w.transport.abort()

        try:
            await asyncio.gather(upstream(), downstream(), return_exceptions=True)
        finally:
            client_w.transport.abort()
            server_w.transport.abort()
            self._tasks.discard(task)
