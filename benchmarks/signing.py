"""The cost of signing: a drain of N no-op jobs (enqueued in advance with ``enqueue_many``),
run by one in-process burst worker, with ``signing_key`` off and on, alternated so both see the
same machine load. Prints, for each run, the wall-clock seconds and the CPU seconds of this
process (producer and worker; the server's time is not signing's), and the median ratios: on a
busy machine the CPU time is the steadier measure.

    .venv/bin/python -m benchmarks.signing [N] [repeats]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid

from aioqueue import App, EmbeddedServer, Worker

KEY = "bench-signing-key-0123456789"


async def drain(url: str, n: int, signed: bool) -> tuple[float, float, float, float]:
    app = App(url, prefix=f"sb{uuid.uuid4().hex[:8]}", signing_key=KEY if signed else None)

    @app.task
    async def noop(i: int) -> None:
        return None

    async with app:
        t0, c0 = time.perf_counter(), time.process_time()
        for start in range(0, n, 5000):
            await noop.enqueue_many([{"i": i} for i in range(start, min(start + 5000, n))])
        t1, c1 = time.perf_counter(), time.process_time()
        await Worker(app, concurrency=100, burst=True, idle_block=0.1).run()
        t2, c2 = time.perf_counter(), time.process_time()
        assert (await app.queue().stats())["completed"] == n
    return t1 - t0, t2 - t1, c1 - c0, c2 - c1


async def main(n: int, repeats: int) -> None:
    with EmbeddedServer() as server:
        runs: dict[bool, list[tuple[float, float, float, float]]] = {False: [], True: []}
        for _ in range(repeats):
            for signed in (False, True):
                runs[signed].append(await drain(server.url, n, signed))
        names = ("enqueue wall", "drain wall", "enqueue cpu", "drain cpu")
        for signed, rs in runs.items():
            label = "signed  " if signed else "unsigned"
            for i, what in enumerate(names):
                print(label, what, " ".join(f"{r[i]:.2f}" for r in rs))
        for i, what in enumerate(names):
            off = statistics.median(r[i] for r in runs[False])
            on = statistics.median(r[i] for r in runs[True])
            print(f"{what}: median {off:.2f} s unsigned, {on:.2f} s signed: x{on / off:.3f}")


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    asyncio.run(main(n, int(sys.argv[2]) if len(sys.argv) > 2 else 3))
