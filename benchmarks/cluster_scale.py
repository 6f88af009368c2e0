"""Past one node (issue 26, point 4): one hot queue sharded over 1, 2 and 3 primaries of a
local Valkey Cluster, one worker process per primary, each serving the shard on its primary.

    .venv/bin/python benchmarks/cluster_scale.py [--primaries 1,2,3] [--jobs 20000] [--repeats 3]

For each P: a cluster of P primaries (no replicas; ``tests/support/cluster.py``) is started,
the queue ``hot`` is declared with ``shards=K`` (a plain queue for P = 1) under a base name
whose K shards fall evenly on the P primaries (K = P when a name allows it; see ``spread``),
``--jobs`` no-op jobs per primary are queued with ``enqueue_many`` (round-robin over the
shards), then P ``python -m aioqueue worker --burst --concurrency 100`` processes are spawned
at once, worker i serving the shards on primary i. The
parent counts completed jobs every 10 ms: **steady** throughput is from the first completion
to the last, **from spawn** includes the workers' start. Per primary: its ``INFO cpu`` over
the drain, per job it ran; the workers' CPU (rusage, their start included) per job. Each
figure: the best and the median of the repeats (P alternates: 1, 2, 3, then 3, 2, 1, ...).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redis.crc import key_slot  # noqa: E402

from tests.support.cluster import SLOTS, LocalCluster  # noqa: E402

APP_MODULE = """
import os
import resource
from aioqueue import App

app = App(os.environ["CS_URL"], prefix=os.environ["CS_PREFIX"])


@app.task(name="noop")
async def noop(i: int) -> None:
    return None
"""


def shard_names(base: str, k: int) -> list[str]:
    return [base] if k == 1 else [f"{base}:s{i}" for i in range(k)]


def owner(name: str, p: int) -> int:
    """The primary (0..P-1) owning a queue's hash tag, the slots split evenly in order as
    ``LocalCluster`` (and ``valkey-cli --cluster create``) split them."""
    return min(key_slot(name.encode()) // (SLOTS // p), p - 1)


def spread(p: int) -> tuple[str, int, list[list[str]]]:
    """(base name, K, the shards on each primary): the fewest shards K >= P under a base name
    whose shards fall evenly on the P primaries. Not always K = P: the shards' names differ
    only in their last characters, and CRC-16 then flips fixed bits of the slot ('hot:s0' and
    'hot:s1' always differ by 0x1021), so for P = 2 the slots of s0 and s1 fall in the same
    half of the slots under every base name."""
    for k in (p, 2 * p, 3 * p, 4 * p):
        for n in range(200):
            base = "hot" if n == 0 else f"hot{n}"
            on: list[list[str]] = [[] for _ in range(p)]
            for s in shard_names(base, k):
                on[owner(s, p)].append(s)
            if all(len(x) == k // p for x in on):
                return base, k, on
    raise SystemExit(f"no base name spreads its shards evenly over {p} primaries")


async def node_cpu(client: Any) -> dict[str, float]:
    out = {}
    for node in client.get_primaries():
        i = await client.info("cpu", target_nodes=node)
        out[node.name] = float(i["used_cpu_user"]) + float(i["used_cpu_sys"])
    return out


def spawn(on: list[list[str]], work: Path, env: dict[str, str]) -> list[subprocess.Popen[bytes]]:
    """One burst worker per primary, serving the shards there."""
    procs = []
    for mine in on:
        argv = [sys.executable, "-m", "aioqueue", "worker", "csapp:app"]
        argv += [a for q in mine for a in ("--queue", q)]
        argv += ["--burst", "--concurrency", "100", "--log-level", "WARNING"]
        procs.append(subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.DEVNULL))
    return procs


async def trial(url: str, p: int, n: int, work: Path) -> dict[str, Any]:
    from aioqueue import App

    base, k, on = spread(p)
    names = shard_names(base, k)
    prefix = f"cs{uuid.uuid4().hex[:8]}"  # counters of its own
    app = App(url, prefix=prefix, max_connections=200)
    if k > 1:
        app.queue(base, shards=k)

    @app.task(name="noop", queue=base)
    async def noop(i: int) -> None:
        return None

    async with app:
        total = n * p
        for c in range(0, total, 5000):
            await noop.enqueue_many([{"i": i} for i in range(c, min(c + 5000, total))])
        queued = [(await app.queue(q).counts())["queued"] for q in names]
        cpu0 = await node_cpu(app.redis)
        env = dict(
            os.environ,
            CS_URL=url,
            CS_PREFIX=prefix,
            PYTHONPATH=os.pathsep.join([str(work), str(ROOT)]),
        )
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        procs = spawn(on, work, env)
        first = last = None
        while True:
            done = sum([(await app.queue(q).stats()).get("completed", 0) for q in names])
            now = time.perf_counter()
            if done and first is None:
                first = now
            if done >= total:
                last = now
                break
            if all(pr.poll() is not None for pr in procs) and done < total:
                raise SystemExit(f"the workers exited with {done} of {total} completed")
            await asyncio.sleep(0.01)
        cpu1 = await node_cpu(app.redis)
        for pr in procs:
            if pr.wait():
                raise SystemExit(f"a worker failed (exit {pr.returncode})")
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        worker_cpu = ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
        for q in names:
            await app.queue(q).purge_queue()
    assert first is not None
    assert last is not None
    return {
        "primaries": p,
        "shards_per_primary": on,
        "queued_per_shard": queued,
        "steady_jobs_s": total / (last - first),
        "from_spawn_jobs_s": total / (last - t0),
        "per_primary_steady_jobs_s": total / (last - first) / p,
        "server_cpu_us_per_job": {k: 1e6 * (cpu1[k] - cpu0[k]) / n for k in cpu0},
        "worker_cpu_us_per_job": 1e6 * worker_cpu / total,  # the workers' CPU, start included
        "load": os.getloadavg()[0],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--primaries", default="1,2,3")
    ap.add_argument("--jobs", type=int, default=20_000, help="jobs per primary")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, help="also write every trial here")
    a = ap.parse_args()
    ps = [int(x) for x in a.primaries.split(",")]
    runs: dict[int, list[dict[str, Any]]] = {p: [] for p in ps}
    clusters = {}
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        (work / "csapp.py").write_text(APP_MODULE)
        try:
            for p in ps:
                clusters[p] = LocalCluster(primaries=p, replicas=0, node_timeout_ms=30_000)
                clusters[p].start()
            for rnd in range(a.repeats):
                for p in ps if rnd % 2 == 0 else ps[::-1]:
                    res = asyncio.run(trial(clusters[p].url, p, a.jobs, work))
                    runs[p].append(res)
                    print(json.dumps(res), flush=True)
        finally:
            for c in clusters.values():
                c.stop()
    print(f"one hot queue over P primaries, one worker each, {a.jobs:,} jobs per primary")
    print("P  steady jobs/s (best, median)  per primary  from spawn  server CPU µs/job per primary")
    for p, rs in runs.items():
        best = max(rs, key=lambda r: r["steady_jobs_s"])
        med = statistics.median(r["steady_jobs_s"] for r in rs)
        cpu = " / ".join(f"{v:.1f}" for v in best["server_cpu_us_per_job"].values())
        print(
            f"{p}  {best['steady_jobs_s']:>10,.0f} {med:>10,.0f}  "
            f"{best['per_primary_steady_jobs_s']:>10,.0f}  "
            f"{best['from_spawn_jobs_s']:>9,.0f}  {cpu}"
        )
    if a.json:
        a.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
