"""Hold an in-process worker at one await point of the job path.

``instrument(app)`` makes the queue's scripts (used by every Worker started afterwards) an
``InstrumentedScripts``: the real scripts, counting calls, and holding one call at a ``Gate``
(before or after the script really ran on the server), so a test can cancel the worker exactly
there. ``stopping(worker)``: whether the worker has begun to shut down.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis

from aioqueue import App, Worker
from aioqueue._model.keys import QueueKeys
from aioqueue._store.scripts import QueueScripts


class Gate:
    """Holds one script call of a worker until ``open()``.

    Args:
        after: hold the caller after the script ran on the server (its reply not yet
            delivered), rather than before it is sent.
        skip: let this many calls through before holding one.
        swallow: if the held caller is cancelled, run the script and return its reply as if
            nothing happened, as redis-py's send (``asyncio.wait_for``) does on Python 3.11
            when a cancellation lands just as the send completes.
    """

    def __init__(self, *, after: bool = False, skip: int = 0, swallow: bool = False) -> None:
        self.after = after
        self.skip = skip
        self.swallow = swallow
        self.used = False
        self.holder: str | None = None  # the script whose call is held
        self.entered = asyncio.Event()
        self.opened = asyncio.Event()

    def open(self) -> None:
        self.opened.set()


class InstrumentedScripts(QueueScripts):
    """The real scripts of one queue, counting calls and optionally holding one at a Gate."""

    def __init__(self, client: Redis, keys: QueueKeys) -> None:
        super().__init__(client, keys)
        self.gates: dict[str, Gate] = {}
        self.calls: Counter[str] = Counter()
        self.claimed: list[int] = []  # jobs leased per claim (or complete_claim) call
        #: the job ids of the acks each complete_claim or complete call carried, in call order
        self.acks: list[tuple[str, list[str]]] = []
        #: claims (of either kind) sent and not answered yet, and the most there ever were
        self.claims_in_flight = 0
        self.most_claims_in_flight = 0

    async def _through(self, name: str, call: Callable[[], Awaitable[Any]]) -> Any:
        self.calls[name] += 1
        if name == "claim":
            self.acks.append((name, []))
        if name not in ("claim", "complete_claim"):
            return await self._gated(name, call)
        self.claims_in_flight += 1
        self.most_claims_in_flight = max(self.most_claims_in_flight, self.claims_in_flight)
        try:
            return await self._gated(name, call)
        finally:
            self.claims_in_flight -= 1

    async def _gated(self, name: str, call: Callable[[], Awaitable[Any]]) -> Any:
        gate = self.gates.get(name)
        if gate is None or gate.used:
            return await call()
        if gate.skip > 0:
            gate.skip -= 1
            return await call()
        gate.used = True
        gate.holder = name
        if gate.after:
            result = await call()
            gate.entered.set()
            await gate.opened.wait()
            return result
        gate.entered.set()
        try:
            await gate.opened.wait()
        except asyncio.CancelledError:
            if not gate.swallow:
                raise
        return await call()

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        async def call() -> Any:
            res = await QueueScripts.claim(self, *args, **kwargs)
            self.claimed.append(len(res.jobs))
            return res

        return await self._through("claim", call)

    async def complete_claim(self, *args: Any, **kwargs: Any) -> Any:
        self.acks.append(("complete_claim", [a[0] for a in args[0]]))

        async def call() -> Any:
            res = await QueueScripts.complete_claim(self, *args, **kwargs)
            self.claimed.append(len(res[0].jobs))
            return res

        return await self._through("complete_claim", call)

    async def complete(self, *args: Any, **kwargs: Any) -> Any:
        self.acks.append(("complete", [a[0] for a in args[0]]))
        return await self._through("complete", lambda: QueueScripts.complete(self, *args, **kwargs))

    async def fail(self, *args: Any, **kwargs: Any) -> Any:
        return await self._through("fail", lambda: QueueScripts.fail(self, *args, **kwargs))

    async def release(self, *args: Any, **kwargs: Any) -> Any:
        return await self._through("release", lambda: QueueScripts.release(self, *args, **kwargs))

    async def extend(self, *args: Any, **kwargs: Any) -> Any:
        return await self._through("extend", lambda: QueueScripts.extend(self, *args, **kwargs))

    async def reap(self, *args: Any, **kwargs: Any) -> Any:
        return await self._through("reap", lambda: QueueScripts.reap(self, *args, **kwargs))


def stopping(worker: Worker) -> bool:
    """Whether the worker has begun to shut down (its own flag; no public signal exists)."""
    return bool(worker._stopping)


def instrument(app: App, queue: str | None = None) -> InstrumentedScripts:
    """Make the queue's scripts (used by every Worker started afterwards) instrumented."""
    q = app.queue(queue)
    scripts = InstrumentedScripts(app.redis, q._keys)
    q._scripts_obj = scripts
    return scripts
