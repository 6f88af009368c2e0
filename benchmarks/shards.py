#!/usr/bin/env python3
"""One queue against the same queue sharded: enqueue and drain throughput, and the server's
CPU per job (per node, so per shard on a cluster whose shards sit on separate primaries).

    .venv/bin/python benchmarks/shards.py                          # private embedded Valkey
    .venv/bin/python benchmarks/shards.py --url redis://host:6379/0 --shards 1,2,3,6
    .venv/bin/python benchmarks/shards.py --url redis://cluster-node:7000   # a cluster URL

For each K in ``--shards`` (K=1 is the plain queue, no sharding) and each repeat: empties
the benchmark's keys, enqueues ``--jobs`` no-op jobs with ``enqueue_many`` in chunks of 1,000
(timed: enqueue jobs/s), then times one in-process ``Worker`` (concurrency 100) draining them
until the last ack has landed (drain jobs/s). Around each phase it reads every primary's
``INFO cpu`` (``used_cpu_user`` + ``used_cpu_sys``) and ``INFO commandstats`` (script
time: EVALSHA and FCALL), and reports them per job. Prints a table; writes every trial to
``benchmarks/results/shards-latest.json``.

On one machine, the server's CPU per job is what to read: it should stay flat as K grows
(each shard's scripts do the same work per job), so K shards on K machines scale out.
docs/scaling.md explains how to project it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import platform
import statistics
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _loop import has_uvloop, run  # benchmarks/_loop.py, beside this file

from aioqueue import App, EmbeddedServer, Worker, __version__

RESULTS = Path(__file__).resolve().parent / "results"
PREFIX = "aqshards-"
CHUNK = 1000


@dataclass(slots=True)
class Trial:
    shards: int
    enqueue_per_s: float
    drain_per_s: float
    #: server CPU (user + sys, every primary) per job, µs, while enqueueing / draining
    enqueue_cpu_us: float
    drain_cpu_us: float
    #: script time per job (EVALSHA + FCALL, every primary), µs, enqueue + drain
    script_us: float
    #: drain CPU per job on each primary, µs
    per_node_cpu_us: dict[str, float]


async def node_infos(app: App, section: str) -> dict[str, dict[str, Any]]:
    """``INFO section`` of every primary, by address (one entry on a standalone server)."""
    client: Any = app.redis
    if hasattr(client, "get_primaries"):  # redis-py's RedisCluster
        out: dict[str, dict[str, Any]] = {}
        for node in client.get_primaries():
            out[node.name] = await client.info(section, target_nodes=node)
        return out
    kw = client.connection_pool.connection_kwargs
    return {f"{kw.get('host', 'unix')}:{kw.get('port', '')}": await client.info(section)}


async def sample(app: App) -> tuple[dict[str, float], float]:
    """(CPU seconds per node, script µs over all nodes)."""
    cpu = {
        n: float(i.get("used_cpu_user", 0)) + float(i.get("used_cpu_sys", 0))
        for n, i in (await node_infos(app, "cpu")).items()
    }
    script = 0.0
    for stats in (await node_infos(app, "commandstats")).values():
        for cmd in ("cmdstat_evalsha", "cmdstat_fcall", "cmdstat_eval"):
            script += float(stats.get(cmd, {}).get("usec", 0))
    return cpu, script


async def trial(url: str, k: int, jobs: int, concurrency: int) -> Trial:
    # a prefix of its own: counters start at 0 (purge_queue clears the jobs, not counters)
    prefix = f"{PREFIX}{uuid.uuid4().hex[:8]}"
    async with App(url, prefix=prefix, max_connections=200) as app:
        names = ["hot"] if k == 1 else [f"hot:s{i}" for i in range(k)]
        if k > 1:
            app.queue("hot", shards=k)
        ran = 0
        done = asyncio.Event()

        @app.task(name="noop", queue="hot")
        async def noop(i: int) -> None:
            nonlocal ran
            ran += 1
            if ran >= jobs:
                done.set()

        cpu0, script0 = await sample(app)
        t0 = time.perf_counter()
        for i in range(0, jobs, CHUNK):
            await noop.enqueue_many([{"i": j} for j in range(i, min(i + CHUNK, jobs))])
        t_enq = time.perf_counter() - t0
        cpu1, _ = await sample(app)
        worker = Worker(app, queues=["hot"], concurrency=concurrency)
        t1 = time.perf_counter()
        async with worker:
            await asyncio.wait_for(done.wait(), 900)
            await acked(app, names, jobs)
            t_drain = time.perf_counter() - t1
        cpu2, script2 = await sample(app)
        for name in names:
            await app.queue(name).purge_queue()
    return Trial(
        k,
        jobs / t_enq,
        jobs / t_drain,
        1e6 * sum(cpu1[n] - cpu0[n] for n in cpu0) / jobs,
        1e6 * sum(cpu2[n] - cpu1[n] for n in cpu1) / jobs,
        (script2 - script0) / jobs,
        {n: round(1e6 * (cpu2[n] - cpu1[n]) / jobs, 2) for n in cpu1},
    )


async def acked(app: App, names: list[str], n: int) -> None:
    """Return once the server counts ``n`` completed jobs (every job has run by then; this
    waits for the last acks, checking every millisecond)."""
    for _ in range(60_000):
        if sum([(await app.queue(q).stats()).get("completed", 0) for q in names]) >= n:
            return
        await asyncio.sleep(0.001)
    raise TimeoutError("the last acks never landed")


def best(trials: list[Trial]) -> Trial:
    return max(trials, key=lambda t: t.drain_per_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--url", help="the server or cluster (default: a private embedded Valkey)")
    ap.add_argument("--shards", default="1,2,3,6", help="comma-separated K values")
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-uvloop", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS / "shards-latest.json")
    args = ap.parse_args(argv)
    ks = [int(x) for x in args.shards.split(",") if x]
    use_uvloop = has_uvloop() and not args.no_uvloop
    server = None
    url = args.url
    if url is None:
        server = EmbeddedServer()
        server.start()
        url = server.url
    trials: list[Trial] = []
    try:
        for _ in range(args.repeats):
            for k in ks:
                t = run(trial(url, k, args.jobs, args.concurrency), use_uvloop)
                trials.append(t)
                print(
                    f"  K={k}: enqueue {t.enqueue_per_s:,.0f}/s  drain {t.drain_per_s:,.0f}/s",
                    file=sys.stderr,
                )
    finally:
        if server is not None:
            server.stop()
    print(f"aioqueue {__version__}, {args.jobs:,} no-op jobs, best of {args.repeats} (by drain)")
    head = "K  enqueue/s  drain/s  server CPU us/job (enq, drain)  script us/job  per node"
    print(head)
    rows = []
    for k in ks:
        mine = [t for t in trials if t.shards == k]
        b = best(mine)
        rows.append(
            {
                "shards": k,
                "best": asdict(b),
                "median_drain_per_s": statistics.median(t.drain_per_s for t in mine),
            }
        )
        nodes = ", ".join(f"{n} {v}" for n, v in b.per_node_cpu_us.items())
        print(
            f"{k:<2} {b.enqueue_per_s:>9,.0f} {b.drain_per_s:>8,.0f}"
            f"  {b.enqueue_cpu_us:>8.1f} {b.drain_cpu_us:>8.1f}"
            f"{'':>16}{b.script_us:>8.1f}  {nodes}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "when": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                "machine": platform.platform(),
                "python": platform.python_version(),
                "uvloop": use_uvloop,
                "jobs": args.jobs,
                "rows": rows,
                "trials": [asdict(t) for t in trials],
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
