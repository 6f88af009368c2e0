"""Helpers for testing code that uses aioqueue.

- ``run_until_empty(app)``: run the App's jobs in this process, in a burst ``Worker``, until
  nothing is left to run; delayed jobs (and retries) are run at once, waited for, or skipped;
- ``enqueued(app, task)``, ``assert_enqueued(app, task, args, kwargs)`` and
  ``assert_not_enqueued(app, task)``: what is waiting to run (queued or scheduled), to check
  what code under test enqueued without running it;
- ``unique_prefix()``: a key prefix no other test uses, to isolate tests on one server;
- ``bind(app, url)``: lend a module-level App to one test (its server, a prefix of its own);
- ``VirtualClock(app)``: fast-forward the time the scripts read (``await clock.advance(...)``),
  for an App made with ``testing=True``;
- the pytest plugin of the kit, the module ``pytest_aioqueue`` (registered under the name
  ``aioqueue`` when the package is installed), with the fixtures ``aioqueue_server``,
  ``aioqueue_url`` and ``aioqueue_app``. See docs/testing.md.

Nothing here needs pytest; only the plugin module imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, cast
from uuid import uuid4

from redis.exceptions import RedisError

from .._app.app import App
from .._app.task import BoundTask, Task
from .._model.checks import to_seconds
from .._model.exceptions import ConfigurationError, JobNotFound
from .._model.job import JobInfo, JobState
from .._queue.leases import forward_outbox
from .._worker.worker import Worker
from ._bind import bind
from ._clock import VirtualClock, door

# the public names are this module's, wherever in the kit they are written (as in aioqueue)
VirtualClock.__module__ = bind.__module__ = __name__

__all__ = [
    "Delayed",
    "RunSummary",
    "VirtualClock",
    "assert_enqueued",
    "assert_not_enqueued",
    "bind",
    "enqueued",
    "run_until_empty",
    "unique_prefix",
]

#: what ``run_until_empty`` does with delayed jobs (and retries waiting for their backoff)
Delayed = Literal["run_now", "wait", "skip"]

# most scheduled ids re-scored per command by delayed="run_now"
_CHUNK = 1000
# how long to wait before looking again at jobs that are queued but cannot be claimed yet (a
# rate limit, a pause, a group limit held by another consumer)
_RECHECK = 0.02
#: seconds to count what is left when the time ran out before any count
_LEFT_READ_S = 5.0


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
    __tracebackhide__ = True  # pytest shows the caller's line, not the kit's
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
        if not left:
            # the time ran out before the first count (a worker's start on a busy machine):
            # counted now, so that the message says what is left
            with contextlib.suppress(TimeoutError, RedisError, OSError):
                async with asyncio.timeout(_LEFT_READ_S):
                    left = await _left(app, names)
        raise TimeoutError(
            f"run_until_empty: jobs still left after {seconds} s ({completed} completed, "
            f"{failed} failed; left: {left or 'unknown'})"
        ) from None


# ---------------------------------------------------------------- what was enqueued
#: the most waiting jobs ``enqueued`` reads (a test's queue, not a production one)
MAX_LISTED = 10_000


async def enqueued(
    app: App,
    task: Task[Any, Any] | BoundTask[Any, Any] | str | None = None,
    *,
    queues: Sequence[str] | None = None,
) -> list[JobInfo]:
    """The jobs waiting to run (queued or scheduled) on ``queues`` (default: the App's queues,
    as ``run_until_empty`` finds them), of ``task`` (a Task or its name; None: every task),
    oldest first within each state, queued before scheduled. Their ``args`` and ``kwargs`` are
    the stored JSON form (a tuple becomes a list, a datetime an ISO string).

    Raises:
        ConfigurationError: more than ``MAX_LISTED`` waiting jobs (this is for tests).
    """
    __tracebackhide__ = True
    name = _task_name(task)
    found: list[JobInfo] = []
    for qname in queues if queues is not None else _queues_of(app):
        q = app.queue(qname)
        for state in (JobState.QUEUED, JobState.SCHEDULED):
            cursor: str | None = None
            while True:
                page = await q.jobs(state, task=name, limit=1000, cursor=cursor)
                for item in page.items:
                    try:
                        found.append(await q.job_info(item.id))
                    except JobNotFound:  # ran (and its record expired) since the listing
                        continue
                    if len(found) > MAX_LISTED:
                        raise ConfigurationError(
                            f"enqueued: more than {MAX_LISTED} waiting jobs; this helper is for "
                            "tests (use Queue.jobs to page through a real queue)"
                        )
                cursor = page.cursor
                if cursor is None:
                    break
    return found


async def assert_enqueued(
    app: App,
    task: Task[Any, Any] | BoundTask[Any, Any] | str,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    count: int | None = None,
    queues: Sequence[str] | None = None,
) -> list[JobInfo]:
    """Assert that jobs of ``task`` wait to run, and return them.

    With ``args`` and/or ``kwargs``, only jobs with exactly those (compared in their stored
    JSON form: lists for tuples) count; with ``count``, exactly that many must wait, else at
    least one.

    Raises:
        AssertionError: no (or not ``count``) such jobs; the message lists what does wait.
    """
    __tracebackhide__ = True
    name = _task_name(task)
    waiting = await enqueued(app, name, queues=queues)
    want_args = None if args is None else _json_form(list(args))
    want_kwargs = None if kwargs is None else _json_form(dict(kwargs))
    matches = [
        j
        for j in waiting
        if (want_args is None or _json_form(list(j.args or ())) == want_args)
        and (want_kwargs is None or _json_form(dict(j.kwargs or {})) == want_kwargs)
    ]
    if (count is None and not matches) or (count is not None and len(matches) != count):
        seen = ", ".join(f"{name}(*{j.args!r}, **{j.kwargs!r})" for j in waiting) or "none"
        wanted = f"{name}(*{args!r}, **{kwargs!r})" if args or kwargs else name
        how_many = "at least one" if count is None else str(count)
        raise AssertionError(
            f"expected {how_many} waiting job(s) {wanted}, found {len(matches)}; waiting: {seen}"
        )
    return matches


async def assert_not_enqueued(
    app: App,
    task: Task[Any, Any] | BoundTask[Any, Any] | str,
    *,
    queues: Sequence[str] | None = None,
) -> None:
    """Assert that no job of ``task`` waits to run.

    Raises:
        AssertionError: some do; the message lists them.
    """
    __tracebackhide__ = True
    waiting = await enqueued(app, task, queues=queues)
    if waiting:
        listed = ", ".join(f"{j.id}(*{j.args!r}, **{j.kwargs!r})" for j in waiting)
        raise AssertionError(f"expected no waiting job of {_task_name(task)}, found: {listed}")


def _task_name(task: Task[Any, Any] | BoundTask[Any, Any] | str | None) -> str | None:
    if task is None or isinstance(task, str):
        return task
    if isinstance(task, BoundTask):
        return task.task.name
    return task.name


def _json_form(value: Any) -> Any:
    """``value`` as JSON stores it (tuples become lists), to compare with stored arguments."""
    if isinstance(value, tuple | list):
        return [_json_form(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_form(v) for k, v in value.items()}
    return value


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
        key = door(app, name).keys.scheduled
        ids = cast(list[bytes], await redis.zrange(key, 0, -1))
        for start in range(0, len(ids), _CHUNK):
            await redis.zadd(key, dict.fromkeys(ids[start : start + _CHUNK], 0), xx=True)


async def _until_next_due(app: App, names: Sequence[str]) -> float:
    """Seconds until the earliest delayed job of ``names`` falls due, by the server's clock
    (the virtual clock's, in test mode)."""
    redis = app.redis
    waits = []
    for name in names:
        q = door(app, name)
        now_ms = await q.server_ms()
        first = cast(
            list[tuple[bytes, float]], await redis.zrange(q.keys.scheduled, 0, 0, withscores=True)
        )
        waits += [(int(score) - now_ms) / 1000 for _, score in first]
    return max(min(waits, default=0.0), 0.001)
