"""Hostile and broken input (I7): garbage written straight into a job's fields, payloads that
are truncated, not UTF-8 or fail to deserialise, unknown task names, huge arguments, invalid
options.

What must hold: a clear, typed error at the call (``ConfigurationError``, ``PayloadTooLarge``,
...), or the job dead-lettered with its reason; never a script error or a lost job; and the
worker keeps running: after each case it still runs a normal job.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from aioqueue import (
    AioQueueError,
    App,
    Backoff,
    ConfigurationError,
    EmbeddedServer,
    Job,
    JobState,
    PayloadTooLarge,
    SerializationError,
    ServerRefused,
    Task,
    WaitTimedOut,
    Worker,
    current_job,
)
from aioqueue._model.keys import QueueKeys
from aioqueue._model.record import Claimed, parse_claim
from aioqueue.testing import VirtualClock

from .support.apps import unique_prefix
from .support.invariants import check_invariants
from .support.server import server_ms, text
from .support.waiting import wait_until

FINISHED = ("completed", "failed", "cancelled")
REPO_ROOT = Path(__file__).resolve().parents[1]


class MarkedSerializer:
    """JSON, except that a payload containing ``boom`` makes ``loads`` raise."""

    name = "marked"

    def dumps(self, value: Any) -> bytes:
        return json.dumps(value).encode()

    def loads(self, data: bytes) -> Any:
        if b"boom" in data:
            raise RuntimeError("this deserialiser crashes on purpose")
        return json.loads(data)


def hostile_app(url: str, **options: Any) -> App:
    options.setdefault("lease", 0.5)  # a job whose run is lost comes back quickly
    options.setdefault("max_attempts", 2)
    options.setdefault("backoff", Backoff(base=0.01, factor=1.0, max=0.01, jitter=0.0))
    app = App(url, prefix=unique_prefix(), result_ttl=60, dead_ttl=60, **options)

    @app.task
    async def echo(x: int = 0) -> int:
        return x

    @app.task
    async def hold(key: str) -> str:
        """Run until ``key`` exists (bounded), so a test can change the job meanwhile."""
        redis = app.redis
        await wait_until(lambda: _exists(redis, key), timeout=10, what=f"{key} to exist")
        return "held"

    return app


@contextlib.asynccontextmanager
async def running(app: App) -> AsyncIterator[Worker]:
    async with (
        app,
        Worker(app, concurrency=4, idle_block=0.1, grace=0.5, unknown_task_grace=0) as worker,
    ):
        yield worker


async def outcome(redis: Redis, keys: QueueKeys, job_id: str, timeout: float = 10.0) -> str:
    """Wait for the job to finish: ``completed``, or ``failed:<reason type>``."""
    found: list[Any] = []

    async def finished() -> bool:
        s, e = await redis.hmget(keys.job(job_id), ["s", "e"])
        found[:] = [s, e]
        return s is not None and text(s) in FINISHED

    await wait_until(finished, timeout=timeout, what=f"job {job_id} to finish ({found})")
    state, err = text(found[0]), found[1]
    if state == "completed":
        return state
    return f"{state}:{json.loads(err)['type'] if err else '?'}"


async def still_works(app: App) -> None:
    """The worker is alive and fetching: a normal job runs."""
    job = await app.queue().enqueue("echo", kwargs={"x": 41})
    assert await job.result(timeout=5) == 41


# ---------------------------------------------------------------------- payloads
@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b"\xff\xfe\x00\x80 not utf-8", id="not-utf8"),
        pytest.param(b'[[1, 2], {"x": ', id="truncated-json"),
        pytest.param(b"", id="empty"),
        pytest.param(b'{"not": "an [args, kwargs] pair"}', id="not-a-pair"),
        pytest.param(b'["args", {}]', id="args-not-a-list"),
        pytest.param(b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00K\x01.", id="pickle-blob"),
    ],
)
async def test_a_corrupt_payload_is_dead_lettered_and_the_worker_carries_on(
    redis_url: str, redis: Redis, payload: bytes
) -> None:
    app = hostile_app(redis_url)
    async with running(app):
        q = app.queue()
        await q.pause()  # written before any worker can take it
        job = await q.enqueue("echo", kwargs={"x": 1})
        await redis.hset(q._keys.job(job.id), "p", payload)
        await q.resume()
        assert await outcome(redis, q._keys, job.id) == "failed:CorruptPayload"
        info = await job.info()
        assert info.error is not None
        assert "cannot decode" in info.error.message
        assert info.attempts == 1  # not retried: a corrupt payload stays corrupt
        await still_works(app)
        await check_invariants(redis, q._keys)


async def test_a_payload_the_deserialiser_chokes_on_is_dead_lettered(
    redis_url: str, redis: Redis
) -> None:
    app = hostile_app(redis_url, serializer=MarkedSerializer())
    async with running(app):
        q = app.queue()
        bad = await q.enqueue("echo", kwargs={"x": "boom"})
        assert await outcome(redis, q._keys, bad.id) == "failed:CorruptPayload"
        info = await bad.info()
        assert info.error is not None
        assert "crashes on purpose" in info.error.message
        await still_works(app)


async def test_the_pull_api_dead_letters_what_it_cannot_decode(
    redis_url: str, redis: Redis
) -> None:
    app = hostile_app(redis_url)
    async with app:
        q = app.queue()
        bad = await q.enqueue("echo", kwargs={"x": 1})
        bad_options = await q.enqueue("echo", kwargs={"x": 3})
        good = await q.enqueue("echo", kwargs={"x": 2})
        await redis.hset(q._keys.job(bad.id), "p", b"\xff")
        await redis.hset(q._keys.job(bad_options.id), "o", b"[1, 2]")
        got = await q.reserve(3)
        assert [r.id for r in got] == [good.id]
        # the same reason as a worker gives (one codec judges both)
        assert await outcome(redis, q._keys, bad.id) == "failed:CorruptPayload"
        assert await outcome(redis, q._keys, bad_options.id) == "failed:CorruptPayload"


async def test_an_unknown_task_is_dead_lettered_with_the_known_ones_named(
    redis_url: str, redis: Redis
) -> None:
    app = hostile_app(redis_url)
    async with running(app):
        q = app.queue()
        job = await q.enqueue("no.such.task", args=[1], allow_unknown=True)
        assert await outcome(redis, q._keys, job.id) == "failed:UnknownTask"
        info = await job.info()
        assert info.error is not None
        assert "no.such.task" in info.error.message
        assert "echo" in info.error.message
        await still_works(app)


async def test_huge_arguments_are_refused_at_enqueue_and_nothing_is_stored(
    redis_url: str, redis: Redis
) -> None:
    app = hostile_app(redis_url, max_payload_bytes=10_000)
    async with app:
        q = app.queue()
        echo = app.tasks["echo"]
        big = "x" * 20_000
        with pytest.raises(PayloadTooLarge, match="over the limit of 10,000"):
            await q.enqueue("echo", args=[big])
        with pytest.raises(PayloadTooLarge):
            await echo.enqueue(big)
        with pytest.raises(PayloadTooLarge):
            await echo.enqueue_many([{"x": 1}, ((big,), {})])
        assert isinstance(PayloadTooLarge("x"), SerializationError)
        assert not [k async for k in redis.scan_iter(match=app.prefix + ":*", count=1000)]


# ---------------------------------------------------------------------- garbage in fields
# field, value written while the job is queued, what must become of it
QUEUED_GARBAGE = [
    ("t", b"no.such.task", "failed:UnknownTask"),
    ("t", b"", "failed:UnknownTask"),
    ("a", b"abc", "completed"),  # claim sets the attempt count itself
    ("a", b"-7", "completed"),
    ("m", b"abc", "completed"),  # an unreadable maximum counts as 1
    ("m", b"0", "completed"),
    ("o", b"\xff\xfe", "failed:CorruptPayload"),
    ("o", b"[1, 2]", "failed:CorruptPayload"),
    ("o", b'{"timeout": "abc"}', "failed:CorruptPayload"),
    ("l", b"\xff garbage", "completed"),  # claim writes a new token
    ("pr", b"abc", "completed"),
    ("pr", b"1e400", "completed"),
    ("g", b"no-such-group", "completed"),
    # named limits (docs/flow-control.md): unreadable, or aimed at keys outside the prefix
    ("o", b'{"lim": "x"}', "failed:Garbled"),
    ("o", b'{"lim": {"b": "elsewhere:", "l": [["a", "k", 1, 1000, 1, 0]]}}', "failed:Garbled"),
    ("o", b'{"lim": {"b": "", "l": [[1, 2]]}}', "failed:Garbled"),
    ("g", b"\xff\xfe", "completed"),
]


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [pytest.param(*case, id=f"{case[0]}={case[1]!r}") for case in QUEUED_GARBAGE],
)
async def test_garbage_in_a_queued_jobs_field(
    redis_url: str, redis: Redis, field: str, value: bytes, expected: str
) -> None:
    app = hostile_app(redis_url)
    async with running(app):
        q = app.queue()
        await q.pause()
        job = await q.enqueue("echo", kwargs={"x": 5})
        await redis.hset(q._keys.job(job.id), field, value)
        await q.resume()
        assert await outcome(redis, q._keys, job.id) == expected
        await still_works(app)


async def test_a_task_name_that_is_not_utf8_is_dead_lettered(redis_url: str, redis: Redis) -> None:
    app = hostile_app(redis_url)
    async with running(app):
        q = app.queue()
        await q.pause()
        bad = await q.enqueue("echo", kwargs={"x": 5})
        good = await q.enqueue("echo", kwargs={"x": 6})
        await redis.hset(q._keys.job(bad.id), "t", b"\xff\xfe")
        await q.resume()
        assert await outcome(redis, q._keys, bad.id, timeout=5) == "failed:UnknownTask"
        assert await good.result(timeout=5) == 6
        await still_works(app)


async def test_a_job_with_a_garbage_state_is_dead_lettered_not_dropped(
    redis_url: str, redis: Redis
) -> None:
    app = hostile_app(redis_url)
    async with running(app):
        q = app.queue()
        await q.pause()
        job = await q.enqueue("echo", kwargs={"x": 5})
        await redis.hset(q._keys.job(job.id), "s", b"bogus")
        await q.resume()
        await still_works(app)  # the claim has passed over it by now
        assert (await redis.hget(q._keys.job(job.id), "s")) in (b"failed", b"completed")


@pytest.mark.parametrize(
    "options", [b'{"result_ttl": "abc"}', b'{"batch": "b1"}'], ids=["result_ttl", "batch"]
)
async def test_garbage_options_dead_letter_the_job_with_the_reason(
    redis_url: str, redis: Redis, options: bytes
) -> None:
    app = hostile_app(redis_url)
    runs: list[str] = []

    @app.task
    async def count() -> None:
        runs.append("run")

    async with running(app):
        q = app.queue()
        await q.pause()
        job = await q.enqueue("count")
        await redis.hset(q._keys.job(job.id), "o", options)
        await q.resume()
        result = await outcome(redis, q._keys, job.id)
        await still_works(app)
        assert result == "failed:CorruptPayload", result
        assert len(runs) <= 1, f"the body ran {len(runs)} times"


async def test_garbage_in_a_running_jobs_lease_token_only_costs_a_rerun(
    redis_url: str, redis: Redis
) -> None:
    """The worker's heartbeat and ack find the lease gone; the job's lease brings it back and
    it completes; the worker carries on."""
    app = hostile_app(redis_url, max_attempts=3)
    async with running(app):
        q = app.queue()
        release = f"{app.prefix}:release"
        job = await q.enqueue("hold", kwargs={"key": release})
        await wait_until(
            lambda: _state_is(redis, q._keys, job.id, b"active"), what="the job to start"
        )
        await redis.hset(q._keys.job(job.id), "l", b"forged")
        await redis.set(release, 1)
        assert await job.result(timeout=10) == "held"
        assert (await job.info()).attempts == 2
        await still_works(app)
        await check_invariants(redis, q._keys)


async def test_garbage_in_a_running_jobs_group_and_priority_is_harmless(
    redis_url: str, redis: Redis
) -> None:
    app = hostile_app(redis_url)
    async with app:
        q = app.queue()
        await q.enqueue("echo", job_id="j", group="tenant")
        [r] = await q.reserve(1)
        await redis.hset(q._keys.job("j"), mapping={"g": b"\xff other", "pr": b"abc"})
        await q.complete(r, 1)
        assert await redis.hget(q._keys.job("j"), "s") == b"completed"
        await check_invariants(redis, q._keys)


async def test_a_refunded_release_of_a_job_with_garbage_attempts_loses_nothing(
    redis_url: str, redis: Redis
) -> None:
    app = hostile_app(redis_url)
    async with app:
        q = app.queue()
        await q.enqueue("echo", job_id="j")
        [r] = await q.reserve(1)
        await redis.hset(q._keys.job("j"), "a", b"abc")
        with contextlib.suppress(AioQueueError, Exception):
            await q.release(r, refund=True)
        await check_invariants(redis, q._keys)  # active job j is in no structure


async def test_an_expired_job_with_a_nan_priority_is_not_lost(redis_url: str, redis: Redis) -> None:
    app = hostile_app(redis_url)
    async with app:
        q = app.queue()
        await q.enqueue("echo", job_id="j")
        await q.reserve(1, lease=0.01)
        await redis.hset(q._keys.job("j"), "pr", b"nan")
        await _until_server_time_passes(redis, q._keys, "j")
        with contextlib.suppress(AioQueueError, Exception):
            await q.reap()
        # (check_invariants cannot read a NaN priority; look at the lanes directly)
        state = await redis.hget(q._keys.job("j"), "s")
        lanes = {
            "active": await redis.zscore(q._keys.active, "j") is not None,
            "ready": b"j" in await redis.lrange(q._keys.ready, 0, -1),
            "prio": await redis.zscore(q._keys.prio, "j") is not None,
            "dead": await redis.zscore(q._keys.dead, "j") is not None,
        }
        assert any(lanes.values()), f"job j is {state!r} in no structure"


async def test_a_garbage_max_attempts_still_bounds_the_attempts(
    redis_url: str, redis: Redis
) -> None:
    app = hostile_app(redis_url)
    async with app:
        q = app.queue()
        await q.enqueue("echo", job_id="j", max_attempts=1)
        await redis.hset(q._keys.job("j"), "m", b"nan")
        for _ in range(3):  # a consumer that dies with it, three times
            if not await q.reserve(1, lease=0.01):
                break
            await _until_server_time_passes(redis, q._keys, "j")
            await q.reap()
        assert await redis.hget(q._keys.job("j"), "s") == b"failed"


@pytest.mark.parametrize(
    ("where", "setting", "group"),
    [
        ("qconf", {"rate_n": "abc", "rate_ms": "1000"}, None),
        ("qconf", {"rate_n": "5"}, None),
        ("gconf", {"rate_n:g": "5"}, "g"),
        ("qconf", {"maxq": "0", "maxq_wait": "60000"}, None),
        ("qconf", {"maxq": "1e400", "maxq_wait": "nan"}, "g"),
    ],
    ids=[
        "queue-rate-garbage",
        "queue-rate-without-period",
        "group-rate-without-period",
        "max-queued-zero",
        "max-queued-garbage",
    ],
)
async def test_garbage_queue_settings_do_not_stop_the_queue(
    redis_url: str, redis: Redis, where: str, setting: dict[str, str], group: str | None
) -> None:
    app = hostile_app(redis_url)
    async with app:
        q = app.queue()
        await q.enqueue("echo", job_id="j", group=group)
        for name, value in setting.items():
            await redis.hset(getattr(q._keys, where), name, value)
        assert [r.id for r in await q.reserve(1)] == ["j"]


async def test_a_worker_survives_every_kind_of_garbage_at_once(
    redis_url: str, redis: Redis
) -> None:
    """One worker, many broken jobs among good ones: each broken one is dead-lettered with
    its reason, each good one completes, and the worker keeps going."""
    app = hostile_app(redis_url)
    async with running(app):
        q = app.queue()
        await q.pause()
        broken = {
            "p": b"\xff\xfe",
            "o": b"[1]",
            "t": b"no.such.task",
        }
        bad_ids = {}
        for field, value in broken.items():
            job = await q.enqueue("echo", kwargs={"x": 0})
            await redis.hset(q._keys.job(job.id), field, value)
            bad_ids[job.id] = field
        good = [await q.enqueue("echo", kwargs={"x": i}) for i in range(20)]
        await q.resume()
        assert [await j.result(timeout=10) for j in good] == list(range(20))
        reasons = {bad_ids[j]: await outcome(redis, q._keys, j) for j in bad_ids}
        assert reasons == {
            "p": "failed:CorruptPayload",
            "o": "failed:CorruptPayload",
            "t": "failed:UnknownTask",
        }
        await still_works(app)
        states = await check_invariants(redis, q._keys)
        assert sorted(states.values()).count("completed") == 21


async def test_a_planted_virtual_clock_offset_does_not_move_a_production_apps_time(
    redis_url: str, redis: Redis
) -> None:
    """The testing kit's clock offset (``testclock``) is read only by Apps made with
    ``testing=True``: planted under a production App's queue, a day ahead or garbage, it
    makes no delayed job due early, expires no running job's lease, and shifts no reading of
    the time (docs/security.md)."""
    app = hostile_app(redis_url, lease=5)
    async with running(app):
        q = app.queue()
        key = q._keys.testclock
        later = await q.enqueue("echo", kwargs={"x": 1}, delay=3600)
        held = await q.enqueue("hold", kwargs={"key": f"{app.prefix}:go"})
        await wait_until(lambda: _state_is(redis, q._keys, held.id, b"active"), timeout=10)
        await redis.set(key, 86_400_000)  # a day ahead: were it read, both would be overdue
        await still_works(app)
        assert abs(await q._scripts.server_ms() - await server_ms(redis)) < 5000
        for garbage in (b"-86400000", b"nan", b"1e400", b"not a number"):
            await redis.set(key, garbage)
            await still_works(app)
        await redis.delete(key)
        await redis.hset(key, "x", "1")  # another type
        await redis.set(f"{app.prefix}:go", 1)
        await still_works(app)
        assert await outcome(redis, q._keys, held.id) == "completed"
        info = await held.info()
        assert info.attempts == 1  # its lease never ran out under it
        assert (await later.info()).state is JobState.SCHEDULED  # still an hour away
        await check_invariants(redis, q._keys)


# ---------------------------------------------------------------------- invalid options
def _app(url: str, **options: Any) -> Callable[[], Any]:
    return lambda: App(url, **options)


INVALID: list[tuple[str, Callable[[App], Any]]] = [
    ("App(lease=0)", lambda a: App(a.url, lease=0)),
    ("App(lease=-1)", lambda a: App(a.url, lease=-1)),
    ("App(lease=nan)", lambda a: App(a.url, lease=math.nan)),
    ("App(lease='30')", lambda a: App(a.url, lease="30")),  # type: ignore[arg-type]
    ("App(result_ttl=-1)", lambda a: App(a.url, result_ttl=-1)),
    ("App(dead_ttl=inf)", lambda a: App(a.url, dead_ttl=math.inf)),
    ("App(max_attempts=0)", lambda a: App(a.url, max_attempts=0)),
    ("App(socket_timeout=0)", lambda a: App(a.url, socket_timeout=0)),
    ("App(max_connections=1)", lambda a: App(a.url, max_connections=1)),
    ("App(url=http://)", lambda a: App("http://localhost:6379/0")),
    ("App(url=no scheme)", lambda a: App("localhost:6379")),
    ("App(prefix=a{b})", lambda a: App(a.url, prefix="a{b}")),
    ("App(serializer=yaml)", lambda a: App(a.url, serializer="yaml")),
    ("App(signing_key=short)", lambda a: App(a.url, signing_key="short")),
    ("Backoff(base=-1)", lambda a: Backoff(base=-1)),
    ("Backoff(jitter=2)", lambda a: Backoff(jitter=2)),
    ("options(delay=-1)", lambda a: a.tasks["echo"].options(delay=-1)),
    ("options(delay=nan)", lambda a: a.tasks["echo"].options(delay=math.nan)),
    ("options(delay=inf)", lambda a: a.tasks["echo"].options(delay=math.inf)),
    ("options(priority=101)", lambda a: a.tasks["echo"].options(priority=101)),
    ("options(priority=-101)", lambda a: a.tasks["echo"].options(priority=-101)),
    ("options(priority=True)", lambda a: a.tasks["echo"].options(priority=True)),
    ("options(priority=1.5)", lambda a: a.tasks["echo"].options(priority=1.5)),  # type: ignore[arg-type]
    ("options(max_attempts=0)", lambda a: a.tasks["echo"].options(max_attempts=0)),
    ("options(timeout=-1)", lambda a: a.tasks["echo"].options(timeout=-1)),
    ("options(at=-5)", lambda a: a.tasks["echo"].options(at=-5)),
    ("options(delay+at)", lambda a: a.tasks["echo"].options(delay=1, at=5)),
    ("options(job_id='')", lambda a: a.tasks["echo"].options(job_id="")),
    ("options(group='')", lambda a: a.tasks["echo"].options(group="")),
    ("enqueue(delay=-1)", lambda a: a.queue().enqueue("echo", delay=-1)),
    ("enqueue(priority=500)", lambda a: a.queue().enqueue("echo", priority=500)),
    ("enqueue(task='')", lambda a: a.queue().enqueue("")),
    ("queue('a b')", lambda a: a.queue("a b")),
    ("reserve(0)", lambda a: a.queue().reserve(0)),
    ("reserve(lease=0)", lambda a: a.queue().reserve(1, lease=0)),
    ("reserve(lease=-1)", lambda a: a.queue().reserve(1, lease=-1)),
    ("reserve(wait=-1)", lambda a: a.queue().reserve(1, wait=-1)),
    ("Worker(concurrency=0)", lambda a: Worker(a, concurrency=0)),
    ("Worker(concurrency=-5)", lambda a: Worker(a, concurrency=-5)),
    ("Worker(concurrency=2.5)", lambda a: Worker(a, concurrency=2.5)),  # type: ignore[arg-type]
    ("Worker(grace=-1)", lambda a: Worker(a, grace=-1)),
    ("Worker(queues twice)", lambda a: Worker(a, queues=["q", "q"])),
    ("set_group_limit(0)", lambda a: a.queue().set_group_limit("g", 0)),
    ("set_rate_limit(5, period=0)", lambda a: a.queue().set_rate_limit(5, period=0)),
    ("VirtualClock(production App)", lambda a: VirtualClock(a)),
]


@pytest.mark.parametrize(("label", "make"), INVALID, ids=[label for label, _ in INVALID])
async def test_invalid_options_are_refused_at_the_call(
    redis_url: str, label: str, make: Callable[[App], Any]
) -> None:
    app = hostile_app(redis_url)
    async with app:
        with pytest.raises(ConfigurationError):
            await _call(lambda: make(app))
        assert not [k async for k in app.redis.scan_iter(match=app.prefix + ":*", count=1000)]


@pytest.mark.parametrize(
    "label",
    [
        "port-out-of-range",
        "broken-ipv6-url",
        "negative-max-payload",
        "nan-backoff",
        "str-as-args",
        "empty-queue-option",
    ],
)
async def test_more_invalid_options_are_refused_at_the_call(redis_url: str, label: str) -> None:
    app = hostile_app(redis_url)
    makers: dict[str, Callable[[], Any]] = {
        "port-out-of-range": _app("redis://127.0.0.1:99999/0"),
        "broken-ipv6-url": _app("redis://[::1/0"),
        "negative-max-payload": _app(redis_url, max_payload_bytes=-1),
        "nan-backoff": lambda: Backoff(base=math.nan),
        "str-as-args": lambda: app.queue().enqueue("echo", args="abc"),
        "empty-queue-option": lambda: app.tasks["echo"].options(queue=""),
    }
    async with app:
        with pytest.raises(ConfigurationError):
            await _call(makers[label])


@pytest.mark.skipif(sys.platform == "win32", reason="unix sockets")
async def test_a_unix_socket_url_works() -> None:
    data = Path(tempfile.mkdtemp(prefix="aqu", dir="/tmp"))  # short: sun_path is ~104 bytes
    try:
        with EmbeddedServer(data, unix_socket=True, appendonly=False) as server:
            async with App(server.url, prefix=unique_prefix()) as app:
                job = await app.queue().enqueue("t")
                assert (await app.queue().reserve(1))[0].id == job.id
    finally:
        shutil.rmtree(data, ignore_errors=True)


def test_the_cli_refuses_zero_concurrency(redis_url: str) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "aioqueue",
            "worker",
            "tests.workerapp:app",
            "--url",
            redis_url,
            "--concurrency",
            "0",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert b"--concurrency must be >= 1" in proc.stderr


def test_the_cli_refuses_a_bad_url() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "aioqueue",
            "worker",
            "tests.workerapp:app",
            "--url",
            "http://localhost:6379",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert b"scheme must be redis://" in proc.stderr
    assert b"Traceback" not in proc.stderr, proc.stderr.decode()


# ---------------------------------------------------------------------- helpers
async def _call(make: Callable[[], Any]) -> None:
    """Call ``make``; await what it returns if that is a coroutine."""
    result = make()
    if asyncio.iscoroutine(result):
        await result


async def _exists(redis: Redis, key: str) -> bool:
    return bool(await redis.exists(key))


async def _state_is(redis: Redis, keys: QueueKeys, job_id: str, state: bytes) -> bool:
    return bool(await redis.hget(keys.job(job_id), "s") == state)


async def _until_server_time_passes(redis: Redis, keys: QueueKeys, job_id: str) -> None:
    deadline = await redis.zscore(keys.active, job_id)
    assert deadline is not None
    await wait_until(
        lambda: _after(redis, deadline), timeout=5, what=f"the lease of {job_id} to run out"
    )


async def _after(redis: Redis, ms: float) -> bool:
    return await server_ms(redis) > ms


# ---------------------------------------------------------------------- garbage in the keyspace
# I9: a key of the wrong type, a counter that is not a number, an entry nobody could have
# written: each is set aside (listed in the queue's ``garbled`` hash) and the queue goes on;
# no job outside the garbled key is lost. Each case below lost jobs (or stopped the queue)
# before the scripts repaired what they met.


async def garbled_keys(redis: Redis, keys: QueueKeys) -> dict[str, str]:
    """The queue's quarantine record: ``{original key: reason}``."""
    raw = await redis.hgetall(keys.garbled)
    out = {}
    for value in raw.values():
        rec = json.loads(value)
        out[rec["key"]] = rec["reason"]
    return out


