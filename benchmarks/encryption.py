"""The cost of encryption (and of signing) per job: N no-op jobs enqueued with
``enqueue_many``, drained by one in-process burst worker (each run decrypts and verifies the
payload, then encrypts and signs the result) and their results read back with
``Job.result()``, with encryption off/on and signing off/on, the four setups alternated in one
process so all see the same machine load. Prints the CPU µs per job of this process (producer
and worker: the server's time is neither's) for each phase, and the medians; on a busy
machine the CPU time is the steadier measure, the wall time is printed too.

    .venv/bin/python -m benchmarks.encryption [N] [repeats]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid
from typing import Any

from aioqueue import App, EmbeddedServer, Worker

SIGNING_KEY = "bench-signing-key-0123456789"
ENCRYPTION_KEY = "bench-encryption-key-0123456789"
SETUPS = {
    "plain": {},
    "signed": {"signing_key": SIGNING_KEY},
    "encrypted": {"encryption_key": ENCRYPTION_KEY},
    "signed+encrypted": {"signing_key": SIGNING_KEY, "encryption_key": ENCRYPTION_KEY},
}
PHASES = ("enqueue", "run", "result", "total")


async def one_run(url: str, n: int, options: dict[str, Any]) -> tuple[list[float], float]:
    """CPU µs per job of each phase (and the total), and the wall seconds of the whole."""
    app = App(url, prefix=f"eb{uuid.uuid4().hex[:8]}", **options)

    @app.task
    async def echo(i: int, text: str) -> dict[str, Any]:
        return {"i": i, "text": text}

    async with app:
        w0, c0 = time.perf_counter(), time.process_time()
        jobs = []
        for start in range(0, n, 5000):
            calls = [{"i": i, "text": "x" * 64} for i in range(start, min(start + 5000, n))]
            jobs += await echo.enqueue_many(calls)
        c1 = time.process_time()
        await Worker(app, concurrency=100, burst=True, idle_block=0.1).run()
        c2 = time.process_time()
        for start in range(0, n, 500):
            chunk = jobs[start : start + 500]
            values = await asyncio.gather(*(j.result(timeout=60) for j in chunk))
            assert [v["i"] for v in values] == list(range(start, start + len(chunk)))
        c3, w3 = time.process_time(), time.perf_counter()
    per = [(c1 - c0), (c2 - c1), (c3 - c2), (c3 - c0)]
    return [1e6 * x / n for x in per], w3 - w0


async def main(n: int, repeats: int) -> None:
    with EmbeddedServer() as server:
        runs: dict[str, list[tuple[list[float], float]]] = {k: [] for k in SETUPS}
        await one_run(server.url, min(n, 1000), {})  # warm up (imports, scripts loaded)
        for _ in range(repeats):
            for name, options in SETUPS.items():
                runs[name].append(await one_run(server.url, n, options))
        print(f"{n} jobs a run, {repeats} runs of each setup; CPU µs per job (median)")
        print(f"{'setup':18}" + "".join(f"{p:>10}" for p in PHASES) + f"{'wall s':>10}")
        base = statistics.median(r[0][3] for r in runs["plain"])
        for name, rs in runs.items():
            med = [statistics.median(r[0][i] for r in rs) for i in range(len(PHASES))]
            wall = statistics.median(r[1] for r in rs)
            extra = f"   (+{med[3] - base:.1f} µs/job)" if name != "plain" else ""
            print(f"{name:18}" + "".join(f"{m:10.1f}" for m in med) + f"{wall:10.2f}" + extra)


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    asyncio.run(main(n, int(sys.argv[2]) if len(sys.argv) > 2 else 5))
