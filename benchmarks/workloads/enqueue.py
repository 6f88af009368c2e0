"""E1, E1b: the harness's W1 and W1b measured in-process (asyncio's loop, like the
harness's producer), with the client's and the server's CPU per job."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .common import cpu_mark, cpu_per_job, fresh, noop_app

if TYPE_CHECKING:
    from aioqueue import Task


async def _timed_enqueue(
    url: str, n: int, enqueue: Callable[[Task[[], None]], Awaitable[None]]
) -> dict[str, Any]:
    """Time ``enqueue(task)`` (which must queue ``n`` no-op jobs) on an empty server."""
    await fresh(url)
    app, task = noop_app(url)
    async with app:
        m0 = await cpu_mark(url)
        t0 = time.perf_counter()
        await enqueue(task)
        dt = time.perf_counter() - t0
        m1 = await cpu_mark(url)
        counts = await app.queue().counts()
    if counts["queued"] != n:
        raise RuntimeError(f"{counts['queued']} queued after enqueueing {n}")
    return {"jobs_per_s": n / dt, "seconds": dt, "us_per_job": 1e6 * dt / n} | cpu_per_job(
        m0, m1, n
    )


async def wl_e1(url: str, p: dict[str, Any]) -> dict[str, Any]:
    n = int(p["n"])

    async def one_by_one(task: Task[[], None]) -> None:
        for _ in range(n):
            await task.enqueue()

    return await _timed_enqueue(url, n, one_by_one)


async def wl_e1b(url: str, p: dict[str, Any]) -> dict[str, Any]:
    n = int(p["n"])

    async def bulk(task: Task[[], None]) -> None:
        await task.enqueue_many([{} for _ in range(n)])

    return await _timed_enqueue(url, n, bulk)
