"""Q1-Q5 and C4: the worker's side.  Q1-Q5 are W2 with QoS in use (the scenarios of
``benchmarks/groups.py``, one in-process Worker); C4 is W4 with no queue at all."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from _common import BENCH_DIR


async def wl_q(url: str, p: dict[str, Any]) -> dict[str, Any]:
    """One scenario of benchmarks/groups.py (fair groups, priorities, group limits)."""
    sys.path.insert(0, str(BENCH_DIR))
    import groups  # benchmarks/groups.py, beside this file (imports aioqueue)

    cfg = groups.Config(
        jobs=int(p["jobs"]),
        groups=int(p["groups"]),
        limit=int(p["limit"]),
        concurrency=100,
        repeats=1,
        uvloop=True,
    )
    t = await groups.trial(url, str(p["scenario"]), cfg)
    return {
        "jobs_per_s": t.jobs_per_s,
        "seconds": t.seconds,
        "server_us_per_job": t.server_us_per_job,
    }


async def wl_c4(url: str, p: dict[str, Any]) -> dict[str, Any]:
    """W4 without a queue: N jobs of ``asyncio.sleep(0.01)`` on C slots, each slot starting
    the next job the moment its last one ends; steady = N / (last end - first start)."""
    n, c = int(p["n"]), int(p["concurrency"])
    left = n
    first = last = 0.0

    async def slot() -> None:
        nonlocal left, first, last
        while left > 0:
            left -= 1
            start = time.time()
            first = first or start
            await asyncio.sleep(0.01)
            last = max(last, time.time())

    await asyncio.gather(*(slot() for _ in range(c)))
    return {"jobs_per_s": n / (last - first), "seconds": last - first}