async def paused_jobs(app: App, n: int, **options: Any) -> list[str]:
    q = app.queue()
    await q.pause()
    ids = [(await q.enqueue("echo", kwargs={"x": i}, **options)).id for i in range(n)]
    await q.resume()
    return ids


async def test_a_garbage_group_count_neither_strands_claimed_jobs_nor_recovered_ones(
    redis_url: str, redis: Redis
) -> None:
    """gactive <group> = garbage: the claim that charged the group failed after its jobs were
    marked active (3 jobs in no structure); recovering 11 expired leases then lost 5 more."""
    app = hostile_app(redis_url)
    async with app:
        q = app.queue()
        k = q._keys
        ids = await paused_jobs(app, 3, group="g1")
        await redis.hset(k.gactive, "g1", "garbage")
        got = await q.reserve(3, lease=60)
        assert sorted(r.id for r in got) == sorted(ids)
        states = await check_invariants(redis, k)
        assert set(states.values()) == {"active"}
        assert k.gactive in await garbled_keys(redis, k)
        # expired leases of group jobs, then the group's count garbled: reap hands all back
        more = await paused_jobs(app, 11, group="g2")
        leased = await q.reserve(11, lease=0.05)
        assert len(leased) == 11
        await redis.hset(k.gactive, "g2", "garbage")
        for r in leased:
            await _until_server_time_passes(redis, k, r.id)
        assert (await q.reap())["recovered"] == 11
        states = await check_invariants(redis, k)
        assert {states[i] for i in more} == {"queued"}
        again = await q.reserve(20)
        assert {r.id for r in again} >= set(more)
        await check_invariants(redis, k)


