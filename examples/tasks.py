"""Example tasks for the quick start: run a worker for them with

python -m aioqueue worker examples.tasks:app
"""

from __future__ import annotations

import asyncio

from aioqueue import App, Retry, current_job

app = App()  # the URL comes from $AIOQUEUE_REDIS_URL (or --url / --embedded on the CLI)


@app.task(max_attempts=5, timeout=30)
async def resize(image_id: str, width: int = 800) -> str:
    """Pretend to resize an image and return its new URL."""
    await asyncio.sleep(0.01)
    return f"https://cdn.example.com/{image_id}-{width}w.jpg"


@app.task(max_attempts=3)
async def flaky_webhook(url: str) -> str:
    """Fails on its first attempt (as a busy endpoint would), then succeeds."""
    job = current_job()
    if job.attempt == 1:
        raise Retry(delay=0.2)
    return f"delivered to {url} on attempt {job.attempt}"


@app.task(max_attempts=2)
async def broken(n: int) -> None:
    """Always fails: ends in the dead-letter store with its traceback."""
    raise ValueError(f"cannot process item {n}")


@app.task
def checksum(data: str) -> int:
    """A blocking (sync) function: runs in the worker's thread pool."""
    return sum(data.encode()) % 65_536
