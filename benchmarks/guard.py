"""The CI guard against a slower drain: a short benchmark (well under a minute) that runs the
``raw`` floor and aioqueue side by side on one server, alternated, and fails when aioqueue's
ratio to the floor drops below a floor of its own, or when a drain costs more server commands
per job than it may.

    .venv/bin/python benchmarks/guard.py [--rounds 3] [--jobs 5000] [--json FILE]

Each trial is a process of its own (a fresh prefix on one embedded Valkey, emptied before):

* **W2**: ``--jobs`` no-op jobs queued in bulk, then one worker (concurrency 100) drains them;
  jobs/s from the worker's start to the last ack. aioqueue runs ``Worker(burst=True)`` in
  process; ``raw`` is the floor of the peers' harness in miniature (a list of JSON payloads, a
  script that pops a batch and records their leases in a ZSET, acks by ``ZREM`` sent along
  with the next claim), written here with bare redis-py.
* **W1**: ``--w1-jobs`` jobs enqueued one by one, each awaited (``RPUSH`` for raw).
* **commands per job**: every command the server ran during aioqueue's drain (``INFO
  commandstats``, the commands inside scripts included) over the jobs. It does not depend on
  load at all, so a feature that adds work per job fails here even on a quiet machine.

The rounds alternate (raw, aioqueue; aioqueue, raw; ...), so both see the same load, and each
ratio takes the **best** trial of each side: a busy machine slows some trials, rarely all of
them. The floors (``FLOORS``) and how they were set: docs/benchmarks.md, "The CI guard".
Exit status 1 with one line per broken floor; 0 with the figures otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()

#: the least aioqueue/raw ratio of each figure, and the most server commands per drained job
#: (derivation: docs/benchmarks.md, "The CI guard")
FLOORS = {"w2_ratio": 0.075, "w2_cost_ratio": 0.125, "w1_ratio": 0.15}
MAX_COMMANDS_PER_JOB = 6.5

#: the floor's claim: pop up to ARGV[1] payloads, lease each until ARGV[2] (ms)
RAW_CLAIM = """
local got = redis.call('LPOP', KEYS[1], ARGV[1])
if not got then return {} end
local z = {}
for i, p in ipairs(got) do z[2 * i - 1] = ARGV[2]; z[2 * i] = p end
redis.call('ZADD', KEYS[2], unpack(z))
return got
"""


def _loop_run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


async def _server_cpu(r: Any) -> float:
    info = await r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def _commands(r: Any) -> int:
    stats = await r.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k.startswith("cmdstat_"))


async def raw_trial(url: str, n: int, n1: int) -> dict[str, float]:
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(url)
    q, leases = f"raw:{uuid.uuid4().hex[:8]}", "raw:leases"

    def payload(i: int) -> str:
        return json.dumps([f"j{i}", "noop", {"i": i}])

    t0 = time.perf_counter()
    for i in range(n1):
        await r.rpush(q, payload(i))
    w1 = n1 / (time.perf_counter() - t0)
    async with r.pipeline(transaction=False) as pipe:  # the W1 jobs are drained too
        for i in range(n1, n):
            pipe.rpush(q, payload(i))
        await pipe.execute()

    async def noop(i: int) -> None:
        return None

    sha = await r.script_load(RAW_CLAIM)
    limit, acks = 100, []
    running: set[asyncio.Task[None]] = set()
    done, slot = 0, asyncio.Event()

    async def run(p: bytes) -> None:
        nonlocal done
        _id, _task, kwargs = json.loads(p)
        await noop(**kwargs)
        acks.append(p)
        done += 1

    def finished(t: asyncio.Task[None]) -> None:
        running.discard(t)
        slot.set()

    s0, c0, t0 = await _server_cpu(r), time.process_time(), time.perf_counter()
    while done < n:
        want = limit - len(running)
        if want <= 0:
            slot.clear()
            await slot.wait()
            continue
        async with r.pipeline(transaction=False) as pipe:
            if acks:
                pipe.zrem(leases, *acks)
                acks = []
            pipe.evalsha(sha, 2, q, leases, want, int(time.time() * 1000) + 30_000)
            got = (await pipe.execute())[-1]
        for p in got:
            t = asyncio.create_task(run(p))
            running.add(t)
            t.add_done_callback(finished)
        if not got:
            slot.clear()
            if running:
                await slot.wait()
    if acks:
        await r.zrem(leases, *acks)
    w2, c1 = n / (time.perf_counter() - t0), time.process_time()
    cost = (c1 - c0 + await _server_cpu(r) - s0) / n * 1e6
    await r.aclose()
    return {"w1_jobs_s": w1, "w2_jobs_s": w2, "w2_cpu_us": cost}


async def aioqueue_trial(url: str, n: int, n1: int) -> dict[str, float]:
    from aioqueue import App, Worker

    app = App(url, prefix=f"g{uuid.uuid4().hex[:8]}")

    @app.task(name="noop")
    async def noop(i: int) -> None:
        return None

    async with app:
        t0 = time.perf_counter()
        for i in range(n1):
            await noop.enqueue(i=i)
        w1 = n1 / (time.perf_counter() - t0)
        for s in range(n1, n, 5000):  # the W1 jobs are drained too
            await noop.enqueue_many([{"i": i} for i in range(s, min(s + 5000, n))])
        r = app.redis
        s0, k0 = await _server_cpu(r), await _commands(r)
        c0, t0 = time.process_time(), time.perf_counter()
        await Worker(app, concurrency=100, burst=True).run()
        w2, c1 = n / (time.perf_counter() - t0), time.process_time()
        cost = (c1 - c0 + await _server_cpu(r) - s0) / n * 1e6
        commands = (await _commands(r) - k0 - 2) / n  # less the two INFOs of these counts
        done = (await app.queue().stats())["completed"]
        if done != n:
            raise SystemExit(f"aioqueue's drain completed {done} of {n} jobs")
    return {"w1_jobs_s": w1, "w2_jobs_s": w2, "w2_cpu_us": cost, "commands_per_job": commands}


TRIALS = {"raw": raw_trial, "aioqueue": aioqueue_trial}


def spawn(kind: str, url: str, n: int, n1: int) -> dict[str, float]:
    import redis

    redis.Redis.from_url(url).flushall()
    args = [sys.executable, str(HERE), "--child", kind, "--url", url]
    args += ["--jobs", str(n), "--w1-jobs", str(n1)]
    out = subprocess.run(args, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"guard: the {kind} trial failed:\n{out.stderr}{out.stdout}")
    return dict(json.loads(out.stdout.splitlines()[-1]))


def ratios(best: dict[str, dict[str, float]]) -> dict[str, float]:
    """aioqueue over raw, each the higher the better: W2 and W1 jobs/s, and W2's CPU cost
    (worker process plus server, per job) as raw's over aioqueue's."""
    raw, aq = best["raw"], best["aioqueue"]
    return {
        "w2_ratio": aq["w2_jobs_s"] / raw["w2_jobs_s"],
        "w2_cost_ratio": raw["w2_cpu_us"] / aq["w2_cpu_us"],
        "w1_ratio": aq["w1_jobs_s"] / raw["w1_jobs_s"],
    }


def verdict(
    best: dict[str, dict[str, float]], floors: dict[str, float], max_cmd: float
) -> list[str]:
    """The broken floors, one line each (empty: the guard passes)."""
    raw, aq = best["raw"], best["aioqueue"]
    broken = []
    for name, ratio in ratios(best).items():
        if ratio < floors[name]:
            if name == "w2_cost_ratio":
                what = f"CPU µs per job: aioqueue {aq['w2_cpu_us']:.1f}, raw {raw['w2_cpu_us']:.1f}"
            else:
                key = f"{name[:2]}_jobs_s"
                what = f"jobs/s: aioqueue {aq[key]:,.0f}, raw {raw[key]:,.0f}"
            broken.append(
                f"{name} = {ratio:.3f} < floor {floors[name]:g} ({what}; best trial of each)"
            )
    if aq["commands_per_job"] > max_cmd:
        broken.append(
            f"W2 server commands per job = {aq['commands_per_job']:.2f} > {max_cmd:.2f} "
            "(INFO commandstats, the commands inside scripts included)"
        )
    return broken


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=5000, help="W2: jobs drained per trial (5000)")
    p.add_argument("--w1-jobs", type=int, default=500, help="W1: jobs enqueued per trial (500)")
    p.add_argument("--json", help="also write every trial and the verdict here")
    p.add_argument("--child", choices=sorted(TRIALS), help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(_loop_run(TRIALS[a.child](a.url, a.jobs, a.w1_jobs))))
        return 0
    from aioqueue import EmbeddedServer

    t_start = time.perf_counter()
    runs: dict[str, list[dict[str, float]]] = {"raw": [], "aioqueue": []}
    with EmbeddedServer() as server:
        for rnd in range(a.rounds):
            for kind in ("raw", "aioqueue") if rnd % 2 == 0 else ("aioqueue", "raw"):
                runs[kind].append(spawn(kind, server.url, a.jobs, a.w1_jobs))
    # the best trial of each: most jobs/s, least CPU and commands per job
    best = {
        k: {c: (max if c.endswith("_s") else min)(x[c] for x in rs) for c in rs[0]}
        for k, rs in runs.items()
    }
    broken = verdict(best, FLOORS, MAX_COMMANDS_PER_JOB)
    load = os.getloadavg()[0]
    print(
        f"guard: {a.rounds} alternated rounds in {time.perf_counter() - t_start:.1f} s, "
        f"load average {load:.2f}"
    )
    for k, rs in runs.items():
        w2 = " ".join(f"{x['w2_jobs_s']:,.0f}" for x in rs)
        cpu = " ".join(f"{x['w2_cpu_us']:.1f}" for x in rs)
        w1 = " ".join(f"{x['w1_jobs_s']:,.0f}" for x in rs)
        print(f"  {k:<9} W2 jobs/s {w2:<22} W2 CPU µs/job {cpu:<17} W1 jobs/s {w1}")
    aq, got = best["aioqueue"], ratios(best)
    print("  " + ", ".join(f"{k} {v:.3f} (floor {FLOORS[k]})" for k, v in got.items()))
    print(f"  W2 commands/job {aq['commands_per_job']:.2f} (at most {MAX_COMMANDS_PER_JOB})")
    if a.json:
        Path(a.json).write_text(json.dumps({"runs": runs, "best": best, "broken": broken}))
    for line in broken:
        print(f"guard: FAIL: {line}", file=sys.stderr)
    if broken:
        print(
            "guard: the drain got slower than the floor allows; bisect with "
            "benchmarks/drain_cost.py (docs/benchmarks.md)",
            file=sys.stderr,
        )
        return 1
    print("guard: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
