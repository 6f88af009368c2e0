"""Free ports for the tests' servers, and a server started again on a new port when another
process took the one picked for it between the pick and the server's bind (another test's
server, or a client's outgoing connection on a busy machine)."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class PortTaken(Exception):
    """The server could not bind its port: another process took it after it was picked."""


def free_port() -> int:
    """A TCP port on loopback that is free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def on_a_free_port(
    start: Callable[[int], T], attempts: int = 3, pick: Callable[[], int] = free_port
) -> T:
    """``start(port)`` on a free port (``pick``); again on another, up to ``attempts`` in all,
    when it raises ``PortTaken``."""
    for attempt in range(1, attempts + 1):
        try:
            return start(pick())
        except PortTaken:
            if attempt == attempts:
                raise
    raise AssertionError("not reached")


async def on_a_free_port_async(
    start: Callable[[int], Awaitable[T]], attempts: int = 3, pick: Callable[[], int] = free_port
) -> T:
    """``on_a_free_port`` for a ``start`` that is awaited."""
    for attempt in range(1, attempts + 1):
        try:
            return await start(pick())
        except PortTaken:
            if attempt == attempts:
                raise
    raise AssertionError("not reached")
