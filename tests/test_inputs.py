"""Bad input gets a clear, typed error at the call that received it (issue 19 §4): names,
ids and groups, counts, durations and times; a garbled record reads as far as it can; a
large cancel never stalls the server. Every case here was accepted, or failed with a raw
error, before its fix."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from aioqueue import (
    App,
    Backoff,
    Batch,
    ConfigurationError,
    CorruptRecord,
    JobState,
    ResultTimeout,
    Worker,
)
from aioqueue._model.checks import MAX_ATTEMPTS, MAX_SECONDS
from aioqueue._queue.queue import CANCEL_CHUNK
from aioqueue._store.scripts import QueueScripts

from .support.apps import unique_prefix

SURROGATE = "a\udc80b"  # a lone surrogate: a str that cannot be encoded as UTF-8
CENTURY = MAX_SECONDS


async def _add(a: int, b: int) -> int:
    return a + b


# --------------------------------------------------------------------- result(timeout=0)
async def test_result_with_timeout_zero_returns_a_finished_jobs_result(app: App) -> None:
    # issue 19: result(timeout=0) on a completed job raised ResultTimeout
    add = app.task(_add)
    job = await add.enqueue(1, 2)
    [r] = await app.queue().reserve()
    await app.queue().complete(r, 3)
    assert await job.result(timeout=0) == 3
    assert await job.result(timeout=timedelta(0)) == 3
    # a job that has not finished: ResultTimeout at once, without waiting
    pending = await add.enqueue(2, 2)
    with pytest.raises(ResultTimeout):
        await pending.result(timeout=0)


async def test_batch_wait_with_timeout_zero_looks_once(app: App) -> None:
    add = app.task(_add)
    batch: Batch[None] = await app.batch([add.call(1, 1)])
    with pytest.raises(ResultTimeout):
        await batch.wait(timeout=0)
    [r] = await app.queue().reserve()
    await app.queue().complete(r, 2)
    info = await batch.wait(timeout=0)
    assert info.done == 1


# --------------------------------------------------------------------- durations and times
@pytest.mark.parametrize(
    "options",
    [
        {"delay": 1e300},
        {"delay": CENTURY + 1},
        {"delay": timedelta(days=365 * 101)},
        {"at": 1e17},
        {"at": datetime(9999, 1, 1, tzinfo=UTC)},
        {"timeout": 1e300},
        {"result_ttl": math.inf},
    ],
)
async def test_times_beyond_a_century_are_refused_at_enqueue(
    app: App, redis: Redis, options: dict[str, Any]
) -> None:
    # issue 19: delay=1e300 and at=1e17 were stored, then info() raised a raw ValueError
    add = app.task(_add)
    with pytest.raises(ConfigurationError):
        add.options(**options)
    with pytest.raises(ConfigurationError):
        await app.queue().enqueue("_add", (1, 2), **options)
    assert await redis.keys(f"{app.prefix}:*") == []


async def test_the_longest_delay_is_stored_and_read_back_exactly(app: App) -> None:
    add = app.task(_add)
    job = await add.options(delay=CENTURY).enqueue(1, 2)
    info = await job.info()
    assert info.state is JobState.SCHEDULED
    assert info.due_ms is not None
    assert info.due_ms - info.created_ms == CENTURY * 1000
    assert info.garbled == ()


# --------------------------------------------------------------------- attempts and leases
async def test_max_attempts_is_bounded_to_a_32_bit_count(app: App, redis_url: str) -> None:
    # issue 19: max_attempts=10**30 was accepted and reported as -2**63
    add = app.task(_add)
    for bad in (10**30, MAX_ATTEMPTS + 1, 0, -1, True, 1.5):
        with pytest.raises(ConfigurationError, match="max_attempts"):
            add.options(max_attempts=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="max_attempts"):
            await app.queue().enqueue("_add", (1, 2), max_attempts=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="max_attempts"):
            app.task(name=f"t{bad!r}", max_attempts=bad)(_add)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="max_attempts"):
            App(redis_url, max_attempts=bad)  # type: ignore[arg-type]
    job = await add.options(max_attempts=MAX_ATTEMPTS).enqueue(1, 2)
    assert (await job.info()).max_attempts == MAX_ATTEMPTS
    [r] = await app.queue().reserve()
    assert r.max_attempts == MAX_ATTEMPTS


@pytest.mark.parametrize("lease", [0, 0.0, 0.0004, -1, timedelta(0), 1e300, math.nan])
async def test_leases_must_be_positive_and_bounded(
    app: App, redis_url: str, lease: float | timedelta
) -> None:
    # issue 19: extend(lease=0) was accepted (the lease ran out at once)
    add = app.task(_add)
    await add.enqueue(1, 2)
    q = app.queue()
    with pytest.raises(ConfigurationError, match="lease"):
        await q.reserve(lease=lease)
    [r] = await q.reserve(lease=30)
    with pytest.raises(ConfigurationError, match="lease"):
        await q.extend(r, lease=lease)
    with pytest.raises(ConfigurationError, match="lease"):
        App(redis_url, lease=lease)
    await q.extend(r, lease=60)  # the reservation is intact
    await q.complete(r, 3)


async def test_other_durations_are_bounded_too(app: App) -> None:
    add = app.task(_add)
    await add.enqueue(1, 2)
    q = app.queue()
    [r] = await q.reserve()
    with pytest.raises(ConfigurationError, match="delay"):
        await q.release(r, delay=1e300)
    with pytest.raises(ConfigurationError, match="delay"):
        await q.fail(r, "boom", delay=CENTURY * 2)
    with pytest.raises(ConfigurationError, match="period"):
        await q.set_rate_limit(10, period=1e300)
    with pytest.raises(ConfigurationError, match="retention"):
        await app.batch([add.call(1, 1)], retention=1e300)
    with pytest.raises(ConfigurationError, match="grace"):
        Worker(app, grace=1e300)
    await q.complete(r, 3)  # nothing above touched the reservation


# --------------------------------------------------------------------- names
@pytest.mark.parametrize("name", ["jobs\n", "jobs\r\n", "\njobs", "jo bs", "", "a{b}"])
async def test_queue_names_must_match_in_full(app: App, redis_url: str, name: str) -> None:
    # issue 19: App(queue="jobs\n") was accepted (re.match with $ allows a trailing newline);
    # app.queue("") silently meant the default queue
    with pytest.raises(ConfigurationError, match="queue name"):
        App(redis_url, queue=name)
    with pytest.raises(ConfigurationError, match="queue name"):
        app.queue(name)
    with pytest.raises(ConfigurationError, match="queue name"):
        app.task(name="t", queue=name)(_add)
    add = app.task(_add)
    with pytest.raises(ConfigurationError, match="queue name"):
        add.options(queue=name)
    with pytest.raises(ConfigurationError, match="queue name"):
        await app.batch([add.call(1, 1)], queue=name)


@pytest.mark.parametrize("prefix", ["a:b", "aq:", ":aq", "aq\n", ""])
def test_prefixes_cannot_nest_under_another_prefix(redis_url: str, prefix: str) -> None:
    # issue 19: a prefix containing ':' put its keys under another app's ~prefix:* ACL glob
    with pytest.raises(ConfigurationError, match="key prefix"):
        App(redis_url, prefix=prefix)


async def test_queue_names_may_still_hold_colons(app: App) -> None:
    # inside the hash tag's braces a ':' cannot reach another app's keys
    add = app.task(_add)
    job = await add.options(queue="emails:eu").enqueue(1, 2)
    assert (await job.info()).queue == "emails:eu"


def _text_calls(app: App) -> dict[str, Callable[[str], Awaitable[Any]]]:
    """Every call that takes a job id, a group or a task name, with that value."""
    add = app.task(_add)
    q = app.queue()

    async def sync(fn: Callable[[], Any]) -> Any:
        return fn()

    return {
        "job_id": lambda v: add.options(job_id=v).enqueue(1, 2),
        "job_id by name": lambda v: q.enqueue("_add", (1, 2), job_id=v),
        "group": lambda v: add.options(group=v).enqueue(1, 2),
        "group by name": lambda v: q.enqueue("_add", (1, 2), group=v),
        "batch group": lambda v: app.batch([add.call(1, 1)], group=v),
        "pause group": lambda v: q.pause(v),
        "task by name": lambda v: q.enqueue(v, (1, 2)),
        "task registered": lambda v: sync(lambda: app.task(name=v)(_add)),
        "job handle": lambda v: sync(lambda: q.job(v)),
        "cancel": lambda v: q.cancel_jobs([v]),
    }


@pytest.mark.parametrize("value", [SURROGATE, "x" * 5_000_000, "x" * 257, ""])
async def test_ids_groups_and_task_names_are_bounded_utf8_text(
    app: App, redis: Redis, value: str
) -> None:
    # issue 19: a lone surrogate gave a raw UnicodeEncodeError; a 5 MB task name was stored
    for what, call in _text_calls(app).items():
        with pytest.raises(ConfigurationError) as refused:
            await call(value)
        assert len(str(refused.value)) < 300, what  # a 5 MB value is not echoed back
    assert await redis.keys(f"{app.prefix}:*") == []


async def test_the_longest_ids_groups_and_task_names_are_accepted(app: App) -> None:
    name, job_id, group = "t" * 256, "é" * 256, "g" * 200
    task = app.task(name=name)(_add)
    job = await task.options(job_id=job_id, group=group).enqueue(1, 2)
    info = await job.info()
    assert (info.id, info.task) == (job_id, name)
    [r] = await app.queue().reserve()
    assert (r.id, r.task) == (job_id, name)


# --------------------------------------------------------------------- garbled records
async def test_info_names_the_fields_it_cannot_read(app: App, redis: Redis) -> None:
    # issue 19: info() on a record with a garbled field raised a raw ValueError/JSONDecodeError
    add = app.task(_add)
    job = await add.enqueue(1, 2)
    key = app.queue()._keys.job(job.id)
    await redis.hset(
        key,
        mapping={"a": "many", "pr": b"\xff", "due": "1e+303", "pg": "{not json", "p": "\x00"},
    )
    info = await job.info()
    assert set(info.garbled) == {"attempts", "priority", "due_ms", "progress", "args", "kwargs"}
    assert (info.attempts, info.priority, info.due_ms, info.progress) == (0, 0, None, None)
    assert (info.args, info.kwargs) == (None, None)
    # what could be read is there
    assert (info.state, info.task, info.max_attempts) == (JobState.QUEUED, "_add", 3)


@pytest.mark.parametrize("state", [b"weird", b"\xff\xfe", b"Queued"])
async def test_an_unreadable_state_is_a_corrupt_record(
    app: App, redis: Redis, state: bytes
) -> None:
    add = app.task(_add)
    job = await add.enqueue(1, 2)
    await redis.hset(app.queue()._keys.job(job.id), "s", state)
    with pytest.raises(CorruptRecord, match="state") as info_error:
        await job.info()
    assert info_error.value.job_id == job.id
    with pytest.raises(CorruptRecord):
        await job.state()
    with pytest.raises(CorruptRecord):
        await job.result(timeout=5)  # not a wait for a state that can never come


# --------------------------------------------------------------------- cancel in chunks
async def test_cancelling_many_jobs_never_runs_one_long_script(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # issue 19: cancel_jobs(30_000 ids) ran as one 0.44 s script that stalled the server
    n = 30_000
    add = app.task(_add)
    jobs = await add.enqueue_many([{"a": i, "b": 1} for i in range(n)])
    sizes: list[int] = []
    cancel = QueueScripts.cancel

    async def counted(self: QueueScripts, ids: Sequence[str], dead_ttl_ms: int) -> Any:
        sizes.append(len(ids))
        return await cancel(self, ids, dead_ttl_ms)

    monkeypatch.setattr(QueueScripts, "cancel", counted)
    assert await app.queue().cancel_jobs([j.id for j in jobs]) == n
    assert max(sizes) == CANCEL_CHUNK
    assert sum(sizes) == n
    assert (await app.queue().counts())["queued"] == 0
    states = {(await j.info()).state for j in (jobs[0], jobs[CANCEL_CHUNK], jobs[-1])}
    assert states == {JobState.CANCELLED}


# --------------------------------------------------------------------- the App's server
async def test_an_acl_user_that_cannot_run_scripts_on_the_apps_keys_is_refused_at_open(
    redis: Redis, redis_url: str
) -> None:
    # the worker retried such a user's NOPERM forever; now App.open() refuses it at once
    host = redis_url.split("//", 1)[1]
    prefix = unique_prefix()
    cases = {
        "no-fcall": (["~*", "+@all", "-fcall"], "fcall"),
        "other-keys": (["~elsewhere:*", "+@all"], "key"),
    }
    for name, (rules, says) in cases.items():
        user = f"inp-{name}-{prefix}"
        await redis.execute_command(  # type: ignore[no-untyped-call]
            "ACL", "SETUSER", user, "reset", "on", f">{user}", "&*", *rules
        )
        try:
            with pytest.raises(ConfigurationError, match=says):
                await App(f"redis://{user}:{user}@{host}", prefix=prefix).open()
        finally:
            await redis.execute_command("ACL", "DELUSER", user)  # type: ignore[no-untyped-call]
    # and a user limited to the app's own keys, as docs/security.md advises, is fine
    user = f"inp-ok-{prefix}"
    await redis.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", user, "reset", "on", f">{user}", f"~{prefix}:*", "&*", "+@all"
    )
    try:
        async with App(f"redis://{user}:{user}@{host}", prefix=prefix) as ok:
            add = ok.task(_add)
            job = await add.enqueue(1, 2)
            [r] = await ok.queue().reserve()
            await ok.queue().complete(r, 3)
            assert await job.result(timeout=5) == 3
    finally:
        await redis.execute_command("ACL", "DELUSER", user)  # type: ignore[no-untyped-call]


@pytest.mark.parametrize("options", [{"base": 1e300}, {"max": CENTURY * 2}, {"base": math.nan}])
def test_backoff_durations_are_bounded_like_every_duration(options: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError, match="Backoff"):
        Backoff(**options)


def test_a_bad_scheme_names_every_scheme_accepted_the_valkey_ones_too() -> None:
    with pytest.raises(ConfigurationError) as caught:
        App("http://localhost:6379/0")
    message = str(caught.value)
    for scheme in ("redis://", "valkey://", "rediss://", "valkeys://", "unix://"):
        assert scheme in message
    assert "redis+sentinel://" in message
    assert "redis+cluster://" in message
    for url in ("valkey://localhost/0", "valkeys://localhost/0", "valkey+cluster://h:7000"):
        App(url)  # accepted as the message says
