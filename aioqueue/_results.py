"""Waiting for results without polling and without a connection per waiter.

One pub/sub connection per App listens on the ``done`` channel of each queue it awaits results
from; finishing scripts publish a job's id there when someone marked it as awaited. Any number
of ``Job.result()`` calls share that connection. A waiter re-checks the job's record every few
seconds as well, so a notification lost to a reconnect delays a result but never hangs a waiter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

import redis.exceptions as rexc

if TYPE_CHECKING:
    from redis.asyncio.client import PubSub

    from ._app import App

logger = logging.getLogger(__name__)

RECHECK_INTERVAL = 5.0


class ResultWaiter:
    """Per-App multiplexer of result notifications."""

    def __init__(self, app: App) -> None:
        self.app = app
        self._waiters: dict[tuple[str, str], list[asyncio.Future[None]]] = {}
        self._subscribed: dict[str, asyncio.Event] = {}
        self._pubsub: PubSub | None = None
        self._listener: asyncio.Task[None] | None = None

    async def subscribe(self, channel: str) -> None:
        """Subscribe to a queue's done channel, returning once the server confirmed it."""
        event = self._subscribed.get(channel)
        if event is None:
            event = self._subscribed[channel] = asyncio.Event()
            if self._pubsub is None:
                self._pubsub = self.app.redis.pubsub()
            await self._pubsub.subscribe(channel)
            if self._listener is None:
                self._listener = asyncio.create_task(self._listen())
        await event.wait()

    def add(self, channel: str, job_id: str) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault((channel, job_id), []).append(fut)
        return fut

    def remove(self, channel: str, job_id: str, fut: asyncio.Future[None]) -> None:
        futs = self._waiters.get((channel, job_id))
        if futs is not None:
            with contextlib.suppress(ValueError):
                futs.remove(fut)
            if not futs:
                del self._waiters[(channel, job_id)]

    async def _listen(self) -> None:
        assert self._pubsub is not None
        backoff = 0.05
        while True:
            try:
                msg: Any = await self._pubsub.get_message(timeout=RECHECK_INTERVAL)
                backoff = 0.05
            except (rexc.ConnectionError, rexc.TimeoutError, OSError) as exc:
                logger.warning("result listener: %r; reconnecting", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            if msg is None:
                continue
            channel = msg["channel"].decode()
            if msg["type"] == "subscribe":
                event = self._subscribed.get(channel)
                if event is not None:
                    event.set()
            elif msg["type"] == "message":
                for fut in self._waiters.pop((channel, msg["data"].decode()), ()):
                    if not fut.done():
                        fut.set_result(None)

    async def aclose(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
            self._listener = None
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()  # type: ignore[no-untyped-call]
            self._pubsub = None
        for futs in self._waiters.values():
            for fut in futs:
                fut.cancel()
        self._waiters.clear()
        self._subscribed.clear()
