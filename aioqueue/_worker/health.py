"""A liveness endpoint for a worker (``python -m aioqueue worker --health-port PORT``).

``GET /healthz`` answers ``200 ok`` while the worker's event loop runs (it answers at all) and
its last heartbeat succeeded on every queue within three heartbeat periods (``Worker.alive``,
the registry's own rule for a live worker); ``503`` otherwise, e.g. while the server cannot be
reached, before the worker registered or once it stopped. Minimal HTTP/1.1 on asyncio's own
server: one request per connection, the request bounded in size and time, no dependency.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)

#: the path a probe asks for (``HEAD`` works too)
PATH = "/healthz"
#: longest request head read, and how long a client may take to send it
MAX_HEAD = 8192
READ_TIMEOUT = 5.0

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}


async def start_health_server(
    alive: Callable[[], bool], host: str = "0.0.0.0", port: int = 8081
) -> asyncio.Server:
    """Serve ``GET /healthz`` on ``host:port``: 200 while ``alive()``, 503 otherwise.

    Returns:
        the listening server (``server.close()`` stops it; port 0 picks a free port, see
        ``server.sockets[0].getsockname()``).

    Raises:
        OSError: the port cannot be bound.
    """

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            status, body, head_only = await _answer(reader, alive)
        except (TimeoutError, asyncio.LimitOverrunError, asyncio.IncompleteReadError, OSError):
            status, body, head_only = 400, "bad request\n", False
        try:
            payload = body.encode()
            writer.write(
                f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
                "Content-Type: text/plain; charset=utf-8\r\n"
                f"Content-Length: {len(payload)}\r\n"
                "Cache-Control: no-store\r\n"
                "Connection: close\r\n\r\n".encode()
                + (b"" if head_only else payload)
            )
            await writer.drain()
        except OSError:
            pass  # the prober went away
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, host, port, limit=MAX_HEAD)
    logger.info("health endpoint on http://%s:%d%s", host, _port(server), PATH)
    return server


def _port(server: asyncio.Server) -> int:
    return int(server.sockets[0].getsockname()[1]) if server.sockets else 0


async def _answer(reader: asyncio.StreamReader, alive: Callable[[], bool]) -> tuple[int, str, bool]:
    """(status, body, HEAD?) for the request on ``reader``; the head is read to its end."""
    async with asyncio.timeout(READ_TIMEOUT):
        head = await reader.readuntil(b"\r\n\r\n")
    request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = request_line.split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return 400, "bad request\n", False
    method, target, _ = parts
    if target.split("?", 1)[0] != PATH:
        return 404, "not found\n", method == "HEAD"
    if method not in ("GET", "HEAD"):
        return 405, "method not allowed\n", False
    if alive():
        return 200, "ok\n", method == "HEAD"
    return 503, "unhealthy: no recent heartbeat\n", method == "HEAD"
