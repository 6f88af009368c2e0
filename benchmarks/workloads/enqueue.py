"""E1, E1b, E1c: the harness's W1, W1b and W1c measured in-process (asyncio's loop, like the
harness's producer), with the client's and the server's CPU per job."""

from __future__ import annotations

import asyncio
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


async def wl_e1c(url: str, p: dict[str, Any]) -> dict[str, Any]:
    n, producers = int(p["n"]), int(p["producers"])
    # the harness's w1c split: the first n % producers coroutines take one job more
    shares = [n // producers + (1 if i < n % producers else 0) for i in range(producers)]

    async def concurrent(task: Task[[], None]) -> None:
        async def produce(k: int) -> None:
            for _ in range(k):
                await task.enqueue()

        await asyncio.gather(*(produce(k) for k in shares))

    return await _timed_enqueue(url, n, concurrent)
