"""What a worker logs about a failed run is what the job's record says (issue 19 §6): the type
and message stored in the record ("JobTimeout: job exceeded ..."), never the internal class
that carries a reason (``Unrunnable(...)``)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from aioqueue import App, Backoff, JobFailed, Retry, Worker

LOGGER = "aioqueue"


def failure_lines(caplog: pytest.LogCaptureFixture, job_id: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith(LOGGER) and r.levelno >= logging.WARNING and job_id in r.getMessage()
    ]


async def recorded(app: App, job_id: str) -> str:
    """The failure as the record stores it: "<type>: <message>"."""
    with pytest.raises(JobFailed) as failed:
        await app.queue().job(job_id).result(timeout=30)
    return f"{failed.value.error_type}: {failed.value.error_message}"


async def test_a_timeout_is_logged_as_the_record_says(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)

    @app.task(timeout=0.2, max_attempts=1)
    async def slow() -> None:
        await asyncio.sleep(30)

    job = await slow.enqueue()
    async with Worker(app):
        stored = await recorded(app, job.id)
    assert stored.startswith("JobTimeout: job exceeded its timeout of 0.2 s")
    (line,) = failure_lines(caplog, job.id)
    assert line.endswith(": " + stored), line
    assert "Unrunnable" not in line


async def test_a_retry_on_the_last_attempt_is_logged_as_the_record_says(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)

    @app.task(max_attempts=1)
    async def again() -> None:
        raise Retry(delay=0.01)

    job = await again.enqueue()
    async with Worker(app):
        stored = await recorded(app, job.id)
    assert stored.startswith("Retry: retry requested on the last attempt (1 of 1)")
    (line,) = failure_lines(caplog, job.id)
    assert line.endswith(": " + stored), line
    assert "Unrunnable" not in line


async def test_a_failed_attempt_that_is_retried_is_logged_with_its_type_and_message(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)

    @app.task(max_attempts=2, backoff=Backoff(base=0.01, jitter=0.0))
    async def broken() -> None:
        raise ValueError("no such thing")

    job = await broken.enqueue()
    async with Worker(app):
        stored = await recorded(app, job.id)
    assert stored == "ValueError: no such thing"
    retried, dead = failure_lines(caplog, job.id)
    assert "failed on attempt 1 of 2, retrying" in retried
    assert retried.endswith(": ValueError: no such thing"), retried
    assert dead.endswith(": ValueError: no such thing"), dead
