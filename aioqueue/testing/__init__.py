"""Helpers for testing code that uses aioqueue.

- ``run_until_empty(app)``: run the App's jobs in this process, in a burst ``Worker``, until
  nothing is left to run; delayed jobs (and retries) are run at once, waited for, or skipped;
- ``unique_prefix()``: a key prefix no other test uses, to isolate tests on one server;
- the pytest plugin of the kit, the module ``pytest_aioqueue`` (registered under the name
  ``aioqueue`` when the package is installed), with the fixtures ``aioqueue_server``,
  ``aioqueue_url`` and ``aioqueue_app``. See docs/testing.md.

Nothing here needs pytest; only the plugin module imports it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal, cast
from uuid import uuid4

from .._app import App
from .._checks import to_seconds
from .._exceptions import ConfigurationError
from .._leases import forward_outbox
from .._worker import Worker

__all__ = ["Delayed", "RunSummary", "run_until_empty", "unique_prefix"]

#: what ``run_until_empty`` does with delayed jobs (and retries waiting for their backoff)
Delayed = Literal["run_now", "wait", "skip"]

# most scheduled ids re-scored per command by delayed="run_now"
_CHUNK = 1000
# how long to wait before looking again at jobs that are queued but cannot be claimed yet (a
# rate limit, a pause, a group limit held by another consumer)
_RECHECK = 0.02


def unique_prefix() -> str:
    """A key prefix no other test uses (``test`` and 12 random hex digits)."""
    return f"test{uuid4().hex[:12]}"


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What ``run_until_empty`` did.

    Attributes:
        completed: job runs that succeeded.
        failed: job runs that failed, whether the job was retried or dead-lettered.
        scheduled: delayed jobs left waiting (with ``delayed="skip"``; else 0).
    """

    completed: int
    failed: int
    scheduled: int


async def run_until_empty(
    app: App,
    queues: Sequence[str] | None = None,
    *,
    delayed: Delayed = "run_now",
    timeout: float | timedelta = 30.0,
    concurrency: int = 10,
) -> RunSummary:
    """Run jobs in this process until nothing is queued, scheduled or running.

    Each round runs a ``Worker(app, burst=True)`` on ``queues`` until they are drained, then
    looks again: jobs that the run enqueued, retries and batch callbacks run in the next round.
    Jobs leased by other consumers (a pull-API reservation, another worker) are theirs: they are
    not waited for.

    Args:
        app: an open App whose tasks run the jobs.
        queues: the queues to drain (default: the App's default queue and every queue its
            tasks use).
        delayed: what to do with delayed jobs, including retries waiting for their backoff:
            ``"run_now"`` makes them due at once (their due time is not waited for),
            ``"wait"`` waits until they fall due by the server's clock, ``"skip"`` leaves
            them scheduled (see ``RunSummary.scheduled``).
        timeout: seconds the whole run may take.
        concurrency: jobs run at once.

    Returns:
        How many job runs completed and failed, and how many delayed jobs were left.

    Raises:
        TimeoutError: jobs were still left after ``timeout`` seconds (a paused queue, a job
            that never ends, a delayed job due later than that with ``delayed="wait"``).
        ConfigurationError: an unknown ``delayed`` policy.
    """
    if delayed not in ("run_now", "wait", "skip"):
        raise ConfigurationError(f"delayed must be 'run_now', 'wait' or 'skip', not {delayed!r}")
    seconds = to_seconds(timeout, "timeout") or 0.0
    names = list(queues) if queues else _queues_of(app)
    completed = failed = 0
    left: dict[str, int] = {}
    try:
        async with asyncio.timeout(seconds):
            while True:
                if delayed == "run_now":
                    await _make_due(app, names)
                worker = Worker(app, queues=names, concurrency=concurrency, burst=True, grace=0)
                try:
                    await worker.run()
                finally:
                    completed += worker.completed
                    failed += worker.failed
                # outcomes of sub-jobs whose batch lives on another queue, handed over now
                # rather than at the next maintenance, so that its callback runs in this call
                forwarded = [await forward_outbox(app.queue(name)) for name in names]
                left = await _left(app, names)
                if any(forwarded):
                    continue
                if left["queued"]:
                    await asyncio.sleep(_RECHECK)
                elif left["scheduled"] and delayed == "wait":
                    await asyncio.sleep(await _until_next_due(app, names))
                elif not left["scheduled"] or delayed == "skip":
                    return RunSummary(completed, failed, left["scheduled"])
    except TimeoutError:
        raise TimeoutError(
            f"run_until_empty: jobs still left after {seconds} s ({completed} completed, "
            f"{failed} failed; left: {left or 'unknown'})"
        ) from None


def _queues_of(app: App) -> list[str]:
    """The App's default queue, then every other queue its tasks use."""
    names = [app.default_queue]
    for task in app.tasks.values():
        if task.queue not in names:
            names.append(task.queue)
    return names


async def _left(app: App, names: Sequence[str]) -> dict[str, int]:
    """Jobs queued and scheduled on ``names``, in total."""
    left = {"queued": 0, "scheduled": 0}
    for name in names:
        counts = await app.queue(name).counts()
        left["queued"] += counts["queued"]
        left["scheduled"] += counts["scheduled"]
    return left


async def _make_due(app: App, names: Sequence[str]) -> None:
    """Make every delayed job of ``names`` due now: its score becomes 0. ``XX`` only updates
    ids still scheduled: one that a claim promoted meanwhile is not put back (ids leave the
    scheduled set only inside scripts)."""
    redis = app.redis
    for name in names:
        key = app.queue(name)._keys.scheduled
        ids = cast(list[bytes], await redis.zrange(key, 0, -1))
        for start in range(0, len(ids), _CHUNK):
            await redis.zadd(key, dict.fromkeys(ids[start : start + _CHUNK], 0), xx=True)


async def _until_next_due(app: App, names: Sequence[str]) -> float:
    """Seconds until the earliest delayed job of ``names`` falls due, by the server's clock."""
    redis = app.redis
    sec, usec = await redis.time()
    now_ms = int(sec) * 1000 + int(usec) // 1000
    due = []
    for name in names:
        key = app.queue(name)._keys.scheduled
        first = cast(list[tuple[bytes, float]], await redis.zrange(key, 0, 0, withscores=True))
        due += [int(score) for _, score in first]
    return max((min(due, default=now_ms) - now_ms) / 1000, 0.001)
