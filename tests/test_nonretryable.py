"""Non-retryable errors and a task's retry policy (issue 27, point 6): ``raise NonRetryable``
dead-letters the job on its first attempt; ``retry_on=`` retries only the listed types,
``dont_retry_on=`` dead-letters the listed ones at once; everything else keeps its backoff."""

from __future__ import annotations

from typing import Any

import pytest

from aioqueue import (
    App,
    Backoff,
    ConfigurationError,
    JobError,
    JobFailed,
    NonRetryable,
    Worker,
)

FAST = Backoff(base=0.01, jitter=0.0)


class CardDeclined(NonRetryable):
    pass


async def _failure(app: App, task: Any, *args: Any) -> JobFailed:
    job = await task.enqueue(*args)
    async with Worker(app, concurrency=2, grace=2):
        with pytest.raises(JobFailed) as failed:
            await job.result(timeout=30)
    return failed.value


async def test_non_retryable_dead_letters_on_the_first_attempt(app: App) -> None:
    runs: list[int] = []

    @app.task(max_attempts=5, backoff=FAST)
    async def charge(order: str) -> None:
        runs.append(1)
        raise CardDeclined(f"card declined for {order}")

    failed = await _failure(app, charge, "o-1")
    assert len(runs) == 1
    assert failed.error_type == "CardDeclined"  # a subclass keeps its own name
    assert "card declined for o-1" in failed.error_message
    info = await app.queue().job(failed.job_id).info()
    assert info.attempts == 1


async def test_retry_on_retries_only_the_listed_types(app: App) -> None:
    runs: list[str] = []

    @app.task(max_attempts=4, backoff=FAST, retry_on=(ConnectionError,))
    async def fetch(kind: str) -> str:
        runs.append(kind)
        if len(runs) == 1:
            raise ConnectionError("flaky network")  # retried
        raise ValueError("bad page")  # not listed: dead-lettered at once

    failed = await _failure(app, fetch, "x")
    assert runs == ["x", "x"]
    assert failed.error_type == "ValueError"


async def test_dont_retry_on_wins_over_retry_on(app: App) -> None:
    runs: list[int] = []

    @app.task(max_attempts=4, backoff=FAST, retry_on=OSError, dont_retry_on=(PermissionError,))
    async def write() -> None:
        runs.append(1)
        raise PermissionError("read-only")  # an OSError, but listed in dont_retry_on

    failed = await _failure(app, write)
    assert len(runs) == 1
    assert failed.error_type == "PermissionError"


async def test_other_errors_keep_their_retries(app: App) -> None:
    runs: list[int] = []

    @app.task(max_attempts=3, backoff=FAST, dont_retry_on=KeyError)
    async def flaky() -> None:
        runs.append(1)
        raise ValueError("try again")

    failed = await _failure(app, flaky)
    assert len(runs) == 3
    assert failed.error_type == "ValueError"


def test_non_retryable_is_a_job_error() -> None:
    assert issubclass(NonRetryable, JobError)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"retry_on": "ValueError"}, "retry_on"),
        ({"dont_retry_on": (ValueError, 3)}, "dont_retry_on"),
        ({"retry_on": [ValueError]}, "retry_on"),
        ({"capture_logs": "LOUD"}, "capture_logs"),
        ({"capture_logs": True}, "capture_logs"),
    ],
)
def test_a_bad_policy_is_refused_at_registration(kwargs: dict[str, Any], match: str) -> None:
    app = App()
    with pytest.raises(ConfigurationError, match=match):

        @app.task(**kwargs)
        async def t() -> None:
            return None

    assert "t" not in app.tasks
