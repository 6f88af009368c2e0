"""P1, P1raw, S1: the pull API (reserve + complete) against its bare redis-py floor, and the
cost per job and memory per queued job at 10k / 100k / 1M queued jobs."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .common import cpu_mark, cpu_per_job, fresh, noop_app, prefill, pull_drain, used_memory

if TYPE_CHECKING:
    import redis.asyncio as aioredis


async def wl_p1(url: str, p: dict[str, Any]) -> dict[str, Any]:
    n, c, batch = int(p["n"]), int(p["concurrency"]), int(p["batch"])
    await fresh(url)
    app, task = noop_app(url)
    async with app:
        prefill_s = await prefill(task, n, int(p["chunk"]))
        m0 = await cpu_mark(url)
        done, dt = await pull_drain(app, None, c, batch)
        m1 = await cpu_mark(url)
        q = app.queue()
        counts, stats = await q.counts(), await q.stats()
    if done != n or counts["queued"] or counts["active"] or stats.get("completed") != n:
        raise RuntimeError(f"drained {done}/{n}; counts {counts}; stats {stats}")
    return {
        "jobs_per_s": n / dt,
        "seconds": dt,
        "us_per_job": 1e6 * dt / n,
        "prefill_jobs_per_s": n / prefill_s,
        **cpu_per_job(m0, m1, n),
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
    await fresh(url)
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

        m0 = await cpu_mark(url)
        t0 = time.perf_counter()
        await asyncio.gather(*(consumer() for _ in range(c)))
        dt = time.perf_counter() - t0
        m1 = await cpu_mark(url)
        left = int(await r.llen(RAW_QUEUE)) + int(await r.zcard(RAW_LEASES))
    finally:
        await r.aclose()
    if done != n or left:
        raise RuntimeError(f"drained {done}/{n}, {left} left")
    return {"jobs_per_s": n / dt, "seconds": dt, "us_per_job": 1e6 * dt / n} | cpu_per_job(
        m0, m1, n
    )


# --------------------------------------------------------------------------- #
# S1: scale                                                                    #
# --------------------------------------------------------------------------- #
async def _raw_bytes_per_job(url: str, size: int, chunk: int) -> float:
    """The raw floor's memory per queued job: an RPUSHed JSON payload each."""
    import redis.asyncio as aioredis

    await fresh(url)
    mem0 = await used_memory(url)
    r = aioredis.Redis.from_url(url)
    try:
        await _raw_prefill(r, size, chunk)
    finally:
        await r.aclose()
    return (await used_memory(url) - mem0) / size


async def wl_s1(url: str, p: dict[str, Any]) -> dict[str, Any]:
    """One size of the scale run: queue ``size`` jobs, memory, then the cost per job at that
    depth: ``probes`` timed enqueue_many calls of ``probe`` jobs each (median), then a drain of
    a sample."""
    size, chunk, sample = int(p["size"]), int(p["chunk"]), int(p["sample"])
    probe, probes = int(p["probe"]), int(p["probes"])
    c, batch = int(p["concurrency"]), int(p["batch"])
    raw_bytes = await _raw_bytes_per_job(url, size, chunk)

    await fresh(url)
    mem0 = await used_memory(url)
    app, task = noop_app(url)
    async with app:
        fill_s = await prefill(task, size, chunk)
        mem1 = await used_memory(url)
        m0 = await cpu_mark(url)
        probe_s = [await prefill(task, probe, probe) for _ in range(probes)]
        m1 = await cpu_mark(url)
        enq_s = statistics.median(probe_s)
        queued = size + probe * probes
        k = min(queued, sample)
        m2 = await cpu_mark(url)
        done, drain_s = await pull_drain(app, k, c, batch)
        m3 = await cpu_mark(url)
        counts = await app.queue().counts()
    if done != k or counts["queued"] != queued - k:
        raise RuntimeError(f"drained {done}/{k}; counts {counts}")
    await fresh(url)  # give the memory back before the next size
    return {
        "size": size,
        "raw_bytes_per_job": raw_bytes,
        "fill_us_per_job": 1e6 * fill_s / size,
        "enqueue_us_per_job": 1e6 * enq_s / probe,
        "enqueue_us_per_job_probes": [round(1e6 * x / probe, 2) for x in probe_s],
        "enqueue_jobs_per_s": probe / enq_s,
        "bytes_per_job": (mem1 - mem0) / size,
        "drained": k,
        "drain_us_per_job": 1e6 * drain_s / k,
        "drain_jobs_per_s": k / drain_s,
        "jobs_per_s": probe / enq_s,
        **cpu_per_job(m0, m1, probe * probes, "enqueue_"),
        **cpu_per_job(m2, m3, k, "drain_"),
    }
