"""Worker lifecycle hooks, job middleware and enqueue hooks.

A startup hook opens a database once per worker and shares it with the tasks through the
worker's typed state; a middleware gives every run its own transaction and logs how long it
took; enqueue hooks count what producers send. Run it end to end (an embedded server, a
producer and a worker in one process):

    python examples/hooks_app.py

or run a worker for it: ``python -m aioqueue worker examples.hooks_app:app``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from aioqueue import (
    App,
    CallNext,
    EmbeddedServer,
    EnqueueEvent,
    JobContext,
    State,
    Worker,
    current_job,
)

logger = logging.getLogger("examples.hooks_app")

app = App(prefix=os.environ.get("EXAMPLE_PREFIX", "aq"))


@dataclass
class Database:
    """What the worker's tasks share: one connection, opened at startup (a pool in real life)."""

    conn: sqlite3.Connection


@app.on_startup
async def open_database(state: State) -> None:
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER)")
    state.set(Database(conn))


@app.on_shutdown
async def close_database(state: State) -> None:
    state.get(Database).conn.close()


@app.middleware
async def timed(job: JobContext, call_next: CallNext) -> Any:
    """Outermost: how long each run took, whatever happened (tracing and metrics go here)."""
    start = time.perf_counter()
    try:
        return await call_next()
    finally:
        ms = (time.perf_counter() - start) * 1000
        logger.info("%s %s attempt %d took %.1f ms", job.task, job.id, job.attempt, ms)


@app.middleware
async def transaction(job: JobContext, call_next: CallNext) -> Any:
    """A transaction per run: committed if the task returned, rolled back if it raised."""
    conn = job.state.get(Database).conn
    with conn:  # sqlite3: commit on success, roll back on an exception
        return await call_next()


#: what producers of this process enqueued, per task (an after-enqueue hook counts it)
enqueued: Counter[str] = Counter()


@app.after_enqueue
def count(event: EnqueueEvent) -> None:
    enqueued[event.task] += len(event.job_ids)


@app.task
async def place_order(order_id: int, total: int) -> int:
    db = current_job().state.get(Database)  # typed: a Database
    db.conn.execute("INSERT INTO orders VALUES (?, ?)", (order_id, total))
    (n,) = db.conn.execute("SELECT COUNT(*) FROM orders").fetchone()
    return int(n)


async def main(url: str | None = None) -> list[int]:
    """Enqueue three orders, run a worker until they are done; the row counts seen."""
    if url is not None:
        app.url = url
    async with app:
        jobs = await place_order.enqueue_many([(((i, i * 100)), {}) for i in range(1, 4)])
        await Worker(app, burst=True).run()
        counts = [await job.result(timeout=10) for job in jobs]
    print(f"enqueued: {dict(enqueued)}; rows seen by each job: {counts}")
    return counts


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
    with EmbeddedServer() as server:
        asyncio.run(main(server.url))
