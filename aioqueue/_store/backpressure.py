"""Backpressure on the producer's side: an enqueue refused as ``QueueFull`` (enqueue.lua, the
queue's ``max_queued`` setting) is tried again, backing off, for as long as the setting lets a
producer wait; then ``QueueFull`` is raised. The wait comes from the server with the refusal,
so every producer waits the same, whatever its configuration.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .._model.exceptions import QueueFull

T = TypeVar("T")

#: the first pause after a refusal, and the longest (seconds); each doubles the last
FIRST_PAUSE, LONGEST_PAUSE = 0.01, 0.5


async def with_room(store: Callable[[], Awaitable[T]]) -> T:
    """Run an enqueue call (``store``); while it is refused as ``QueueFull`` and the
    setting gives a wait, pause (doubling, with jitter, up to ``LONGEST_PAUSE``) and run it
    again (the call is idempotent on its job ids) until the wait runs out.

    Raises:
        QueueFull: still full when the wait ran out, or the setting gives none.
    """
    deadline: float | None = None
    pause = FIRST_PAUSE
    while True:
        try:
            return await store()
        except QueueFull as full:
            now = time.monotonic()
            if deadline is None:
                deadline = now + full.wait
            left = deadline - now
            if left <= 0:
                raise
            await asyncio.sleep(min(pause * (0.5 + random.random() / 2), left))
            pause = min(pause * 2, LONGEST_PAUSE)
