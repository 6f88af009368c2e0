#!/usr/bin/env python3
"""What a batch costs: 10,000 sub-jobs of one batch against 10,000 plain jobs.

    .venv/bin/python benchmarks/batch_overhead.py                # 10,000 jobs, 3 repeats
    .venv/bin/python benchmarks/batch_overhead.py --jobs 2000 --repeats 1

Starts a private embedded Valkey (no AOF). For each repeat, interleaved, on an emptied server:

    plain        a Worker (in-process, concurrency 100, uvloop when installed, a no-op async
                 task) is started and idle; timed from ``enqueue_many`` of N jobs until the
                 queue's stats say ``completed == N`` (every ack on the server)
    batch        the same Worker; timed from ``app.batch([N calls], on_complete=cb.call())``
                 until ``batch.wait()`` returns (every sub-job counted, the callback released;
                 the time until the callback itself has run is reported beside it)
    enqueue      no worker: ``enqueue_many`` of N jobs against ``app.batch`` of N calls, the
                 producer's side alone

Prints a table (medians of the repeats; the batch's overhead in % and in microseconds per job;
the server's script time per job from ``INFO commandstats``) and writes everything to
``benchmarks/results/batch-latest.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from _loop import has_uvloop, run  # benchmarks/_loop.py, beside this file

from aioqueue import App, EmbeddedServer, Task, Worker, __version__
from aioqueue._store.loader import SCRIPTS

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True, slots=True)
class Config:
    jobs: int
    concurrency: int
    repeats: int
    uvloop: bool


@dataclass(slots=True)
class Trial:
    plain_s: float  # enqueue_many + drain, until stats completed == N
    batch_s: float  # app.batch + batch.wait()
    batch_callback_s: float  # app.batch until the callback has run
    plain_enqueue_s: float  # enqueue_many alone
    batch_enqueue_s: float  # app.batch alone
    plain_server_us_per_job: float
    batch_server_us_per_job: float


class Tasks:
    """The no-op task and the callback, counting runs in-process (no Redis traffic)."""

    def __init__(self, app: App) -> None:
        self.ran = 0
        self.callback_done = asyncio.Event()

        @app.task(name="noop")
        async def noop(i: int) -> None:
            self.ran += 1

        @app.task(name="done")
        async def done() -> None:
            self.callback_done.set()

        self.noop: Task[[int], None] = noop
        self.done: Task[[], None] = done


async def script_usec(app: App) -> int:
    stats = await app.redis.info("commandstats")  # script calls: FCALL (or EVALSHA)
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("usec", 0)) for c in ("fcall", "evalsha"))


async def fresh(app: App) -> None:
    """An empty server that knows every script (a batch's first use on a server that knows
    enqueue.lua but not batch.lua goes wrong: see tests/test_batch.py)."""
    await app.redis.flushall()
    for script in SCRIPTS.values():
        await app.redis.script_load(script.source)


async def until_completed(app: App, n: int, timeout: float = 600) -> None:
    """Until the queue's stats count ``n`` completed jobs (the acks reached the server)."""
    deadline = time.perf_counter() + timeout
    while int((await app.queue().stats()).get("completed", 0)) < n:
        if time.perf_counter() > deadline:
            raise TimeoutError("the jobs did not complete")
        await asyncio.sleep(0.001)


async def trial(url: str, cfg: Config) -> Trial:
    n = cfg.jobs
    async with App(url, prefix="bench", max_connections=200) as app:
        tasks = Tasks(app)
        calls = [{"i": i} for i in range(n)]

        # ---- plain jobs through a running worker
        await fresh(app)
        async with Worker(app, concurrency=cfg.concurrency, idle_block=1.0):
            await asyncio.sleep(0.2)  # the worker is up and blocked, idle
            usec0 = await script_usec(app)
            t0 = time.perf_counter()
            await tasks.noop.enqueue_many(calls)
            await until_completed(app, n)
            plain_s = time.perf_counter() - t0
            plain_us = (await script_usec(app) - usec0) / n
        assert tasks.ran == n, tasks.ran

        # ---- one batch of the same jobs, with a callback
        await fresh(app)
        tasks.ran = 0
        async with Worker(app, concurrency=cfg.concurrency, idle_block=1.0):
            await asyncio.sleep(0.2)
            usec0 = await script_usec(app)
            t0 = time.perf_counter()
            batch = await app.batch(
                [tasks.noop.call(i) for i in range(n)], on_complete=tasks.done.call()
            )
            info = await batch.wait(timeout=600)
            batch_s = time.perf_counter() - t0
            await asyncio.wait_for(tasks.callback_done.wait(), 600)
            batch_cb_s = time.perf_counter() - t0
            batch_us = (await script_usec(app) - usec0) / n
        assert (info.done, info.total) == (n, n), info
        assert tasks.ran == n, tasks.ran

        # ---- the producer's side alone
        await fresh(app)
        t0 = time.perf_counter()
        await tasks.noop.enqueue_many(calls)
        plain_enq = time.perf_counter() - t0
        await fresh(app)
        t0 = time.perf_counter()
        await app.batch([tasks.noop.call(i) for i in range(n)], on_complete=tasks.done.call())
        batch_enq = time.perf_counter() - t0
        await app.redis.flushall()
    return Trial(plain_s, batch_s, batch_cb_s, plain_enq, batch_enq, plain_us, batch_us)


