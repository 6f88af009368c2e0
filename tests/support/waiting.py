"""Waiting for a condition with a timeout: the suite's alternative to sleeping, then asserting."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

#: "Promptly", in seconds, for a wake-up the suite expects: generous, for a machine busy with other
#: work. A test that checks promptness makes the failure it guards against (a missed wake-up, a
#: fall-back to polling) take at least a few times this long, so only that failure exceeds it.
PROMPT_S = 3.0


async def wait_until(
    predicate: Callable[[], Awaitable[bool] | bool],
    timeout: float = 10.0,
    interval: float = 0.01,
    what: str = "condition",
) -> None:
    """Wait until ``predicate()`` is true, checking every ``interval`` seconds.

    Use this instead of sleeping then asserting: it returns as soon as the condition holds and
    fails with a clear message when it never does.

    Args:
        predicate: a function, sync or async, returning whether the condition holds.
        timeout: seconds to wait before giving up.
        interval: seconds between checks.
        what: a description of the condition for the failure message.

    Raises:
        AssertionError: the condition did not hold within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)
