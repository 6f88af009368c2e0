"""The cost of observability on W2: a drain of N no-op jobs (queued in advance with
``enqueue_many``, timed too), run by one in-process burst worker (concurrency 100), once per
variant and round, the variants alternated so each sees the same machine load. Each run is a
fresh process on one embedded Valkey and a fresh key prefix; it reports wall-clock jobs/s, this
process's CPU µs per job and the server's (``INFO cpu``), and the medians over the rounds with
each variant's ratio to ``off``.

Variants (``VARIANTS``): ``off`` (events and metrics off, the defaults), ``events`` (the
queue's event stream on, capped at 10,000), ``metrics`` (the worker's Prometheus metrics on,
``Worker(metrics=WorkerMetrics())``) and ``both``. With ``--base DIR`` (an
export of an older aioqueue, e.g. ``git archive d5035fd aioqueue | tar -x -C DIR``) the variant
``before`` runs ``off`` on that code, to compare "off" with the code before events existed.

    .venv/bin/python -m benchmarks.observability [--jobs N] [--rounds R] [--base DIR]
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
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


async def _events_on(app: Any) -> None:
    await app.queue().set_events(10_000)


async def _nothing(app: Any) -> None:
    return None


#: variant -> what it switches on in the App before the run (and the code it runs: "before"
#: is "off" on the --base export)
VARIANTS: dict[str, Callable[[Any], Awaitable[None]]] = {
    "off": _nothing,
    "events": _events_on,
    "metrics": _nothing,
    "both": _events_on,
}
#: the variants whose worker keeps Prometheus metrics (aioqueue[metrics])
WITH_METRICS = frozenset({"metrics", "both"})


async def _server_cpu(client: Any) -> float:
    info = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def _script_us(client: Any) -> float:
    """The server's time in scripts so far (INFO commandstats: FCALL, EVALSHA and EVAL), in µs."""
    stats = await client.info("commandstats")
    return float(
        sum(stats.get(f"cmdstat_{c}", {}).get("usec", 0) for c in ("evalsha", "eval", "fcall"))
    )


async def one_run(url: str, n: int, variant: str) -> dict[str, float]:
    """One drain in this process (the child's side)."""
    from aioqueue import App, Worker

    app = App(url, prefix=f"ob{uuid.uuid4().hex[:8]}")

    @app.task
    async def noop(i: int) -> None:
        return None

    async with app:
        await VARIANTS.get(variant, _nothing)(app)
        u0, t0 = await _script_us(app.redis), time.perf_counter()
        for start in range(0, n, 5000):
            await noop.enqueue_many([{"i": i} for i in range(start, min(start + 5000, n))])
        u1, s1, t1 = await _script_us(app.redis), await _server_cpu(app.redis), time.perf_counter()
        c1 = time.process_time()
        observer = None
        if variant in WITH_METRICS:
            from aioqueue.metrics import WorkerMetrics

            observer = WorkerMetrics()
        extra = {} if observer is None else {"metrics": observer}  # "before" has no metrics=
        await Worker(app, concurrency=100, burst=True, idle_block=0.1, **extra).run()
        s2, t2, c2 = await _server_cpu(app.redis), time.perf_counter(), time.process_time()
        u2 = await _script_us(app.redis)
        assert (await app.queue().stats())["completed"] == n
        await app.redis.flushdb()  # keep the server's memory the same for every run
    return {
        "enqueue_jobs_s": n / (t1 - t0),
        "drain_jobs_s": n / (t2 - t1),
        "drain_client_cpu_us": (c2 - c1) / n * 1e6,
        "drain_server_cpu_us": (s2 - s1) / n * 1e6,
        "drain_script_us": (u2 - u1) / n,
        "enqueue_script_us": (u1 - u0) / n,
    }


def spawn(url: str, n: int, variant: str, base: str | None) -> dict[str, float]:
    env = dict(os.environ)
    cwd = ROOT
    if variant == "before":
        # the export first on the path, and as the working directory (-m puts it first)
        assert base is not None
        env["PYTHONPATH"] = f"{base}{os.pathsep}{ROOT}"
        cwd, variant = Path(base), "off"
    args = [sys.executable, "-m", "benchmarks.observability", "--child", url]
    args += ["--jobs", str(n), "--variant", variant]
    out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"{variant} run failed:\n{out.stderr}")
    return dict(json.loads(out.stdout.splitlines()[-1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--base", help="an export of older aioqueue code: adds the variant 'before'")
    p.add_argument("--child", help=argparse.SUPPRESS)  # a run's own process: the server URL
    p.add_argument("--variant", default="off", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(asyncio.run(one_run(a.child, a.jobs, a.variant))))
        return
    from aioqueue import EmbeddedServer

    names = [*VARIANTS, *(["before"] if a.base else [])]
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in names}
    with EmbeddedServer() as server:
        for r in range(a.rounds):
            order = names if r % 2 == 0 else names[::-1]
            for v in order:
                runs[v].append(spawn(server.url, a.jobs, v, a.base))
    cols = list(runs["off"][0])
    med = {v: {c: statistics.median(x[c] for x in rs) for c in cols} for v, rs in runs.items()}
    # the best round of each (most jobs/s, least µs): the least disturbed by other load
    best = {
        v: {c: (max if c.endswith("_s") else min)(x[c] for x in rs) for c in cols}
        for v, rs in runs.items()
    }
    for title, table in (("medians", med), ("best round", best)):
        print(f"W2-style drain of {a.jobs:,} no-op jobs, {a.rounds} rounds, {title}")
        print(f"{'variant':<8}" + "".join(f"{c:>22}" for c in cols) + f"{'drain vs off':>14}")
        for v in names:
            ratio = table[v]["drain_jobs_s"] / table["off"]["drain_jobs_s"]
            row = "".join(f"{table[v][c]:>22.1f}" for c in cols)
            print(f"{v:<8}{row}{ratio:>14.3f}")
    for v in names:
        print(v, "drain jobs/s by round:", " ".join(f"{x['drain_jobs_s']:.0f}" for x in runs[v]))


if __name__ == "__main__":
    main()
