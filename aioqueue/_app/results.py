"""Waiting for results without polling and without a connection per waiter.

One pub/sub connection per App listens on the ``done`` channel of each queue it awaits results
from; finishing scripts publish a job's id there when someone marked it as awaited. Any number
of ``Job.result()`` calls share that connection. A waiter re-checks the job's record every few
seconds as well, so a notification lost to a reconnect delays a result but never hangs a waiter.
A user that may not subscribe (an ACL without channel rights) falls back to re-checking often.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import redis.exceptions as rexc

from .._model.exceptions import ClosedError
from .._model.timeutil import Deadline
from .._store.cluster import is_cluster

if TYPE_CHECKING:
    import redis.asyncio as aioredis
    from redis.asyncio.client import PubSub

logger = logging.getLogger(__name__)

RECHECK_INTERVAL = 5.0
POLL_INTERVAL = 0.2  # when pub/sub is not allowed
SHARDED_SLICE = 0.05  # a cluster's waits on each node's connection, in turn

T = TypeVar("T")


class ResultWaiter:
    """Per-App multiplexer of result notifications."""

    def __init__(self, redis: aioredis.Redis) -> None:
        #: the App's client (its pub/sub connection comes from its pool)
        self.redis = redis
        self._waiters: dict[tuple[str, str], list[asyncio.Future[None]]] = {}
        self._subscribed: dict[str, asyncio.Event] = {}
        self._pubsub: PubSub | None = None
        #: sharded pub/sub (SSUBSCRIBE), on a cluster
        self._sharded = False
        self._listener: asyncio.Task[None] | None = None
        self._refused: Exception | None = None

    async def wait(
        self,
        channel: str,
        key: str,
        check: Callable[[], Awaitable[tuple[bool, T]]],
        timeout: float | None,
        what: str,
    ) -> T:
        """Wait until ``check()`` says done (it registers the waiter and may raise), woken by
        a message ``key`` on ``channel``.

        ``check()`` runs at least once, however short the timeout: ``timeout=0`` looks without
        waiting.

        Raises:
            ResultTimeout: not done within ``timeout`` seconds.
        """
        remaining = Deadline(timeout, what).remaining
        cap = RECHECK_INTERVAL
        try:
            first = remaining(RECHECK_INTERVAL)
            # subscribed (and confirmed) before check() marks the waiter: no finish is missed
            await asyncio.wait_for(self.subscribe(channel), first)
        except TimeoutError:  # no confirmation in time, or no time at all (ResultTimeout):
            cap = POLL_INTERVAL  # the record is still read once before giving up
        except rexc.ResponseError:  # NOPERM, from subscribe()
            cap = POLL_INTERVAL
        except (rexc.ConnectionError, rexc.TimeoutError, OSError) as exc:
            # the pub/sub connection was lost under the subscription: this wait re-checks
            # often instead, and the next one subscribes again on a new connection
            logger.warning("result notifications unavailable (%r); re-checking", exc)
            cap = POLL_INTERVAL
        while True:
            fut = self.add(channel, key)
            try:
                done, value = await check()
                if done:
                    return value
                slice_ = remaining(cap)  # raises ResultTimeout (itself a TimeoutError) here
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(fut, slice_)
            finally:
                self.remove(channel, key, fut)

    async def subscribe(self, channel: str) -> None:
        """Subscribe to a queue's done channel, returning once the server confirmed it."""
        event = self._subscribed.get(channel)
        if event is None:
            event = self._subscribed[channel] = asyncio.Event()
            if self._pubsub is None:
                self._pubsub = self.redis.pubsub()
                self._sharded = is_cluster(self.redis)
            try:
                if self._sharded:  # on a cluster: on the node that serves the queue's slot
                    await self._pubsub.ssubscribe(channel)
                else:
                    await self._pubsub.subscribe(channel)
            except BaseException:
                # not subscribed: those waiting for this subscription learn it, the next
                # wait tries again
                if self._subscribed.get(channel) is event:
                    del self._subscribed[channel]
                event.set()
                raise
            if self._listener is None:
                self._listener = asyncio.create_task(self._listen())
        await event.wait()
        if self._refused is not None:
            raise self._refused
        if self._subscribed.get(channel) is not event:
            raise rexc.ConnectionError(f"could not subscribe to {channel!r}")

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
                msg: Any
                if self._sharded:
                    # each node's connection is read in turn: a short wait on each
                    get = self._pubsub.get_sharded_message  # type: ignore[attr-defined]
                    began = time.monotonic()
                    msg = await get(timeout=SHARDED_SLICE)
                    if msg is None and time.monotonic() - began < SHARDED_SLICE / 2:
                        await asyncio.sleep(SHARDED_SLICE)  # no node to wait on (yet)
                else:
                    msg = await self._pubsub.get_message(timeout=RECHECK_INTERVAL)
                backoff = 0.05
            except rexc.ResponseError as exc:
                if not isinstance(exc, rexc.NoPermissionError) and "NOPERM" not in str(exc):
                    logger.warning("result listener: %r; retrying", exc)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
                    continue
                # this ACL user may not subscribe: waiters re-check on their own instead
                logger.warning("cannot subscribe to result notifications (%s); polling", exc)
                self._refused = exc
                for event in self._subscribed.values():
                    event.set()
                return
            except (rexc.ConnectionError, rexc.TimeoutError, OSError) as exc:
                logger.warning("result listener: %r; reconnecting", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            except Exception as exc:  # a reply redis-py could not parse: never stop listening
                logger.warning("result listener: %r; going on", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            if msg is None:
                continue
            try:
                self._dispatch(msg)
            except Exception as exc:  # garbage published on the channel: skip it, go on
                logger.warning("result listener: skipped a message it cannot read (%r)", exc)

    def _dispatch(self, msg: Any) -> None:
        channel = msg["channel"].decode()
        kind = msg["type"]
        kind = kind.decode() if isinstance(kind, bytes) else kind
        if kind in ("subscribe", "ssubscribe"):
            confirmed = self._subscribed.get(channel)
            if confirmed is not None:
                confirmed.set()
        elif kind in ("message", "smessage"):
            for fut in self._waiters.pop((channel, msg["data"].decode()), ()):
                if not fut.done():
                    fut.set_result(None)

    async def aclose(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            try:
                await self._listener
            except asyncio.CancelledError:
                pass
            except Exception as exc:  # it died of something unforeseen: closing still closes
                logger.warning("result listener had stopped: %r", exc)
            self._listener = None
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()  # type: ignore[no-untyped-call]
            self._pubsub = None
        for futs in self._waiters.values():
            for fut in futs:
                if not fut.done():
                    fut.set_exception(ClosedError("the App was closed while waiting"))
        self._waiters.clear()
        self._subscribed.clear()
