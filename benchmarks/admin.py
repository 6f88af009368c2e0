#!/usr/bin/env python3
"""What the operator's API costs: a page of ``Queue.jobs(...)`` and ``requeue(all=True)``.

    .venv/bin/python benchmarks/admin.py                     # 10,000 and 1,000,000 jobs
    .venv/bin/python benchmarks/admin.py --sizes 10000,100000

Starts a private embedded Valkey (no AOF). For each size N, on an emptied server:

    page queued    N jobs queued (no group, the ready list), then 20 pages of 1,000 from the
                   head and 20 from the tail (newest first): the median ms a page
    page sched     N jobs scheduled an hour ahead (a ZSET): the same
    page filtered  the scheduled ZSET with ``task=`` matching 1 job in 10: ms a page
    requeue all    N dead letters, then ``requeue(all=True)``: seconds, and jobs/s. The dead
                   letters are written straight into the store's layout (a job hash in state
                   ``failed`` and its id in the ``dead`` ZSET, as ``fail.lua`` leaves them), so
                   that 1,000,000 of them take seconds to make, not a worker's hour

Between phases the store is emptied with ``FLUSHDB ASYNC`` (freed in the server's background
thread). Each phase's time goes to stderr; 1,000,000 jobs take about 2.5 minutes on a loaded
2-core machine. Prints a table; nothing is written. These are measurements, not tests.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

from aioqueue import App, EmbeddedServer

PAGE = 1000


async def _timed_pages(app: App, state: str, pages: int, **kw: object) -> float:
    q = app.queue()
    times = []
    cursor = None
    for _ in range(pages):
        t0 = time.perf_counter()
        page = await q.jobs(state, limit=PAGE, cursor=cursor, **kw)  # type: ignore[arg-type]
        times.append(time.perf_counter() - t0)
        cursor = page.cursor
        if cursor is None:
            break
    return statistics.median(times) * 1000


async def _fill(app: App, n: int, delay: float | None = None) -> None:
    work, other = app.tasks["work"], app.tasks["other"]
    step = 10_000
    for lo in range(0, n, step):
        calls = [((i,), {}) for i in range(lo, min(n, lo + step))]
        if delay is None:
            await work.enqueue_many(calls)
        else:
            # one job in ten is "work", so a task filter keeps 10 %
            await work.options(delay=delay).enqueue_many(calls[::10])
            await other.options(delay=delay).enqueue_many(
                [c for j, c in enumerate(calls) if j % 10]
            )


async def _dead(app: App, n: int) -> None:
    """n dead letters, written in the layout fail.lua leaves (see the module docstring)."""
    r = app.redis
    base = f"{app.prefix}:{{{app.default_queue}}}:"
    sec, _ = await r.time()
    now = int(sec) * 1000
    step = 5000
    for lo in range(0, n, step):
        pipe = r.pipeline(transaction=False)
        members = {}
        for i in range(lo, min(n, lo + step)):
            jid = f"dead{i:08d}"
            pipe.hset(
                base + "job:" + jid,
                mapping={
                    "t": "work",
                    "p": "[[1],{}]",
                    "s": "failed",
                    "a": 3,
                    "m": 3,
                    "ct": now,
                    "f": now,
                    "e": '{"type":"RuntimeError","message":"boom","traceback":null}',
                },
            )
            members[jid] = now
        pipe.zadd(base + "dead", members)
        await pipe.execute()


async def _flush(app: App) -> None:
    # FLUSHDB ASYNC: the server frees 1M keys in a background thread
    await app.redis.flushdb(asynchronous=True)


def _note(n: int, what: str, t0: float) -> None:
    print(f"[{n:,}] {what}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)


async def measure(url: str, n: int) -> dict[str, float]:
    out: dict[str, float] = {}
    async with App(url, prefix="bq") as app:

        @app.task(name="work")
        async def work(i: int) -> None:
            return None

        @app.task(name="other")
        async def other(i: int) -> None:
            return None

        t0 = time.perf_counter()
        await _flush(app)
        await _fill(app, n)
        _note(n, "filled queued", t0)
        out["page queued, oldest first (ms)"] = await _timed_pages(app, "queued", 20)
        out["page queued, newest first (ms)"] = await _timed_pages(
            app, "queued", 20, newest_first=True
        )
        _note(n, "paged queued", t0)
        await _flush(app)
        await _fill(app, n, delay=3600)
        _note(n, "filled scheduled", t0)
        out["page scheduled (ms)"] = await _timed_pages(app, "scheduled", 20)
        out["page scheduled, newest first (ms)"] = await _timed_pages(
            app, "scheduled", 20, newest_first=True
        )
        out["page scheduled, task filter 10 % (ms)"] = await _timed_pages(
            app, "scheduled", 20, task="work"
        )
        _note(n, "paged scheduled", t0)
        await _flush(app)
        await _dead(app, n)
        _note(n, "wrote dead letters", t0)
        t1 = time.perf_counter()
        done = await app.queue().requeue(all=True)
        took = time.perf_counter() - t1
        assert done == n, (done, n)
        out["requeue all (s)"] = took
        out["requeue all (jobs/s)"] = n / took
        _note(n, "requeued all", t0)
        await _flush(app)
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,1000000", help="comma-separated job counts")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with EmbeddedServer() as server:
        results = {n: await measure(server.url, n) for n in sizes}
    rows = list(next(iter(results.values())))
    width = max(len(r) for r in rows)
    print(f"{'':{width}}  " + "  ".join(f"{n:>12,}" for n in sizes))
    for row in rows:
        cells = "  ".join(f"{results[n][row]:>12,.1f}" for n in sizes)
        print(f"{row:{width}}  {cells}")


if __name__ == "__main__":
    asyncio.run(main())