async def test_a_garbage_sequence_counter_loses_no_claim(redis_url: str, redis: Redis) -> None:
    """SET seq x: the claim failed after popping 3 jobs. Now seq is set aside and restarted
    above every token handed out (tokens keep growing). The counter numbers the tokens of a
    claim whose random material is short (an older client's nonce); a claim with its own
    material for every token does not read it."""
    app = hostile_app(redis_url)
    async with app:
        q = app.queue()
        k = q._keys
        first = await paused_jobs(app, 1)
        (before,) = await _derived_claim(app, 1)
        assert before.id == first[0]
        ids = await paused_jobs(app, 3, priority=5)
        await redis.set(k.seq, "x")
        got = await _derived_claim(app, 3)
        assert sorted(r.id for r in got) == sorted(ids)
        # tokens are <seq>-<nonce>: the sequence restarts above every token handed out before,
        # written out in full (a Lua number that large would otherwise print as 1.79e+15)
        seqs = [r.token.split("-")[0] for r in got]
        assert all(s.isdigit() for s in seqs), seqs
        assert len({r.token for r in got}) == 3
        assert min(int(s) for s in seqs) > int(before.token.split("-")[0])
        assert k.seq in await garbled_keys(redis, k)
        # the counter garbage again: a claim with material of its own goes on all the same
        more = await paused_jobs(app, 2)
        await redis.set(k.seq, "x")
        assert sorted(r.id for r in await q.reserve(2)) == sorted(more)
        await check_invariants(redis, k)