async def server_version(url: str) -> str:
    async with App(url) as app:
        info = await app.redis.info("server")
    return str(info.get("valkey_version") or info.get("redis_version", "?"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-uvloop", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS / "batch-latest.json")
    args = ap.parse_args(argv)
    cfg = Config(args.jobs, args.concurrency, args.repeats, has_uvloop() and not args.no_uvloop)

    trials: list[Trial] = []
    with EmbeddedServer(appendonly=False) as server:
        for r in range(cfg.repeats):
            t = run(trial(server.url, cfg), cfg.uvloop)
            trials.append(t)
            print(
                f"  repeat {r + 1}/{cfg.repeats}: plain {t.plain_s:.3f} s, batch {t.batch_s:.3f} s",
                file=sys.stderr,
            )
        version = asyncio.run(server_version(server.url))

    def med(field: str) -> float:
        return float(statistics.median(getattr(t, field) for t in trials))

    n = cfg.jobs
    plain, batch, batch_cb = med("plain_s"), med("batch_s"), med("batch_callback_s")
    p_enq, b_enq = med("plain_enqueue_s"), med("batch_enqueue_s")
    summary = {
        "plain_s": plain,
        "batch_s": batch,
        "batch_until_callback_ran_s": batch_cb,
        "overhead_pct": (batch - plain) / plain * 100,
        "overhead_us_per_job": (batch - plain) / n * 1e6,
        "plain_jobs_per_s": n / plain,
        "batch_jobs_per_s": n / batch,
        "plain_enqueue_s": p_enq,
        "batch_enqueue_s": b_enq,
        "enqueue_overhead_pct": (b_enq - p_enq) / p_enq * 100,
        "enqueue_overhead_us_per_job": (b_enq - p_enq) / n * 1e6,
        "plain_server_us_per_job": med("plain_server_us_per_job"),
        "batch_server_us_per_job": med("batch_server_us_per_job"),
    }
    s = summary
    lines = [
        f"{n:,} no-op jobs, one in-process Worker at concurrency {cfg.concurrency} "
        f"({'uvloop' if cfg.uvloop else 'asyncio'}), median of {cfg.repeats}; Valkey {version}",
        "",
        "| measure                          |      plain |      batch |  overhead | us/job |",
        "|----------------------------------|------------|------------|-----------|--------|",
        f"| enqueue + run all (s)            | {plain:>10.3f} | {batch:>10.3f} | "
        f"{s['overhead_pct']:>8.1f}% | {s['overhead_us_per_job']:>6.1f} |",
        f"| enqueue alone (s)                | {p_enq:>10.3f} | {b_enq:>10.3f} | "
        f"{s['enqueue_overhead_pct']:>8.1f}% | {s['enqueue_overhead_us_per_job']:>6.1f} |",
        f"| server script time (us/job)      | {s['plain_server_us_per_job']:>10.1f} | "
        f"{s['batch_server_us_per_job']:>10.1f} | {'':>9} | {'':>6} |",
        "",
        f"batch until its callback had run: {batch_cb:.3f} s",
    ]
    table = "\n".join(lines)
    print(table)
    out = {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "aioqueue": __version__,
        "valkey": version,
        "host": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "loadavg": os.getloadavg(),
        },
        "config": asdict(cfg),
        "summary": summary,
        "trials": [asdict(t) for t in trials],
        "table": table,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwritten to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
