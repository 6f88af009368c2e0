"""Large payloads: bytes stored in Redis per job (``MEMORY USAGE`` of its record) and µs per
job (enqueue, run by an in-process burst worker, result read back) for JSON arguments of about
1 KB, 100 KB and 5 MB, repetitive and less repetitive (``benchmarks/codecs.py`` makes them),
stored plain, compressed (zstd, from 1 KiB) and claim-checked (a file store, every payload of
512 bytes or more; compressed too). The setups alternate in one run, so all see the same
machine load; medians of the repeats. Each job returns how many rows it got, so the result
read back is small and the payload is what is measured.

    .venv/bin/python -m benchmarks.payloads [repeats]
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

from aioqueue import App, ClaimCheck, EmbeddedServer, Worker
from benchmarks.codecs import payload
from examples.payload_stores import FileStore

#: (label, size in bytes, jobs a run): 5 MB x 20 jobs keeps a run near 100 MB
SIZES = (("1 KB", 1_000, 1000), ("100 KB", 100_000, 200), ("5 MB", 5_000_000, 20))


def setups(root: str) -> dict[str, dict[str, Any]]:
    return {
        "plain": {},
        "compressed": {"compression": "zstd"},
        "claim-check": {
            "compression": "zstd",
            "payload_store": ClaimCheck(FileStore(root), above=512),
        },
    }


async def one_run(url: str, data: bytes, n: int, options: dict[str, Any]) -> tuple[float, int]:
    """Wall µs per job (enqueue + run + result) and the bytes of one job's record."""
    app = App(url, prefix=f"pb{uuid.uuid4().hex[:8]}", max_payload_bytes=0, **options)

    @app.task
    async def measure(rows: list[Any]) -> int:
        return len(rows)

    rows = json.loads(data)[0][0]
    async with app:
        t0 = time.perf_counter()
        jobs = [await measure.enqueue(rows) for _ in range(n)]
        record = app.queue("default")._keys.job(jobs[0].id)
        size = int(await app.redis.execute_command("MEMORY", "USAGE", record, "SAMPLES", "0"))
        await Worker(app, concurrency=16, burst=True, idle_block=0.1).run()
        for job in jobs:
            assert await job.result(timeout=120) == len(rows)
        wall = time.perf_counter() - t0
    return 1e6 * wall / n, size


async def main(repeats: int) -> None:
    with EmbeddedServer() as server, tempfile.TemporaryDirectory() as root:
        kinds = setups(root)
        print(f"{repeats} runs of each setup, medians; µs per job: enqueue + run + result")
        print(f"{'payload':22}{'setup':>13}{'record bytes':>14}{'µs per job':>12}")
        for label, size, n in SIZES:
            for repetitive in (True, False):
                data = payload(size, repetitive)
                runs: dict[str, list[tuple[float, int]]] = {k: [] for k in kinds}
                for _ in range(repeats):
                    for name, options in kinds.items():
                        runs[name].append(await one_run(server.url, data, n, options))
                what = f"{label} {'repetitive' if repetitive else 'mixed'} ({len(data):,})"
                for name, rs in runs.items():
                    us = statistics.median(r[0] for r in rs)
                    rec = statistics.median(r[1] for r in rs)
                    print(f"{what:22}{name:>13}{rec:>14,.0f}{us:>12,.0f}")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3))
