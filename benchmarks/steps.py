#!/usr/bin/env python3
"""What durable steps and durable waits cost (issue 27): per-step overhead and parked-job memory.

    .venv/bin/python benchmarks/steps.py                 # 300 jobs x 10 steps, 1,000 parked
    .venv/bin/python benchmarks/steps.py --jobs 100 --parked 200

Starts a private embedded Valkey (no AOF). Measures, alternating plain and stepped runs:

    client     a Worker (in-process, concurrency 50) drains N jobs of a task that records
               K steps (``ctx.step`` of a no-op) against N jobs of the same task without
               steps; (stepped - plain) / (N * K) is the wall time one step adds per job
    server     the step script's server time per call (``INFO commandstats``, the function
               or script calls made by the stepped drain), and calls per step (2 on a first
               run: a read that finds nothing, then the record)
    parked     M jobs with one recorded step parked in ``ctx.sleep(3600)``: the server's
               ``used_memory`` grown per parked job, and ``MEMORY USAGE`` of one parked job's
               record, its step hash and its share of the ``scheduled`` ZSET

Prints a table and writes ``benchmarks/results/steps-latest.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from aioqueue import App, EmbeddedServer, Worker, current_job
from aioqueue._model.keys import QueueKeys

RESULTS = Path(__file__).resolve().parent / "results"


async def _script_stats(app: App) -> tuple[int, int]:
    """(calls, usec) of every script and function call so far."""
    info = await app.redis.info("commandstats")
    calls = usec = 0
    for name, v in info.items():
        if name in ("cmdstat_evalsha", "cmdstat_fcall", "cmdstat_eval"):
            calls += int(v["calls"])
            usec += int(v["usec"])
    return calls, usec


async def _drain(app: App, n: int, steps: int) -> tuple[float, int, int]:
    task = app.tasks["stepped"]
    c0, u0 = await _script_stats(app)
    t0 = time.perf_counter()
    jobs = [await task.enqueue(steps) for _ in range(n)]
    for j in jobs:
        await j.result(timeout=120)
    took = time.perf_counter() - t0
    c1, u1 = await _script_stats(app)
    return took, c1 - c0, u1 - u0


async def run(jobs: int, steps: int, parked: int, rounds: int) -> dict[str, Any]:
    with EmbeddedServer() as server:
        async with App(server.url, prefix="bench") as app:

            @app.task(name="stepped")
            async def stepped(k: int) -> int:
                ctx = current_job()
                for i in range(k):
                    await ctx.step(f"s{i}", int, i)
                return k

            @app.task(name="sleeper")
            async def sleeper() -> None:
                await current_job().step("charge", int, 1)
                await current_job().sleep(3600)

            plain_s: list[float] = []
            stepped_s: list[float] = []
            calls: dict[int, list[int]] = {0: [], steps: []}
            usec: dict[int, list[int]] = {0: [], steps: []}
            async with Worker(app, concurrency=50, grace=2):
                await _drain(app, 50, steps)  # warm up
                for r in range(rounds):
                    order = (0, steps) if r % 2 == 0 else (steps, 0)
                    for k in order:
                        took, c, u = await _drain(app, jobs, k)
                        (stepped_s if k else plain_s).append(took)
                        calls[k].append(c)
                        usec[k].append(u)
                await app.redis.memory_purge()
                before = int((await app.redis.info("memory"))["used_memory"])
                sleepers = [await app.tasks["sleeper"].enqueue() for _ in range(parked)]

                deadline = time.monotonic() + 120
                while (await app.queue().counts())["scheduled"] < parked:
                    await asyncio.sleep(0.1)
                    if time.monotonic() > deadline:
                        raise SystemExit("the sleepers did not all park")
            after = int((await app.redis.info("memory"))["used_memory"])
            k = QueueKeys(app.prefix, "default")
            one = sleepers[0].id
            record = int(await app.redis.memory_usage(k.job(one)) or 0)
            steps_hash = int(await app.redis.memory_usage(k.steps(one)) or 0)
            sched = int(await app.redis.memory_usage(k.scheduled, samples=0) or 0)
            per_step_us = (statistics.median(stepped_s) - statistics.median(plain_s)) / (
                jobs * steps
            )
            out = {
                "jobs": jobs,
                "steps_per_job": steps,
                "rounds": rounds,
                "plain_s": plain_s,
                "stepped_s": stepped_s,
                "client_us_per_step": round(per_step_us * 1e6, 1),
                "server_us_per_step": round(
                    (statistics.median(usec[steps]) - statistics.median(usec[0])) / (jobs * steps),
                    2,
                ),
                "script_calls_per_step": round(
                    (statistics.median(calls[steps]) - statistics.median(calls[0]))
                    / (jobs * steps),
                    2,
                ),
                "parked_jobs": parked,
                "used_memory_per_parked_job": round((after - before) / parked),
                "memory_usage_record": record,
                "memory_usage_step_hash": steps_hash,
                "scheduled_zset_per_member": round(sched / max(parked, 1)),
            }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=300)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--parked", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=4)
    a = p.parse_args()
    out = asyncio.run(run(a.jobs, a.steps, a.parked, a.rounds))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "steps-latest.json").write_text(json.dumps(out, indent=2))
    for key, value in out.items():
        print(f"{key:32} {value}")


if __name__ == "__main__":
    main()
