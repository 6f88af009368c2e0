"""What every workload body uses: an empty server, CPU marks, a no-op App, and aioqueue's
prefill and pull loops (the public API only).  aioqueue and redis-py are imported inside."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aioqueue import App, Task


async def fresh(url: str) -> None:
    """Empty server: data and cached scripts (as the peers' harness does before each trial)."""
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(url)
    try:
        # SYNC: a lazy (background) free would still be returning memory while the next
        # trial measures used_memory
        await r.execute_command("FLUSHALL", "SYNC")
        await r.script_flush()
        await r.function_flush()
    finally:
        await r.aclose()


async def used_memory(url: str) -> int:
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(url)
    try:
        info = await r.info("memory")
        return int(info["used_memory"])
    finally:
        await r.aclose()


async def cpu_mark(url: str) -> tuple[float, float]:
    """(this process's CPU seconds, the server's CPU seconds from INFO cpu), to split a timed
    section's cost per job between client (Python) and server (Lua, networking)."""
    import redis.asyncio as aioredis

    client = time.process_time()
    r = aioredis.Redis.from_url(url)
    try:
        info = await r.info("cpu")
    finally:
        await r.aclose()
    return client, float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def cpu_per_job(
    m0: tuple[float, float], m1: tuple[float, float], n: int, tag: str = ""
) -> dict[str, float]:
    return {
        f"{tag}client_cpu_us_per_job": 1e6 * (m1[0] - m0[0]) / n,
        f"{tag}server_cpu_us_per_job": 1e6 * (m1[1] - m0[1]) / n,
    }


# --------------------------------------------------------------------------- #
# aioqueue helpers (the public API only)                                       #
# --------------------------------------------------------------------------- #
def noop_app(url: str) -> tuple[App, Task[[], None]]:
    """A fresh App with the no-op task registered as "noop" (as in the peers' adapter)."""
    from aioqueue import App

    app = App(url)
    task = app.task(name="noop")(_noop_task)
    return app, task


async def _noop_task() -> None:
    return None


async def prefill(task: Task[[], None], n: int, chunk: int) -> float:
    """Enqueue n no-op jobs with enqueue_many, ``chunk`` per call; returns seconds."""
    t0 = time.perf_counter()
    left = n
    while left > 0:
        k = min(chunk, left)
        await task.enqueue_many([{} for _ in range(k)])
        left -= k
    return time.perf_counter() - t0


async def pull_drain(
    app: App, limit: int | None, concurrency: int, batch: int
) -> tuple[int, float]:
    """C coroutines doing reserve(batch) + complete each, until empty or ``limit`` jobs."""
    q = app.queue()
    done = taken = 0

    async def consumer() -> None:
        nonlocal done, taken
        while True:
            want = batch if limit is None else min(batch, limit - taken)
            if want <= 0:
                return
            taken += want  # counted before the await, so C coroutines never overshoot limit
            rs = await q.reserve(want, lease=120)
            taken -= want - len(rs)
            if not rs:
                return
            for r in rs:
                await q.complete(r, None)
            done += len(rs)

    t0 = time.perf_counter()
    await asyncio.gather(*(consumer() for _ in range(concurrency)))
    return done, time.perf_counter() - t0
