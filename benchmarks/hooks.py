"""What middleware costs a worker: 20,000 pre-queued no-op jobs drained by one in-process
Worker (concurrency 100), with no middleware, then with one and three no-op middlewares, on
an embedded Valkey; trials interleaved; median jobs/s and CPU time per job printed.

    .venv/bin/python benchmarks/hooks.py [--jobs 20000] [--repeats 5]

Each trial runs in a fresh process. ``--base DIR`` adds the same drain on another checkout's
``aioqueue`` (e.g. one without hooks: ``git archive <rev> aioqueue | tar -x -C DIR``).
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


async def drain(url: str, jobs: int, middlewares: int) -> tuple[float, float]:
    """One drain of ``jobs`` no-op jobs under ``middlewares`` no-op middlewares: jobs/s, and
    this process's CPU time per job in microseconds (steadier than the rate on a busy
    machine: another process's load slows the drain but does not add to this one's CPU)."""
    from aioqueue import App, Worker
    from aioqueue.testing import unique_prefix

    app = App(url, prefix=unique_prefix())

    async def noop() -> None:
        return None

    task = app.task(name="noop")(noop)

    async def passthrough(job: Any, call_next: Any) -> Any:
        return await call_next()

    for _ in range(middlewares):
        app.middleware(passthrough)
    async with app:
        for i in range(0, jobs, 1000):
            await task.enqueue_many([{} for _ in range(min(1000, jobs - i))])
        t0, c0 = time.perf_counter(), time.process_time()
        await Worker(app, concurrency=100, burst=True).run()
        cpu = time.process_time() - c0
        return jobs / (time.perf_counter() - t0), cpu / jobs * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--base", help="a checkout whose aioqueue to time as well")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # url:middlewares, in a subprocess
    args = parser.parse_args()
    if args.one:
        url, n = args.one.rsplit("|", 1)
        print(json.dumps(asyncio.run(drain(url, args.jobs, int(n)))))
        return
    from aioqueue import EmbeddedServer

    variants = {"no middleware": 0, "1 no-op middleware": 1, "3 no-op middlewares": 3}
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    if args.base:
        runs["base checkout"] = []
    here = str(Path(__file__).resolve().parent.parent)
    with EmbeddedServer() as server:

        def one(checkout: str, middlewares: int) -> tuple[float, float]:
            # each trial in a fresh process, so that no trial inherits another's warm state
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--jobs",
                    str(args.jobs),
                    "--one",
                    f"{server.url}|{middlewares}",
                ],
                env={**os.environ, "PYTHONPATH": checkout},
                capture_output=True,
                text=True,
                check=True,
            )
            rate, cpu = json.loads(out.stdout)
            return float(rate), float(cpu)

        for _ in range(args.repeats):
            for name, n in variants.items():
                runs[name].append(one(here, n))
            if args.base:
                runs["base checkout"].append(one(args.base, 0))
    print(f"{'variant':<22} {'jobs/s':>8} {'CPU us/job':>11}  (medians; trials: jobs/s)")
    for name, values in runs.items():
        rate = statistics.median(v[0] for v in values)
        cpu = statistics.median(v[1] for v in values)
        trials = " ".join(f"{v[0]:,.0f}" for v in values)
        print(f"{name:<22} {rate:>8,.0f} {cpu:>11.1f}  {trials}")


if __name__ == "__main__":
    main()