async def _derived_claim(app: App, n: int) -> list[Claimed]:
    """Lease the n jobs queued as an older client does: a 32-digit nonce, short of a claim of
    more than 2, so the tokens are numbered by the queue's counter and derived from it."""
    scripts = app.queue()._scripts
    args = (scripts.base, n + 2, 30_000, 60_000, "", 0, "5eed" * 8, "", "")
    return parse_claim(await scripts.run("claim", args)).jobs


async def test_a_garbage_group_rate_window_counter_loses_no_claim(
    redis_url: str, redis: Redis
) -> None:
    app = hostile_app(redis_url)
    async with app:
        q = app.queue()
        k = q._keys
        period_ms = 3_600_000  # one window for the whole test
        await q.set_rate_limit(100, period_ms / 1000, group="g")
        ids = await paused_jobs(app, 2, group="g")
        window = await server_ms(redis) // period_ms
        rate_key = f"{k.base}grate:g:{window}"
        await redis.set(rate_key, "x")
        got = await q.reserve(2)
        if not got:  # the window turned between reading the clock and the claim
            return
        assert sorted(r.id for r in got) == sorted(ids)
        assert rate_key in await garbled_keys(redis, k)
        assert await redis.get(rate_key) == b"2"
        await check_invariants(redis, k)


async def test_a_groups_lane_of_the_wrong_type_loses_no_other_job_and_the_queue_goes_on(
    redis_url: str, redis: Redis
) -> None:
    app = hostile_app(redis_url)
    async with app:
        q = app.queue()
        k = q._keys
        await q.pause()
        bad = [(await q.enqueue("echo", group="bad")).id for _ in range(2)]
        good = [(await q.enqueue("echo", group="good")).id for _ in range(3)]
        plain = [(await q.enqueue("echo")).id for _ in range(3)]
        await redis.delete(k.lane("bad"))
        await redis.set(k.lane("bad"), "garbage")  # the 2 jobs in it are the garbled key's
        await q.resume()
        got = await q.reserve(10)
        assert {r.id for r in got} == {*good, *plain}
        assert k.lane("bad") in await garbled_keys(redis, k)
        later = await q.enqueue("echo", group="bad")
        assert [r.id for r in await q.reserve(10)] == [later.id]
        # the 2 jobs that were in the overwritten lane are that key's loss; nothing else is
        assert [await redis.hget(k.job(i), "s") for i in bad] == [b"queued"] * 2
        await redis.delete(*(k.job(i) for i in bad))
        await check_invariants(redis, k)


async def test_enqueue_with_an_id_into_a_ready_list_of_the_wrong_type(
    redis_url: str, redis: Redis
) -> None:
    """ready = a string: enqueue(job_id=) raised a raw ResponseError and left a queued record
    in no lane, so its retry answered "exists" and the job never ran."""
    app = hostile_app(redis_url)
    async with running(app):
        q = app.queue()
        k = q._keys
        await redis.set(k.ready, "garbage")
        job = await q.enqueue("echo", kwargs={"x": 7}, job_id="fixed-id")
        assert await job.result(timeout=10) == 7
        assert k.ready in await garbled_keys(redis, k)
        await check_invariants(redis, k)


async def test_an_error_reply_is_a_typed_error_not_redis_pys(redis_url: str) -> None:
    app = hostile_app(redis_url)
    async with app:
        with pytest.raises(ServerRefused, match="unknown operation") as caught:
            await app.queue()._scripts.configure("no-such-operation")
        assert isinstance(caught.value.__cause__, ResponseError)


