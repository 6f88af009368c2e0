#!/usr/bin/env python3
"""What named limiters cost: drain throughput and the server's script time per job with 0, 1
and 3 limits per job, and plain jobs against main's code (A/B, alternated).

    .venv/bin/python benchmarks/limits.py                   # 20,000 jobs, 5 repeats
    .venv/bin/python benchmarks/limits.py --repeats 3 --jobs 5000 --main /work/main

Scenarios, each a drain of pre-queued no-op jobs by one in-process ``Worker`` (concurrency
100) on a private embedded Valkey, interleaved (see benchmarks/groups.py for the method):

    plain     no limiter declared: what every job pays for the feature
    limits-1  each job needs 1 limit (a rate it never reaches: admitted, charged)
    limits-3  each job needs 3 (two rates and a concurrency of 1,000)
    main      plain, run by the code at ``--main`` (a checkout of main) in a subprocess, with
              plain's own run beside it in a subprocess too, alternated

Prints a table and writes ``benchmarks/results/limits-latest.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _loop import has_uvloop, run  # benchmarks/_loop.py, beside this file
from groups import Drained, acked, script_stats  # the drain's method, shared

from aioqueue import App, EmbeddedServer, Worker

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
NEVER = (1_000_000, 1.0)  # a rate no drain reaches
LIMITS = {"plain": [], "limits-1": ["a"], "limits-3": ["a", "b", "c"]}


async def trial(url: str, name: str, jobs: int) -> dict[str, float]:
    async with App(url, prefix="bench", max_connections=200) as app:
        await app.redis.flushall()
        drained = Drained(jobs)
        if name != "plain":
            app.limiter("a", rate=NEVER, burst=NEVER[0], key=lambda i: i % 100)
            app.limiter("b", rate=NEVER, burst=NEVER[0])
            app.limiter("c", concurrency=1000)

        async def noop(i: int) -> None:
            drained.tick()

        # (plain jobs are declared as main's code declares them: it has no limits=)
        opts = {"limits": LIMITS[name]} if LIMITS[name] else {}
        task = app.task(name="noop", **opts)(noop)
        for i in range(0, jobs, 5000):
            await task.enqueue_many([{"i": j} for j in range(i, min(i + 5000, jobs))])
        _, usec0 = await script_stats(app)
        t0 = time.perf_counter()
        async with Worker(app, concurrency=100):
            await asyncio.wait_for(drained.event.wait(), 600)
            await acked(app, jobs)
            seconds = time.perf_counter() - t0
        _, usec1 = await script_stats(app)
    return {"jobs_per_s": jobs / seconds, "server_us_per_job": (usec1 - usec0) / jobs}


def one(jobs: int, uvloop: bool) -> dict[str, float]:
    """One plain trial on a server of its own (the A/B subprocesses)."""
    with EmbeddedServer(appendonly=False) as server:
        return run(trial(server.url, "plain", jobs), uvloop)


def subprocess_trial(code: Path, jobs: int, uvloop: bool) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(code)}
    args = [sys.executable, str(HERE / "limits.py"), "--one", "--jobs", str(jobs)]
    if not uvloop:
        args.append("--no-uvloop")
    out = subprocess.run(args, env=env, capture_output=True, text=True, check=True, timeout=900)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--main", type=Path, default=Path("/work/main"), help="main's checkout")
    ap.add_argument("--no-uvloop", action="store_true")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    uvloop = has_uvloop() and not args.no_uvloop
    if args.one:
        print(json.dumps(one(args.jobs, uvloop)))
        return 0
    trials: dict[str, list[dict[str, float]]] = {n: [] for n in [*LIMITS, "ab-this", "ab-main"]}
    this = HERE.parent
    with EmbeddedServer(appendonly=False) as server:
        for r in range(args.repeats):
            for name in LIMITS:
                trials[name].append(run(trial(server.url, name, args.jobs), uvloop))
            # A/B: main's code and this code alike in subprocesses, the order alternated
            order = [("ab-main", args.main), ("ab-this", this)]
            for name, code in order if r % 2 else order[::-1]:
                trials[name].append(subprocess_trial(code, args.jobs, uvloop))
            print(f"  repeat {r + 1}/{args.repeats} done", file=sys.stderr)
    best = {n: max(t["jobs_per_s"] for t in ts) for n, ts in trials.items()}
    med = {n: statistics.median(t["jobs_per_s"] for t in ts) for n, ts in trials.items()}
    us = {n: min(t["server_us_per_job"] for t in ts) for n, ts in trials.items()}
    lines = [
        f"Drain of {args.jobs:,} no-op jobs, one Worker at concurrency 100, {args.repeats} "
        f"runs each, interleaved ({'uvloop' if uvloop else 'asyncio'}).",
        "",
        "| scenario | median/s | best/s | vs plain (best) | server us/job (lowest) |",
        "|---|---|---|---|---|",
    ]
    for n in trials:
        base = "ab-main" if n.startswith("ab-") else "plain"
        lines.append(
            f"| {n} | {med[n]:,.0f} | {best[n]:,.0f} | {best[n] / best[base]:.3f} | {us[n]:.1f} |"
        )
    lines.append("")
    lines.append("ab-this vs ab-main: plain jobs, this branch's code against main's (A/B).")
    table = "\n".join(lines)
    print(table)
    RESULTS.mkdir(exist_ok=True)
    out: dict[str, Any] = {"jobs": args.jobs, "repeats": args.repeats, "trials": trials}
    out["table"] = table
    (RESULTS / "limits-latest.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
