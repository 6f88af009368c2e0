"""Cost as the work grows (issue 26, point 3): what promoting a due delayed job costs while the
schedule holds many more that are not due yet.

For each size S: S delayed jobs are queued due over the hour after the next one (1,000 per
``enqueue_many``, the chunks' due times spread evenly: none falls due during the run), then
``--jobs`` jobs due in 2 s; a burst worker (concurrency 100) starts at once, waits for them
to fall due, promotes and runs them. The figures are the server's per promoted-and-run job
during that drain (``INFO commandstats``: the time in scripts, the commands they ran), which
load barely changes, and wall jobs/s, which it does. One embedded Valkey, emptied between
sizes.

    .venv/bin/python benchmarks/growth.py [--sizes 0,1000,1000000] [--jobs 5000]
    .venv/bin/python benchmarks/growth.py --groups 10,1000,100000 --jobs 100000

With ``--groups``: claims with G active groups instead, ``--jobs`` jobs spread over them
round-robin (queued first), drained by a burst worker: the server's cost per job.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

SCRIPTS = ("evalsha", "eval", "fcall")


async def _stats(r: Any) -> tuple[int, float]:
    """(commands so far, inside scripts included; the usec of script calls)."""
    s = await r.info("commandstats")
    calls = sum(int(v["calls"]) for k, v in s.items() if k.startswith("cmdstat_"))
    usec = sum(float(s.get(f"cmdstat_{c}", {}).get("usec", 0)) for c in SCRIPTS)
    return calls, usec


async def one_size(url: str, size: int, n: int) -> dict[str, float]:
    from aioqueue import App

    app = App(url, prefix="gr")
    ran, done = [0], asyncio.Event()

    @app.task(name="noop")
    async def noop(i: int) -> None:
        ran[0] += 1
        if ran[0] >= n:
            done.set()

    async with app:
        await app.redis.flushall()
        t0 = time.perf_counter()
        for c in range(0, size, 1000):
            delay = 3600 + 3600 * c / size  # due over the hour after the next
            kw = [{"i": i} for i in range(c, min(c + 1000, size))]
            await noop.options(delay=delay).enqueue_many(kw)
        fill = time.perf_counter() - t0
        mem = int((await app.redis.info("memory"))["used_memory"])
        for c in range(0, n, 5000):
            kw = [{"i": i} for i in range(c, min(c + 5000, n))]
            await noop.options(delay=2).enqueue_many(kw)
        k0, u0 = await _stats(app.redis)
        t1 = time.perf_counter()
        await _drain(app, done)
        wall = time.perf_counter() - t1
        k1, u1 = await _stats(app.redis)
        left = (await app.queue().counts())["scheduled"]
    return {
        "size": size,
        "fill_s": round(fill, 1),
        "used_memory_mb": round(mem / 1e6, 1),
        "script_us_per_job": round((u1 - u0) / n, 2),
        "commands_per_job": round((k1 - k0 - 1) / n, 2),
        "drain_s_after_due": round(wall, 2),
        "still_scheduled": left,
    }


async def _drain(app: Any, done: asyncio.Event) -> None:
    """Run a worker until the due jobs have run (the other delayed ones never fall due)."""
    from aioqueue import Worker

    worker = Worker(app, concurrency=100)
    task = asyncio.create_task(worker.run())
    try:
        await done.wait()
    finally:
        worker.stop()
        await task


async def groups_drain(url: str, groups: int, n: int) -> dict[str, float]:
    """Claims with ``groups`` active groups: ``n`` jobs spread round-robin over them (at least
    one each), drained by a burst worker; the server's cost per job."""
    from aioqueue import App, Worker

    app = App(url, prefix="gg")

    @app.task(name="noop")
    async def noop(i: int) -> None:
        return None

    async with app:
        await app.redis.flushall()
        calls = [
            noop.options(group=f"g{g}").enqueue_many([{"i": j} for j in range(g, n, groups)])
            for g in range(groups)
        ]
        for i in range(0, len(calls), 50):
            await asyncio.gather(*calls[i : i + 50])
        k0, u0 = await _stats(app.redis)
        t0 = time.perf_counter()
        await Worker(app, concurrency=100, burst=True).run()
        wall = time.perf_counter() - t0
        k1, u1 = await _stats(app.redis)
    return {
        "groups": groups,
        "jobs": n,
        "script_us_per_job": round((u1 - u0) / n, 2),
        "commands_per_job": round((k1 - k0 - 1) / n, 2),
        "jobs_per_s": round(n / wall),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="0,1000,1000000")
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--groups", help="instead: claims with these numbers of active groups")
    a = p.parse_args()
    from aioqueue import EmbeddedServer

    rows = []
    with EmbeddedServer() as server:
        if a.groups:
            for g in (int(x) for x in a.groups.split(",")):
                print(json.dumps(asyncio.run(groups_drain(server.url, g, a.jobs))), flush=True)
            return 0
        for size in (int(x) for x in a.sizes.split(",")):
            rows.append(asyncio.run(one_size(server.url, size, a.jobs)))
            print(json.dumps(rows[-1]), flush=True)
    print(f"promotion of {a.jobs:,} due jobs beside S delayed ones not due")
    print(f"{'S':>10} {'script µs/job':>14} {'commands/job':>13} {'memory MB':>10}")
    for r in rows:
        print(
            f"{r['size']:>10,} {r['script_us_per_job']:>14} {r['commands_per_job']:>13} "
            f"{r['used_memory_mb']:>10}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
