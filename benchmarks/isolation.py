"""What process isolation costs a job: pre-queued no-op jobs of a sync task drained by one
in-process Worker (concurrency 8), run in the worker's thread pool and in child processes
(``isolation="process"``, 4 children, started before the clock runs), on an embedded Valkey;
trials interleaved; the median per-job wall time of each and the difference printed.

    .venv/bin/python benchmarks/isolation.py [--jobs 2000] [--repeats 3]

The difference is the price of a child per job: the arguments and the result pickled across a
pipe, the child's wake-up and the event loop's reader callbacks. A child's start (a fork from the
forkserver and the import of the task's module) is paid once per child, and again after each
recycling; ``--recycle`` adds a run with ``max_jobs_per_child=1`` (a fresh child every job).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time


def noop(i: int) -> int:
    return i


async def drain(url: str, jobs: int, mode: str) -> float:
    """One drain of ``jobs`` jobs: seconds per job."""
    from aioqueue import App, ProcessIsolation, Worker
    from aioqueue.testing import unique_prefix

    app = App(url, prefix=unique_prefix())
    task = app.task(name="noop", isolation=None if mode == "thread" else "process")(noop)
    options = ProcessIsolation(processes=4, max_jobs_per_child=1 if mode == "recycle" else None)
    async with app:
        if mode != "thread":  # start the children first: their start is not the per-job cost
            warm = [await task.enqueue(0) for _ in range(8)]
            async with Worker(app, concurrency=8, isolation=options) as w:
                for job in warm:
                    await job.result(timeout=60)
                await task.enqueue_many([{"i": i} for i in range(jobs)])
                t0 = time.perf_counter()
                await _drained(app)
                took = time.perf_counter() - t0
                w.stop()
            return took / jobs
        await task.enqueue_many([{"i": i} for i in range(jobs)])
        t0 = time.perf_counter()
        await Worker(app, concurrency=8, burst=True).run()
        return (time.perf_counter() - t0) / jobs


async def _drained(app: object) -> None:
    q = app.queue()  # type: ignore[attr-defined]
    while True:
        counts = await q.counts()
        if counts.get("queued", 0) == 0 and counts.get("active", 0) == 0:
            return
        await asyncio.sleep(0.005)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--recycle", action="store_true")
    args = parser.parse_args()
    from aioqueue import EmbeddedServer

    modes = ["thread", "process"] + (["recycle"] if args.recycle else [])
    runs: dict[str, list[float]] = {m: [] for m in modes}
    with EmbeddedServer() as server:
        for _ in range(args.repeats):
            for mode in modes:
                jobs = args.jobs if mode != "recycle" else max(args.jobs // 10, 50)
                runs[mode].append(asyncio.run(drain(server.url, jobs, mode)))
    med = {m: statistics.median(v) * 1e6 for m, v in runs.items()}
    for m in modes:
        print(f"{m:8s} {med[m]:9.1f} us/job  ({1e6 / med[m]:8.0f} jobs/s)")
    print(f"isolation overhead: {med['process'] - med['thread']:.1f} us/job")
    if "recycle" in med:
        print(f"a fresh child per job: {med['recycle'] - med['thread']:.1f} us/job more")


if __name__ == "__main__":
    main()
