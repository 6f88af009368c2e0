"""Calls that must run to the end even if their caller is cancelled (acks, failures,
releases, claims): each is tracked until it finishes, and shutdown waits for them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

# what goes wrong here is the worker's to log
logger = logging.getLogger("aioqueue._worker.worker")

T = TypeVar("T")


class Shield:
    """The worker's calls in flight that no cancellation may cut short."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending: set[asyncio.Future[Any]] = set()

    def __bool__(self) -> bool:
        return bool(self.pending)

    def track(self, call: Awaitable[T]) -> asyncio.Future[T]:
        """Start ``call`` and track it until it ends; returns its future (unshielded)."""
        fut = asyncio.ensure_future(call)
        self.pending.add(fut)
        fut.add_done_callback(self.pending.discard)
        return fut

    def __call__(self, call: Awaitable[T], *, log: bool = False) -> asyncio.Future[T]:
        """Run ``call`` to the end even if the awaiting caller is cancelled. ``log``: nobody
        awaits it, so log its failure."""
        fut = self.track(call)
        if log:
            fut.add_done_callback(_log_failure)
        return asyncio.shield(fut)

    async def settle(self) -> None:
        """Wait for every call in flight (their failures are their callers')."""
        await asyncio.gather(*list(self.pending), return_exceptions=True)

    async def wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the calls in flight, including any that one of
        them starts (a failure may start a release)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.pending and loop.time() < deadline:
            await asyncio.wait(list(self.pending), timeout=deadline - loop.time())


def _log_failure(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        # the lease brings the job back; nothing is lost
        logger.warning("could not record a job outcome: %r", fut.exception())
