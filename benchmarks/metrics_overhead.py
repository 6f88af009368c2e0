"""The cost of the worker's Prometheus metrics and of job-context logging (issue 14).

1. W2-style drain: N no-op jobs (enqueued in advance with ``enqueue_many``), run by one
   in-process burst worker with ``metrics=None`` and with ``metrics=WorkerMetrics()``,
   alternated so both see the same machine load. Prints each run's wall-clock and CPU
   seconds of this process (producer and worker) and the median ratios; on a busy machine
   the CPU time is the steadier measure.
2. Per log line: the time to handle one record with a plain text handler, with
   ``JobContextFilter`` added, and with the filter and ``JsonLogFormatter``, inside a job's
   context (written to a null stream).

    .venv/bin/python -m benchmarks.metrics_overhead [N] [repeats]
"""

from __future__ import annotations

import asyncio
import io
import logging
import statistics
import sys
import time
import timeit
import uuid

from aioqueue import App, EmbeddedServer, JobContext, JobContextFilter, JsonLogFormatter, Worker
from aioqueue._app.context import _current
from aioqueue._app.logs import TEXT_FORMAT
from aioqueue.metrics import WorkerMetrics


async def drain(url: str, n: int, metrics: bool) -> tuple[float, float]:
    app = App(url, prefix=f"mb{uuid.uuid4().hex[:8]}")

    @app.task
    async def noop(i: int) -> None:
        return None

    async with app:
        for start in range(0, n, 5000):
            await noop.enqueue_many([{"i": i} for i in range(start, min(start + 5000, n))])
        t0, c0 = time.perf_counter(), time.process_time()
        observer = WorkerMetrics() if metrics else None
        await Worker(app, concurrency=100, burst=True, idle_block=0.1, metrics=observer).run()
        t1, c1 = time.perf_counter(), time.process_time()
        assert (await app.queue().stats())["completed"] == n
        if observer is not None:
            done = observer.completed.labels(app.default_queue, "noop")._value.get()
            assert done == n, done
    return t1 - t0, c1 - c0


def log_line_costs(lines: int = 50_000) -> dict[str, float]:
    """Microseconds per record handled, by handler set-up, inside a job's context."""
    out: dict[str, float] = {}
    record = logging.LogRecord("tasks", logging.INFO, __file__, 1, "job %s step %d", ("x", 1), None)
    setups: dict[str, logging.Handler] = {}
    plain = logging.StreamHandler(io.StringIO())
    plain.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    setups["text"] = plain
    text = logging.StreamHandler(io.StringIO())
    text.setFormatter(logging.Formatter(TEXT_FORMAT))
    text.addFilter(JobContextFilter())
    setups["text + JobContextFilter"] = text
    js = logging.StreamHandler(io.StringIO())
    js.setFormatter(JsonLogFormatter())
    js.addFilter(JobContextFilter())
    setups["json + JobContextFilter"] = js
    job = JobContext("e56a394dbc8076af4", "default", "noop", 1, 3, None)  # type: ignore[arg-type]
    token = _current.set(job)
    try:
        for name, handler in setups.items():
            assert isinstance(handler.stream, io.StringIO)  # type: ignore[attr-defined]
            t = min(timeit.repeat(lambda h=handler: h.handle(record), number=lines, repeat=3))
            out[name] = t / lines * 1e6
    finally:
        _current.reset(token)
    return out


async def main(n: int, repeats: int) -> None:
    with EmbeddedServer() as server:
        runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for _ in range(repeats):
            for on in (False, True):
                runs[on].append(await drain(server.url, n, on))
    for on, rs in runs.items():
        label = "metrics on " if on else "metrics off"
        print(label, "drain wall", " ".join(f"{r[0]:.2f}" for r in rs))
        print(label, "drain cpu ", " ".join(f"{r[1]:.2f}" for r in rs))
    for i, what in enumerate(("drain wall", "drain cpu")):
        off = statistics.median(r[i] for r in runs[False])
        on_ = statistics.median(r[i] for r in runs[True])
        print(f"{what}: median {off:.2f} s off, {on_:.2f} s on: x{on_ / off:.3f}")
    for name, us in log_line_costs().items():
        print(f"log line, {name}: {us:.1f} us")


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    asyncio.run(main(n, int(sys.argv[2]) if len(sys.argv) > 2 else 3))