async def test_a_job_id_that_is_not_utf8_is_dead_lettered_and_its_neighbours_run(
    redis_url: str, redis: Redis
) -> None:
    """Its neighbours in the same claim timed out again and again (the reply could not be
    read), and a good job was dead-lettered without running."""
    app = hostile_app(redis_url)
    async with app:
        q = app.queue()
        k = q._keys
        await q.pause()
        before = await q.enqueue("echo", kwargs={"x": 1})
        bad_id = b"\xff\xfe-not-utf8"
        bad_key = k.job("").encode() + bad_id
        await redis.hset(bad_key, mapping={"t": "echo", "p": b"[[], {}]", "s": "queued", "a": 0})
        await redis.hset(bad_key, "m", 2)
        await redis.rpush(k.ready, bad_id)
        after = await q.enqueue("echo", kwargs={"x": 2})
        await q.resume()
        got = await q.reserve(5)
        assert [r.id for r in got] == [before.id, after.id]
        s, e = await redis.hmget(bad_key, ["s", "e"])
        assert s == b"failed"
        assert e is not None
        assert json.loads(e)["type"] == "Garbled"
        assert await redis.zscore(k.dead, bad_id) is not None
        for r in got:
            await q.complete(r, 0)
        await check_invariants(redis, k)
    app = hostile_app(redis_url)
    async with running(app):  # and a worker meeting one runs the rest
        q = app.queue()
        k = q._keys
        await q.pause()
        jobs = [await q.enqueue("echo", kwargs={"x": i}) for i in range(3)]
        bad_key = k.job("").encode() + bad_id
        await redis.hset(bad_key, mapping={"t": "echo", "p": b"[[], {}]", "s": "queued", "a": 0})
        await redis.rpush(k.ready, bad_id, b"\xc0\xaf")  # overlong: not UTF-8 either
        await q.resume()
        assert [await j.result(timeout=10) for j in jobs] == [0, 1, 2]
        await still_works(app)


async def test_garbage_in_a_parked_workers_hand_list_is_set_aside(
    redis_url: str, redis: Redis
) -> None:
    app = hostile_app(redis_url)
    async with app:
        q = app.queue()
        k = q._keys
        ids = await paused_jobs(app, 2)
        await redis.rpush(k.hand("w1"), "garbage", "more")
        res = await q._scripts.claim(5, 10_000, 0, "w1", 0)
        assert sorted(c.id for c in res.jobs) == sorted(ids)
        assert k.hand("w1") in await garbled_keys(redis, k)
        await check_invariants(redis, k)


async def test_garbage_counters_in_stats_are_set_aside(redis_url: str, redis: Redis) -> None:
    app = hostile_app(redis_url)
    async with running(app):
        q = app.queue()
        k = q._keys
        await redis.hset(k.stats, mapping={"completed": "x", "enqueued": "nan"})
        assert "completed" not in await q.stats()  # a garbled counter is left out
        await still_works(app)
        stats = await q.stats()
        assert stats["completed"] >= 1
        assert stats["garbled"] >= 1
        await check_invariants(redis, k)


#: every fixed key of a queue, with a value of the wrong type for it
WRONG_TYPES = [
    ("ready", "string"),
    ("prio", "string"),
    ("scheduled", "list"),
    ("active", "string"),
    ("dead", "hash"),
    ("wake", "hash"),
    ("seq", "list"),
    ("stats", "string"),
    ("qconf", "list"),
    ("ring", "string"),
    ("gactive", "zset"),
    ("gconf", "string"),
    ("gwait", "hash"),
    ("idle", "string"),
    ("idlew", "list"),
    ("outbox", "hash"),
    ("garbled", "string"),
    ("backlog", "string"),
    ("task_waits", "hash"),
]


async def _write(redis: Redis, key: str, kind: str) -> None:
    await redis.delete(key)
    if kind == "string":
        await redis.set(key, "garbage")
    elif kind == "list":
        await redis.rpush(key, "garbage")
    elif kind == "hash":
        await redis.hset(key, "garbage", "x")
    else:
        await redis.zadd(key, {"garbage": 1})


@pytest.mark.parametrize(("name", "kind"), WRONG_TYPES, ids=[n for n, _ in WRONG_TYPES])
async def test_every_key_of_the_wrong_type_is_set_aside_and_the_queue_goes_on(
    redis_url: str, redis: Redis, name: str, kind: str
) -> None:
    """The class, not the examples: whichever of the queue's keys holds the wrong type, jobs
    of every kind (plain, priority, group, delayed, retried) still run to their end."""
    app = hostile_app(redis_url, lease=2.0)
    runs: list[int] = []

    @app.task
    async def flaky(i: int) -> int:
        runs.append(i)
        if runs.count(i) == 1:
            raise RuntimeError("the first attempt fails")
        return i

    async with app:
        q = app.queue()
        k = q._keys
        await _write(redis, getattr(k, name), kind)
        if name == "garbled":  # met when something else is recorded there
            await redis.set(k.seq, "x")
        jobs = [
            await q.enqueue("echo", kwargs={"x": 1}),
            await q.enqueue("echo", kwargs={"x": 2}, priority=3),
            await q.enqueue("echo", kwargs={"x": 3}, group="g"),
            await q.enqueue("echo", kwargs={"x": 4}, delay=0.05),
            await q.enqueue("flaky", kwargs={"i": 5}),
        ]
        async with Worker(app, concurrency=4, idle_block=0.1, grace=0.5):
            assert [await j.result(timeout=15) for j in jobs] == [1, 2, 3, 4, 5]
            await still_works(app)
            key = getattr(k, name)  # set aside by the first script (or maintenance) meeting it
            await wait_until(lambda: _has_garbled(redis, k, key), timeout=10, what="set aside")
        await check_invariants(redis, k)


#: integer limits written over a number (I12): the ends of the 64-bit range, past the 2^53 a
#: script's Lua numbers hold exactly, negative, numbers that are not integers
INT_LIMITS = ["9223372036854775807", "-9223372036854775808", "9007199254740993", "-1", "1.5"]
INT_LIMITS += ["1e400", "nan", ""]


@dataclass(frozen=True)
class Family:
    """A key family and garbage for it: ``kind`` a wrong type (string, list, hash, zset, set)
    or an integer limit ("=<value>" the key's value, "<field>=<value>" a field's); ``aside``:
    the first script meeting it must list it in ``garbled`` (else it is ignored as garbage,
    or met only by a reader); ``reason``: what its reason there says; ``schedules``: a key of
    the schedules, after which the declared schedule must fire again."""

    key: Callable[[QueueKeys, str], str]
    kind: str
    aside: bool = True
    reason: str = ""
    schedules: bool = False


def _families() -> dict[str, Family]:
    out = {
        # the registry (wid: the worker's id), unique locks, events, metrics, schedules and
        # the indexes listings page through with their cursors
        "workers-string": Family(lambda k, w: k.workers, "string"),
        "worker-list": Family(lambda k, w: k.worker(w), "list"),
        "worker-jobs-string": Family(lambda k, w: k.worker_jobs(w), "string"),
        "unique-hash": Family(lambda k, w: k.unique("u"), "hash"),
        "events-hash": Family(lambda k, w: k.events, "hash"),
        "tp-string": Family(lambda k, w: k.throughput, "string"),
        "trend-hour-list": Family(lambda k, w: k.trend("h", _hour()), "list"),
        "trend-hour-tasks-string": Family(lambda k, w: k.trend("h", _hour()) + ":t", "string"),
        "cron-defs-list": Family(
            lambda k, w: k.cron_defs, "list", reason="wrong type: list", schedules=True
        ),
        "cron-next-hash": Family(
            lambda k, w: k.cron_next, "hash", reason="wrong type: hash", schedules=True
        ),
        "completed-string": Family(lambda k, w: k.completed, "string"),
        "cancelled-string": Family(lambda k, w: k.cancelled, "string"),
    }
    counted: list[tuple[str, Callable[[QueueKeys, str], str], str, bool]] = [
        ("seq", lambda k, w: k.seq, "", True),
        ("stats", lambda k, w: k.stats, "completed", True),
        ("gactive", lambda k, w: k.gactive, "g", True),
        ("tp", lambda k, w: k.throughput, "c:{minute}", True),
        ("trend", lambda k, w: k.trend("h", _hour()), "c:echo", True),
        ("backlog", lambda k, w: k.backlog, "t:echo", True),
        ("worker-ln", lambda k, w: k.worker(w), "ln", True),
        ("worker-sn", lambda k, w: k.worker(w), "sn", False),  # written over by its beat
        ("glimit", lambda k, w: k.qconf, "glimit", False),  # a garbage setting is none
        ("events-cap", lambda k, w: k.qconf, "events", False),
        ("group-limit", lambda k, w: k.gconf, "limit:g", False),
    ]
    for name, key, field, aside in counted:
        for i, v in enumerate(INT_LIMITS):
            sane = v.isdigit() and int(v) < 2**53
            out[f"{name}-{i}"] = Family(key, f"{field}={v}", aside and not sane)
    return out


