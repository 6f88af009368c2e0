#!/usr/bin/env python3
"""What a workflow costs: a fan-out/fan-in of N steps against N plain jobs, in one run.

    .venv/bin/python benchmarks/workflows.py                   # 10,000 steps, 3 repeats
    .venv/bin/python benchmarks/workflows.py --jobs 2000 --repeats 1

Starts a private embedded Valkey (no AOF). For each repeat, interleaved, on an emptied server:

    plain      a Worker (in-process, concurrency 100, uvloop when installed, a no-op async
               task) is started and idle; timed from ``enqueue_many`` of N jobs until the
               queue's stats say ``completed == N``
    workflow   the same Worker; timed from ``app.workflow(...).enqueue()`` of one root, N - 2
               steps after it and one sink after all of them, until the sink's result is
               read (every step run, every dependency counted)

Prints the medians, the workflow's throughput as a fraction of the plain one (the target of
issue 27: at least 0.7) and the server's script time per job, and writes everything to
``benchmarks/results/workflows-latest.json``. Also the rate once running (``steady``: N over
the time from the first job's start to the last one's end, as the peers' W2 steady): the
plain side starts running while it is still enqueueing, the workflow only once its whole
graph is stored, so this one leaves storing out of both.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from _loop import has_uvloop, run  # benchmarks/_loop.py, beside this file
from batch_overhead import fresh, script_usec, server_version, until_completed

from aioqueue import App, EmbeddedServer, Task, Worker, __version__

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True, slots=True)
class Config:
    jobs: int
    concurrency: int
    repeats: int
    uvloop: bool


@dataclass(slots=True)
class Trial:
    plain_s: float
    workflow_s: float
    workflow_enqueue_s: float  # storing the graph alone (part of workflow_s)
    plain_server_us_per_job: float
    workflow_server_us_per_job: float
    plain_steady_s: float  # first job's start to the last one's end
    workflow_steady_s: float


async def trial(url: str, cfg: Config) -> Trial:
    n = cfg.jobs
    async with App(url, prefix="bench", max_connections=200) as app:
        ran = 0
        span = [math.inf, 0.0]  # the first start, the last end

        @app.task(name="noop")
        async def noop(i: int) -> int:
            nonlocal ran
            ran += 1
            now = time.perf_counter()
            if now < span[0]:
                span[0] = now
            span[1] = now
            return i

        task: Task[[int], int] = noop

        await fresh(app)
        async with Worker(app, concurrency=cfg.concurrency, idle_block=1.0):
            await asyncio.sleep(0.2)
            usec0 = await script_usec(app)
            t0 = time.perf_counter()
            await task.enqueue_many([{"i": i} for i in range(n)])
            await until_completed(app, n)
            plain_s = time.perf_counter() - t0
            plain_us = (await script_usec(app) - usec0) / n
        assert ran == n, ran
        plain_steady = span[1] - span[0]

        await fresh(app)
        ran = 0
        span[:] = [math.inf, 0.0]
        async with Worker(app, concurrency=cfg.concurrency, idle_block=1.0):
            await asyncio.sleep(0.2)
            usec0 = await script_usec(app)
            t0 = time.perf_counter()
            wf = app.workflow("bench")
            root = wf.step("root", task.call(0))
            mids = [wf.step(f"m{i}", task.call(i), after=[root]) for i in range(1, n - 1)]
            wf.step("sink", task.call(n - 1), after=mids)
            handle = await wf.enqueue()
            enq_s = time.perf_counter() - t0
            assert await handle.result(timeout=600) == n - 1
            workflow_s = time.perf_counter() - t0
            workflow_us = (await script_usec(app) - usec0) / n
        assert ran == n, ran
        workflow_steady = span[1] - span[0]
        await app.redis.flushall()
    return Trial(plain_s, workflow_s, enq_s, plain_us, workflow_us, plain_steady, workflow_steady)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-uvloop", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS / "workflows-latest.json")
    args = ap.parse_args(argv)
    cfg = Config(args.jobs, args.concurrency, args.repeats, has_uvloop() and not args.no_uvloop)
    trials: list[Trial] = []
    with EmbeddedServer(appendonly=False) as server:
        for r in range(cfg.repeats):
            t = run(trial(server.url, cfg), cfg.uvloop)
            trials.append(t)
            print(
                f"  repeat {r + 1}/{cfg.repeats}: plain {t.plain_s:.3f} s, "
                f"workflow {t.workflow_s:.3f} s",
                file=sys.stderr,
            )
        version = asyncio.run(server_version(server.url))

    def med(field: str) -> float:
        return float(statistics.median(getattr(t, field) for t in trials))

    n = cfg.jobs
    plain, flow = med("plain_s"), med("workflow_s")
    summary = {
        "plain_s": plain,
        "workflow_s": flow,
        "workflow_enqueue_s": med("workflow_enqueue_s"),
        "plain_jobs_per_s": n / plain,
        "workflow_steps_per_s": n / flow,
        "ratio": plain / flow,
        "plain_server_us_per_job": med("plain_server_us_per_job"),
        "workflow_server_us_per_job": med("workflow_server_us_per_job"),
        "plain_steady_per_s": n / med("plain_steady_s"),
        "workflow_steady_per_s": n / med("workflow_steady_s"),
        "steady_ratio": med("plain_steady_s") / med("workflow_steady_s"),
    }
    s = summary
    table = "\n".join(
        [
            f"{n:,} no-op jobs / a fan-out/fan-in of {n:,} steps, one in-process Worker at "
            f"concurrency {cfg.concurrency} ({'uvloop' if cfg.uvloop else 'asyncio'}), "
            f"median of {cfg.repeats}; Valkey {version}",
            "",
            "| measure                     |      plain |   workflow |",
            "|-----------------------------|------------|------------|",
            f"| enqueue + run all (s)       | {plain:>10.3f} | {flow:>10.3f} |",
            f"| jobs per second             | {s['plain_jobs_per_s']:>10.0f} | "
            f"{s['workflow_steps_per_s']:>10.0f} |",
            f"| server script time (us/job) | {s['plain_server_us_per_job']:>10.1f} | "
            f"{s['workflow_server_us_per_job']:>10.1f} |",
            f"| once running (jobs/s)       | {s['plain_steady_per_s']:>10.0f} | "
            f"{s['workflow_steady_per_s']:>10.0f} |",
            "",
            f"workflow throughput / plain: {s['ratio']:.2f} (target >= 0.7); storing the "
            f"graph alone: {s['workflow_enqueue_s']:.3f} s; once running: "
            f"{s['steady_ratio']:.2f}",
        ]
    )
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
