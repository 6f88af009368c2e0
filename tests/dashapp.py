"""The App that the dashboard tests run in real worker processes (configured like
``tests.workerapp``: ``AIOQUEUE_TEST_PREFIX`` and friends, see ``tests.support.apps``)."""

from __future__ import annotations

from aioqueue import current_job

from .support.apps import app_from_env

app = app_from_env("aqdash")


@app.task
async def flaky(order: int) -> str:
    """Fails the first time a job runs, succeeds after: a dead letter that a retry fixes."""
    job = current_job()
    runs = await job.app.redis.hincrby(f"{job.app.prefix}:t:flaky", job.id, 1)
    if runs == 1:
        raise ConnectionError(f"mail server refused order {order}")
    return f"invoice-{order}"


@app.task
async def hostile(payload: str) -> None:
    """Fails with its argument in the message: user data that a page must show as text."""
    raise ValueError(payload)


@app.task
async def ok(n: int) -> int:
    await current_job().progress({"done": n})
    return n * 2