def _hour() -> int:
    """This hour of the epoch (the trend bucket the scripts write now; the machine's clock is
    the embedded server's)."""
    return int(time.time() // 3600)


FAMILIES = _families()


async def _garble(redis: Redis, key: str, kind: str) -> None:
    if "=" not in kind:
        await _write(redis, key, kind)
        return
    field, _, value = kind.partition("=")
    minute = await server_ms(redis) // 60000
    # a field of this minute is planted for the next one too: the counts that meet it may come
    # after the minute turns (the run crossed it once, and the garbage was never met)
    fields = {field.format(minute=m) for m in (minute, minute + 1)}
    if not field:
        await redis.set(key, value)
    else:
        if await redis.type(key) not in (b"hash", b"none"):
            await redis.delete(key)
        for name in fields:
            await redis.hset(key, name, value)


@pytest.mark.parametrize("family", list(FAMILIES))
async def test_every_key_family_of_the_wrong_type_or_at_an_integer_limit_the_queue_goes_on(
    redis_url: str, redis: Redis, family: str
) -> None:
    """The class over every key family (registry, unique locks, events, metrics, schedules,
    the listings' indexes, counters and settings), each with a wrong type or a number at an
    integer limit: jobs of every kind run to their end, the readers (listing with a cursor,
    throughput, workers, groups, events, stats) answer, and a counter is set aside, like a
    schedule key (by the worker's scheduler), after which the declared schedule fires again."""
    f = FAMILIES[family]
    app = hostile_app(redis_url, lease=2.0)
    ticks: list[int] = []

    @app.task
    async def tick() -> None:
        ticks.append(1)

    app.schedule(tick, every=0.05)
    async with app:
        q = app.queue()
        k = q._keys
        await q.set_events(100)
        await q.set_group_limit("g", 2)
        worker = Worker(app, concurrency=4, idle_block=0.1, grace=0.5)
        key = f.key(k, worker.id)
        await _garble(redis, key, f.kind)
        jobs = [
            await q.enqueue("echo", kwargs={"x": 1}),
            await q.enqueue("echo", kwargs={"x": 2}, priority=3),
            await q.enqueue("echo", kwargs={"x": 3}, group="g"),
            await q.enqueue("echo", kwargs={"x": 4}, delay=0.05),
            await q.enqueue("echo", kwargs={"x": 5}, unique=True, unique_key="u"),
        ]
        cancelled = await q.enqueue("echo", kwargs={"x": 6}, delay=60)
        await q.cancel_jobs([cancelled.id])
        async with worker:
            assert [await j.result(timeout=15) for j in jobs] == [1, 2, 3, 4, 5]
            await still_works(app)
            if f.aside:
                await wait_until(lambda: _has_garbled(redis, k, key), timeout=10, what="aside")
                assert f.reason in (await garbled_keys(redis, k))[key]
            if f.schedules:  # the declared schedule was stored again, and fires
                fired = len(ticks)
                await wait_until(lambda: len(ticks) > fired, timeout=15, what="a tick after")
            page = await q.jobs("completed", limit=2)
            listed = [j.id for j in page.items]
            while page.cursor:
                page = await q.jobs("completed", limit=2, cursor=page.cursor)
                listed += [j.id for j in page.items]
            assert {j.id for j in jobs} <= set(listed)
            await q.throughput(5)
            await q.workers()
            await q.groups()
            await q.events_page(count=10)
            assert all(0 <= n < 2**53 for n in (await q.stats()).values())
        await check_invariants(redis, k)


#: the workflow key families (issue 27): a job's step hash, its log, an event's waiters, with
#: a wrong type; a recorded wait end and a log's byte count at integer limits. ``aside``: the
#: script meeting it lists it in ``garbled``; ``ends``: how the job ends ("completed", or
#: "failed" when a value it must trust cannot be read)
WORKFLOW_FAMILIES: dict[str, tuple[Callable[[QueueKeys, str], str], str, bool, str]] = {
    "steps-string": (lambda k, j: k.steps(j), "string", True, "completed"),
    "steps-list": (lambda k, j: k.steps(j), "list", True, "completed"),
    "log-hash": (lambda k, j: k.job_log(j), "hash", True, "completed"),
    "log-zset": (lambda k, j: k.job_log(j), "zset", True, "completed"),
    "event-string": (lambda k, j: k.event("e"), "string", True, "completed"),
    "event-hash": (lambda k, j: k.event("e"), "hash", True, "completed"),
}
for _i, _v in enumerate(INT_LIMITS):
    # a recorded wait end that is garbage counts as passed (the wait ends, never hangs)
    WORKFLOW_FAMILIES[f"wait-end-{_i}"] = (lambda k, j: k.steps(j), f"d:1={_v}", False, "completed")
    WORKFLOW_FAMILIES[f"log-bytes-{_i}"] = (lambda k, j: k.job(j), f"lb={_v}", False, "completed")


@pytest.mark.parametrize("family", list(WORKFLOW_FAMILIES))
async def test_every_workflow_key_family_with_garbage_the_job_ends_and_the_queue_goes_on(
    redis_url: str, redis: Redis, family: str
) -> None:
    """A job that logs, records a step, sleeps and waits for an event, with garbage planted
    in one of its keys before it runs: it ends (its steps recorded once), a key of the wrong
    type is set aside with the reason, and other jobs run on."""
    key_of, kind, aside, ends = WORKFLOW_FAMILIES[family]
    app = hostile_app(redis_url, lease=2.0)
    runs: list[str] = []

    @app.task
    async def flow() -> str:
        ctx = current_job()
        ctx.log("start")

        def make() -> str:
            runs.append("s")
            return "v"

        value = await ctx.step("s", make)
        await ctx.sleep(0.05)
        with contextlib.suppress(WaitTimedOut):
            await ctx.wait_for_event("e", timeout=0.05)
        ctx.log("end")
        return str(value)

    async with app:
        q = app.queue()
        k = q._keys
        job = await flow.options(job_id="wf1", delay=60).enqueue()
        key = key_of(k, job.id)
        if kind.startswith("lb="):
            await redis.hset(key, "lb", kind.partition("=")[2])
        elif "=" in kind:  # a wait end recorded by this very job (its creation time)
            ct = await redis.hget(k.job(job.id), "ct")
            assert ct is not None
            await redis.hset(key, mapping={"ct": ct, kind.split("=")[0]: kind.split("=")[1]})
        else:
            await _write(redis, key, kind)
        await q.promote([job.id])
        async with Worker(app, concurrency=4, idle_block=0.1, grace=0.5):
            assert await outcome(redis, k, job.id, timeout=30) == ends
            assert await job.result(timeout=5) == "v"
            assert runs == ["s"]
            await still_works(app)
            if aside:
                await wait_until(lambda: _has_garbled(redis, k, key), timeout=10, what="aside")
        await check_invariants(redis, k)


async def test_a_job_record_of_the_wrong_type_in_a_lane_is_set_aside(
    redis_url: str, redis: Redis
) -> None:
    app = hostile_app(redis_url)
    async with running(app):
        q = app.queue()
        k = q._keys
        await q.pause()
        bad = await q.enqueue("echo", kwargs={"x": 1})
        good = await q.enqueue("echo", kwargs={"x": 2})
        await redis.delete(k.job(bad.id))
        await redis.set(k.job(bad.id), "garbage")
        await q.resume()
        assert await good.result(timeout=10) == 2
        await wait_until(
            lambda: _has_garbled(redis, k, k.job(bad.id)), timeout=10, what="it set aside"
        )
        await still_works(app)
        await check_invariants(redis, k)


async def _has_garbled(redis: Redis, keys: QueueKeys, key: str) -> bool:
    return key in await garbled_keys(redis, keys)


# ---------------------------------------------------------------------- the outbox
async def cross_queue_batch(app: App) -> tuple[Any, Any]:
    """A batch on the default queue of two sub-jobs on queue "other"."""
    echo = app.tasks["echo"]
    batch: Any = await app.batch(
        [echo.options(queue="other").call(1), echo.options(queue="other").call(2)]
    )
    return batch, app.queue("other")


async def test_a_garbage_outbox_entry_is_set_aside_and_the_batch_completes_pull_api(
    redis_url: str, redis: Redis
) -> None:
    """One garbage entry in a queue's outbox: complete() raised although the job completed,
    and every cross-queue batch of that queue stayed open forever."""
    app = hostile_app(redis_url)
    async with app:
        batch, other = await cross_queue_batch(app)
        k = other._keys
        await redis.rpush(k.outbox, b"garbage", b"9:short", b"1:a1:b1:c1:1\xff:x")
        got = await other.reserve(2)
        assert len(got) == 2
        for r in got:
            await other.complete(r, r.args[0])  # does not raise
        info = await batch.wait(timeout=10)
        assert (info.done, info.failed) == (2, 0)
        assert await redis.llen(k.outbox) == 0
        assert len(await redis.lrange(k.outbox_garbled, 0, -1)) == 3
        assert k.outbox in await garbled_keys(redis, k)


async def test_a_garbage_outbox_entry_does_not_stop_a_workers_maintenance(
    redis_url: str, redis: Redis
) -> None:
    app = hostile_app(redis_url)
    async with running(app):
        other = app.queue("other")
        await redis.rpush(other._keys.outbox, b"garbage")
        async with Worker(app, queues=["other"], concurrency=2, idle_block=0.1, grace=0.5):
            for _ in range(2):  # the outbox is met again after the first batch
                batch, _ = await cross_queue_batch(app)
                info = await batch.wait(timeout=15)
                assert (info.done, info.failed) == (2, 0)
                await redis.rpush(other._keys.outbox, b"12:x")
        await still_works(app)


# ---------------------------------------------------------------------- pub/sub
async def test_a_message_that_is_not_utf8_does_not_stop_the_result_listener(
    redis_url: str, redis: Redis
) -> None:
    """It killed the App's listener (every later result() waited for the 5 s re-check) and
    made App.aclose() raise."""
    app = hostile_app(redis_url)
    async with running(app):
        q = app.queue()
        await still_works(app)  # subscribed
        waiter = app.result_waiter
        assert waiter is not None
        listener = waiter._listener
        assert listener is not None
        await redis.publish(q._keys.done_channel, b"\xff\xfe")
        await redis.publish(q._keys.done_channel, b"fine")
        job = await q.enqueue("echo", kwargs={"x": 3})
        assert await job.result(timeout=10) == 3
        assert not listener.done(), listener
    # aclose() did not raise (the context manager exited)


def test_every_script_command_on_a_key_goes_through_the_repairing_call() -> None:
    """The class, in the source: a script that ran ``redis.call`` on a key directly would stop
    midway on garbage (after a destructive move, which Redis does not undo). Only core's own
    repair machinery (and ``TIME``, which names no key) may call Redis directly."""
    lua = REPO_ROOT / "aioqueue" / "_store" / "lua"
    core = (lua / "lib" / "core.lua").read_text()
    start = core.index(
        "-- ---------------------------------------------------------------- garbage"
    )
    end = core.index("-- redis.call on a key, repaired once")
    checked = {"lib/core.lua": core[:start] + core[end:]}
    # two scripts have no library parts: schedules.lua (two keys of its own, not a queue's
    # transition keys) reads both before writing either, so garbage fails it before any
    # change; page.lua only reads
    for path in sorted([*lua.glob("*.lua"), *(lua / "lib").glob("*.lua")]):
        name = str(path.relative_to(lua))
        if name not in ("lib/core.lua", "schedules.lua", "page.lua"):
            checked[name] = path.read_text()
    for name, source in checked.items():
        direct = [
            line.strip()
            for line in source.splitlines()
            if re.search(r"redis\.call\((?!'TIME'\))", line)
            and "return redis.call(cmd, key, ...)" not in line
        ]
        assert not direct, f"{name} calls Redis on a key directly: {direct}"


# ---------------------------------------------------------------------- why (issue 28, point 6)
WHY_GARBAGE: list[tuple[str, Callable[[Any, str], Any]]] = [
    ("gactive-not-a-count", lambda k, g: ("hset", k.gactive, g, "lots")),
    ("group-limit-not-a-count", lambda k, g: ("hset", k.gconf, f"limit:{g}", "1e400")),
    ("group-rate-garbage", lambda k, g: ("hset", k.gconf, f"rate_n:{g}", "x")),
    ("queue-rate-garbage", lambda k, g: ("hset", k.qconf, "rate_ms", "nan")),
    ("tasks-wrong-type", lambda k, g: ("set", k.base + "tasks", "x")),
    ("workers-wrong-type", lambda k, g: ("set", k.workers, "x")),
    ("tasks-entry-garbage", lambda k, g: ("hset", k.base + "tasks", "echo", "\x00\xff no newline")),
    ("due-not-a-number", lambda k, g: ("hset", k.job("j"), "due", "nan")),
]


@pytest.mark.parametrize(("label", "plant"), WHY_GARBAGE, ids=[label for label, _ in WHY_GARBAGE])
async def test_garbage_in_what_why_reads_still_gives_an_answer(
    redis_url: str, redis: Redis, label: str, plant: Callable[[Any, str], Any]
) -> None:
    app = hostile_app(redis_url)
    async with app:
        q = app.queue()
        await q.enqueue("echo", job_id="j", group="g")
        command, *args = plant(q._keys, "g")
        await getattr(redis, command)(*args)
        w = await q.job("j").why()
        assert w.rows[-1].reason.value == "position"
        assert w.sentence()
        # and the queue goes on
        assert [r.id for r in await q.reserve(1)] == ["j"]


#: the key families of job dependencies (lua/lib/deps.lua), each with garbage written where a
#: dependency flow meets it: ``when`` "before" the dependent is enqueued, or "after" it
DEPENDENCY_FAMILIES = {
    "waiting-string": ("waiting", "before"),
    # (a set of dependents is made for the second: the first is kept in the record's dd)
    "dependents-string": ("dependents", "before"),
    # the lone dependent kept in the dependency's record, garbage before it gains one
    "dd-garbage": ("dd", "before"),
    # (the set of what a dependent with two or more dependencies waits for)
    "deps-hash": ("deps", "after"),
    "dl-garbage": ("dl", "after"),
    "dp-garbage": ("dp", "after"),
    # the results kept for a dependent with two dependencies (depres, one of its extras)
    "depres-string": ("depres", "after"),
    # a lone dependency, kept in the record (d1) rather than in a set
    "d1-garbage": ("d1", "after"),
}


@pytest.mark.parametrize("family", list(DEPENDENCY_FAMILIES))
async def test_garbage_in_every_dependency_key_is_contained(
    redis_url: str, redis: Redis, family: str
) -> None:
    """Each key family of dependencies with garbage in it: a key of the wrong type is set
    aside with its reason (a lost set of dependencies dead-letters its dependent, Garbled,
    never runs it early), a garbage field reads as none; every other job runs to its end."""
    what, when = DEPENDENCY_FAMILIES[family]
    app = hostile_app(redis_url, lease=2.0)
    ran: list[str] = []

    @app.task
    async def dep(x: int) -> int:
        return x

    @app.task
    async def dependent(tag: str) -> dict[str, Any]:
        ran.append(tag)
        return await current_job().dependency_results()

    async with app:
        q = app.queue()
        k = q._keys
        a = await dep.enqueue(1)
        key = {"waiting": k.waiting, "dependents": k.dependents(a.id)}.get(what, "")
        if what == "dd":
            await redis.hset(k.job(a.id), "dd", "\xff{garbage")
        elif when == "before":
            await redis.set(key, "garbage")
        # two dependencies where the family is their set (or the results kept from it)
        b = await dep.enqueue(3) if what in ("deps", "depres") else None
        c = await dependent.options(depends_on=[a] if b is None else [a, b]).enqueue("c")
        # a second dependent: the dependents go to their set (the first alone stays in dd)
        c2 = await dependent.options(depends_on=[a]).enqueue("c2")
        if what == "deps":
            key = k.deps(c.id)
            await redis.delete(key)
            await redis.hset(key, "x", "garbage")
        elif what in ("dl", "dp", "d1"):
            await redis.hset(k.job(c.id), what, "\xff{garbage")
        elif what == "depres":
            key = k.dep_results(c.id)
            await redis.set(key, "garbage")
        other = await dep.enqueue(2)
        plain = await dependent.options(depends_on=[other]).enqueue("plain")
        async with Worker(app, concurrency=4):
            assert await plain.result(timeout=30) == {other.id: 2}
            await a.result(timeout=30)
            await wait_until(lambda: _ended(c), timeout=30, what="the dependent to end")
            await wait_until(lambda: _ended(c2), timeout=30, what="the second dependent to end")
        info = await c.info()
        if what in ("deps", "d1"):  # what it waits for is lost: never run early
            assert info.state is JobState.FAILED
            assert info.error is not None
            assert info.error.type == "Garbled"
            assert "c" not in ran
        else:
            assert info.state is JobState.COMPLETED
        if what == "depres" and b is not None:  # set aside, the results kept in a fresh hash
            assert await c.result(timeout=5) == {a.id: 1, b.id: 3}
            assert await redis.type(key) == b"hash"
        if what in ("waiting", "dependents", "deps", "depres"):
            assert key in await garbled_keys(redis, k)
        if what == "dd":  # the garbage read as a dependent: its outbox entry is set aside
            garbled = await garbled_keys(redis, k)
            assert garbled == {k.outbox: "an entry that cannot be read"}
        assert (await c2.info()).state is JobState.COMPLETED
        assert (await q.jobs("waiting")).items == ()
        await check_invariants(redis, k)


def _dependency_app(
    redis_url: str,
) -> tuple[App, Task[[int], int], Task[[str], dict[str, Any]]]:
    """A hostile app with a dependency task (its argument for result) and a dependent one
    (the results of its dependencies for result)."""
    app = hostile_app(redis_url, lease=2.0)

    @app.task
    async def dep(x: int) -> int:
        return x

    @app.task
    async def dependent(tag: str) -> dict[str, Any]:
        return await current_job().dependency_results()

    return app, dep, dependent


@pytest.mark.parametrize("what", ["deps", "depres"])
async def test_garbage_met_by_dependencies_completed_in_one_call_is_contained(
    redis_url: str, redis: Redis, what: str
) -> None:
    """The garbage of the rows above where a dependent keeps its set of dependencies and the
    results kept for it, met by dependencies that one call completes (they tell their
    dependent together, lib/deps DQ.told): a set that is lost dead-letters it (Garbled,
    never run early); a hash of the wrong type is set aside and the results kept anew."""
    app, dep, dependent = _dependency_app(redis_url)
    async with app:
        q = app.queue()
        k = q._keys
        a, b = await dep.enqueue(1), await dep.enqueue(3)
        c = await dependent.options(depends_on=[a, b]).enqueue("c")
        if what == "deps":
            key = k.deps(c.id)
            await redis.delete(key)
            await redis.hset(key, "x", "garbage")
        else:
            key = k.dep_results(c.id)
            await redis.set(key, "garbage")
        held = {r.id: r for r in await q.reserve(2, lease=60)}
        acks = [(j.id, held[j.id].token, str(x).encode(), 60_000) for j, x in ((a, 1), (b, 3))]
        assert all(o.value == "ok" for o in await q._scripts.complete(acks))
        assert key in await garbled_keys(redis, k)
        if what == "deps":
            info = await c.info()
            assert info.state is JobState.FAILED
            assert info.error is not None
            assert info.error.type == "Garbled"
        else:
            async with Worker(app, concurrency=2):
                assert await c.result(timeout=30) == {a.id: 1, b.id: 3}
            assert await redis.type(key) == b"hash"
        await check_invariants(redis, k)


@pytest.mark.parametrize("what", ["dd", "dependents"])
async def test_a_dependent_whose_edge_was_garbled_after_it_registered_still_runs(
    redis_url: str, redis: Redis, what: str
) -> None:
    """Garbage written over a dependency's record of its dependents after they registered (its
    dd, the lone one; its set, two or more) loses the edge, so its outcome tells nobody. The
    reap's sweep (lib/deps: DQ.sweep) finds the jobs still waiting for a dependency that ended
    and counts it: they run, with its result."""
    app, dep, dependent = _dependency_app(redis_url)
    async with app:
        q = app.queue()
        k = q._keys
        a = await dep.enqueue(1)
        waiting = [await dependent.options(depends_on=[a]).enqueue("c")]
        if what == "dd":
            await redis.hset(k.job(a.id), "dd", "\xff{garbage")
        else:
            waiting.append(await dependent.options(depends_on=[a]).enqueue("c2"))
            await redis.delete(k.dependents(a.id))
            await redis.set(k.dependents(a.id), "garbage")
        async with Worker(app, concurrency=4):
            assert await a.result(timeout=30) == 1
            for job in waiting:
                assert await job.result(timeout=30) == {a.id: 1}
        assert (await q.jobs("waiting")).items == ()
        await check_invariants(redis, k)


async def _ended(job: Job[Any]) -> bool:
    return (await job.state()).finished


#: a workflow's record (``job:wf-<hex>``, its graph in ``wg``) with garbage written over it:
#: not JSON, JSON of another shape, steps or sinks of the wrong form, a queue name that is no
#: queue's, an edge to no step; and the record itself of the wrong type
WORKFLOW_RECORD_GARBAGE: dict[str, str | None] = {
    "not-json": "\xff{garbage",
    "a-list": "[1, 2]",
    "no-name": json.dumps({"steps": {}, "sinks": []}),
    "steps-a-list": json.dumps({"name": "w", "steps": [], "sinks": []}),
    "step-a-number": json.dumps({"name": "w", "steps": {"a": 5}, "sinks": ["a"]}),
    "step-no-queue": json.dumps({"name": "w", "steps": {"a": {"id": "x", "after": []}}}),
    "queue-with-braces": json.dumps(
        {"name": "w", "steps": {"a": {"q": "x}{y", "id": "x", "after": []}}, "sinks": ["a"]}
    ),
    "edge-to-nothing": json.dumps(
        {"name": "w", "steps": {"a": {"q": "d", "id": "x", "after": ["z"]}}, "sinks": ["a"]}
    ),
    "sink-not-a-step": json.dumps(
        {"name": "w", "steps": {"a": {"q": "d", "id": "x", "after": []}}, "sinks": ["z"]}
    ),
    "record-a-string": None,
}


@pytest.mark.parametrize("family", list(WORKFLOW_RECORD_GARBAGE))
async def test_garbage_in_a_workflows_record_reads_as_no_workflow_and_its_steps_run(
    redis_url: str, redis: Redis, family: str
) -> None:
    """Every reader of a workflow's record (its handle, the tree the CLI and the dashboard
    show) answers garbage there with ``WorkflowError`` (no such workflow), never a crash
    deeper in; the steps, which do not read the record once it released them, run on, and
    the handle that enqueue returned (which knows its sink) gets the sink's result."""
    from aioqueue import WorkflowError, WorkflowHandle
    from aioqueue._app.workflow import workflow_tree

    app = hostile_app(redis_url, lease=2.0)
    echo = app.tasks["echo"]
    async with app:
        k = app.queue()._keys
        wf = app.workflow("w")
        a = wf.step("a", echo.call(1))
        wf.step("b", echo.call(2), after=[a])
        handle = await wf.enqueue()
        ids = {n: v["id"] for n, v in (await handle.graph())["steps"].items()}
        garbage = WORKFLOW_RECORD_GARBAGE[family]
        if garbage is None:
            await redis.delete(k.job(handle.id))
            await redis.set(k.job(handle.id), "garbage")
        else:
            await redis.hset(k.job(handle.id), "wg", garbage)
        by_id = WorkflowHandle(app, handle.id)  # knows nothing but the record
        for read in (handle.graph, handle.nodes, handle.state, handle.cancel, by_id.result):
            with pytest.raises(WorkflowError):
                await read()
        with pytest.raises(WorkflowError):
            await workflow_tree(handle)
        async with Worker(app, concurrency=2, idle_block=0.1, grace=0.5):
            # the handle enqueue returned knows its sink: it never reads the record
            assert await handle.result(timeout=30) == 2
            assert await app.queue().job(ids["b"]).result(timeout=30) == 2
            assert await app.queue().job(ids["a"]).result(timeout=5) == 1
            await still_works(app)
        if garbage is None:  # set aside by the next script that met it, or left to expire
            await redis.delete(k.job(handle.id))
        await check_invariants(redis, k)
