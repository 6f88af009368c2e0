"""Enqueue: typed and by-name calls, options, batches in one round trip, and bad input (I7)."""

from __future__ import annotations

import inspect
import json
import math
import socket
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection

import aioqueue
from aioqueue import (
    App,
    ClosedError,
    ConfigurationError,
    JobState,
    PayloadTooLarge,
    SerializationError,
)
from aioqueue._model.limits import DEFAULT_MAX_ATTEMPTS
from aioqueue._model.signature import Signature
from aioqueue._store.embedded import EmbeddedServer

from .support.apps import open_app, unique_prefix
from .support.invariants import check_invariants
from .support.server import server_ms, text

# also on a local Valkey Cluster (tests/conftest.py)
pytestmark = pytest.mark.cluster


async def stored_keys(redis: Redis, app: App) -> list[str]:
    """Every key under the App's prefix."""
    return [text(k) async for k in redis.scan_iter(match=app.prefix + ":*", count=1000)]


async def job_field(redis: Redis, app: App, job_id: str, field: str, queue: str = "default") -> str:
    value = await redis.hget(app.queue(queue)._keys.job(job_id), field)
    assert value is not None, f"job {job_id} has no field {field!r}"
    return text(value)


# ---------------------------------------------------------------------------- typed tasks


async def test_typed_enqueue_stores_positional_and_keyword_arguments(
    app: App, redis: Redis
) -> None:
    @app.task
    async def add(x: int, y: int = 0, *, scale: float = 1.0) -> float:
        return (x + y) * scale

    job = await add.enqueue(1, 2, scale=0.5)
    assert job.queue == app.default_queue
    info = await job.info()
    assert info.task == "add"
    assert info.args == (1, 2)
    assert info.kwargs == {"scale": 0.5}
    assert info.state is JobState.QUEUED
    assert (info.attempts, info.max_attempts, info.priority) == (0, app.max_attempts, 0)
    assert await job.state() is JobState.QUEUED

    by_keyword = await add.enqueue(x=3, y=4)
    info = await by_keyword.info()
    assert (info.args, info.kwargs) == ((), {"x": 3, "y": 4})

    states = await check_invariants(redis, app.queue()._keys)
    assert states == {job.id: "queued", by_keyword.id: "queued"}
    assert await app.queue().counts() == {"scheduled": 0, "queued": 2, "active": 0, "failed": 0}


async def test_created_time_is_the_servers(app: App, redis: Redis) -> None:
    @app.task
    async def noop() -> None:
        return None

    before = await server_ms(redis)
    info = await (await noop.enqueue()).info()
    after = await server_ms(redis)
    assert before <= info.created_ms <= after


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((1, 2, 3, 4), {}),  # too many positional
        ((), {}),  # missing x
        ((1,), {"z": 1}),  # unknown keyword
        ((1,), {"scale": 2.0, "nope": 1}),
        ((), {"y": 1, "scale": 2.0}),  # keyword-only given, x missing
    ],
)
async def test_signature_mismatch_raises_type_error_and_stores_nothing(
    app: App, redis: Redis, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    @app.task
    async def add(x: int, y: int = 0, *, scale: float = 1.0) -> float:
        return (x + y) * scale

    untyped: Any = add  # the type checker refuses these calls; the runtime must as well
    with pytest.raises(TypeError):
        await untyped.enqueue(*args, **kwargs)
    with pytest.raises(TypeError):
        await untyped.enqueue_many([(args, kwargs)])
    with pytest.raises(TypeError):
        await untyped.options(priority=1).enqueue(*args, **kwargs)
    assert await stored_keys(redis, app) == []


def _f_plain(a: int, b: int, c: int = 0) -> None: ...
def _f_kwonly(a: int, *, b: int, c: int = 0) -> None: ...
def _f_varargs(a: int, *rest: int, b: int = 0) -> None: ...
def _f_varkw(a: int, **extra: int) -> None: ...
def _f_posonly(a: int, b: int = 0, /, c: int = 0) -> None: ...
def _f_none() -> None: ...
def _f_defaults(a: int = 0, b: int = 0) -> None: ...
def _f_star(*rest: int) -> None: ...
def _f_kwonly_default(a: int, *, b: int = 0) -> None: ...


_CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((), {}),
    ((1,), {}),
    ((1, 2), {}),
    ((1, 2, 3), {}),
    ((1, 2, 3, 4), {}),
    ((), {"a": 1, "b": 2}),
    ((1,), {"b": 2}),
    ((1,), {"c": 3}),
    ((1,), {"b": 2, "c": 3}),
    ((1,), {"d": 4}),
    ((1, 2), {"c": 3}),
    ((), {"b": 2}),
]


@pytest.mark.parametrize(
    "fn",
    [
        _f_plain,
        _f_kwonly,
        _f_varargs,
        _f_varkw,
        _f_posonly,
        _f_none,
        _f_defaults,
        _f_star,
        _f_kwonly_default,
    ],
)
def test_signature_check_agrees_with_python_on_ordinary_calls(fn: Callable[..., None]) -> None:
    """The fast enqueue-time check accepts exactly the calls Python would accept (calls with
    positional arguments only take a shortcut: the same answers)."""
    sig = Signature(fn, fn.__name__)
    for args, kwargs in _CALLS:
        try:
            inspect.signature(fn).bind(*args, **kwargs)
            python_ok = True
        except TypeError:
            python_ok = False
        try:
            sig.check(args, kwargs)
            ours_ok = True
        except TypeError:
            ours_ok = False
        assert ours_ok == python_ok, f"{fn.__name__}{args, kwargs}: python {python_ok}"


async def test_argument_given_twice_is_refused_at_enqueue(app: App, redis: Redis) -> None:
    """Regression: f(a, b=0) with enqueue(1, a=2) used to pass the check."""

    @app.task
    async def resize(image: str, width: int = 800) -> None:
        return None

    untyped: Any = resize
    with pytest.raises(TypeError):
        await untyped.enqueue("a.png", image="b.png")
    assert await stored_keys(redis, app) == []


async def test_positional_only_parameter_by_keyword_is_refused_at_enqueue(app: App) -> None:
    """Regression: f(a, /, **kw) with enqueue(a=1) used to pass the check."""

    @app.task
    async def tag(item: str, /, **labels: str) -> None:
        return None

    untyped: Any = tag
    with pytest.raises(TypeError):
        await untyped.enqueue(item="x")


async def test_enqueue_by_name_needs_no_task_code(app: App, redis: Redis) -> None:
    queue = app.queue("remote")
    job = await queue.enqueue("billing.charge", [42, "eur"], {"retry": False})
    assert job.queue == "remote"
    info = await job.info()
    assert (info.task, info.args, info.kwargs) == ("billing.charge", (42, "eur"), {"retry": False})
    assert info.state is JobState.QUEUED
    (reserved,) = await queue.reserve()
    assert (reserved.id, reserved.task, reserved.args) == (job.id, "billing.charge", (42, "eur"))
    assert reserved.kwargs == {"retry": False}
    assert reserved.queue == "remote"
    await check_invariants(redis, queue._keys)


@pytest.mark.parametrize("name", ["", 5, None])
async def test_enqueue_by_name_rejects_bad_task_names(app: App, name: Any) -> None:
    with pytest.raises(ConfigurationError):
        await app.queue().enqueue(name)
    assert await app.queue().counts() == {"scheduled": 0, "queued": 0, "active": 0, "failed": 0}


async def test_task_options_route_to_their_queue(app: App) -> None:
    @app.task(queue="media", max_attempts=5, priority=7)
    async def encode(path: str) -> None:
        return None

    job = await encode.enqueue("a.mp4")
    assert job.queue == "media"
    info = await job.info()
    assert (info.max_attempts, info.priority) == (5, 7)
    assert (await app.queue("media").counts())["queued"] == 1
    assert (await app.queue().counts())["queued"] == 0

    other = await encode.options(queue="urgent", priority=-3).enqueue("b.mp4")
    assert other.queue == "urgent"
    assert (await other.info()).priority == -3


# ---------------------------------------------------------------------------- options


async def test_delay_schedules_by_the_server_clock(app: App, redis: Redis) -> None:
    @app.task
    async def ping() -> None:
        return None

    job = await ping.options(delay=5).enqueue()
    info = await job.info()
    assert info.state is JobState.SCHEDULED
    assert info.due_ms == info.created_ms + 5000
    score = await redis.zscore(app.queue()._keys.scheduled, job.id)
    assert score == info.due_ms

    later = await ping.options(delay=timedelta(minutes=1)).enqueue()
    later_info = await later.info()
    assert later_info.due_ms == later_info.created_ms + 60_000

    by_name = await app.queue().enqueue("ping", delay=2.5)
    by_name_info = await by_name.info()
    assert by_name_info.due_ms == by_name_info.created_ms + 2500

    now = await ping.options(delay=0).enqueue()
    assert await now.state() is JobState.QUEUED
    assert await app.queue().reserve() != []
    await check_invariants(redis, app.queue()._keys)


async def test_at_schedules_an_absolute_time(app: App, redis: Redis) -> None:
    @app.task
    async def ping() -> None:
        return None

    now_ms = await server_ms(redis)
    at = datetime.fromtimestamp(now_ms / 1000 + 3600, UTC)
    job = await ping.options(at=at).enqueue()
    info = await job.info()
    assert info.state is JobState.SCHEDULED
    assert info.due_ms == int(at.timestamp() * 1000)

    posix = now_ms / 1000 + 120.25
    by_name = await app.queue().enqueue("ping", at=posix)
    assert (await by_name.info()).due_ms == int(posix * 1000)

    past = await ping.options(at=datetime(2001, 1, 1, tzinfo=UTC)).enqueue()
    assert await past.state() is JobState.QUEUED
    await check_invariants(redis, app.queue()._keys)


@pytest.mark.parametrize(
    "options",
    [
        {"delay": -1},
        {"delay": math.inf},
        {"delay": "5"},
        {"at": datetime(2030, 1, 1)},  # naive: ambiguous
        {"at": -5},
        {"delay": 1, "at": 2_000_000_000},
        {"priority": 101},
        {"priority": -101},
        {"priority": True},
        {"priority": 1.5},
        {"max_attempts": 0},
        {"max_attempts": True},
        {"timeout": -1},
        {"result_ttl": math.nan},
        {"job_id": ""},
        {"job_id": "x" * 257},
    ],
)
async def test_invalid_options_are_refused_at_the_call(
    app: App, redis: Redis, options: dict[str, Any]
) -> None:
    @app.task
    async def ping() -> None:
        return None

    with pytest.raises(ConfigurationError):
        ping.options(**options)
    with pytest.raises(ConfigurationError):
        await app.queue().enqueue("ping", **options)
    assert await stored_keys(redis, app) == []


@pytest.mark.parametrize("priority", [-100, -1, 1, 100])
async def test_priority_range_is_inclusive(app: App, redis: Redis, priority: int) -> None:
    @app.task
    async def ping() -> None:
        return None

    job = await ping.options(priority=priority).enqueue()
    assert (await job.info()).priority == priority
    assert await redis.zscore(app.queue()._keys.prio, job.id) is not None
    by_name = await app.queue().enqueue("ping", priority=priority)
    assert (await by_name.info()).priority == priority
    await check_invariants(redis, app.queue()._keys)


async def test_task_priority_is_validated_at_registration(app: App) -> None:
    with pytest.raises(ConfigurationError):

        @app.task(priority=101)
        async def ping() -> None:
            return None


async def test_task_max_attempts_zero_is_refused(app: App) -> None:
    """Regression: 0 used to fall back to the App's default silently."""
    with pytest.raises(ConfigurationError):

        @app.task(max_attempts=0)
        async def ping() -> None:
            return None


async def test_job_id_makes_enqueue_idempotent(app: App, redis: Redis) -> None:
    @app.task
    async def charge(order: int) -> None:
        return None

    first = await charge.options(job_id="order-1").enqueue(1)
    second = await charge.options(job_id="order-1").enqueue(2)
    by_name = await app.queue().enqueue("charge", [3], job_id="order-1")
    assert first.id == second.id == by_name.id == "order-1"
    assert first == second == by_name
    info = await first.info()
    assert info.args == (1,)  # the first enqueue wins
    assert await redis.llen(app.queue()._keys.ready) == 1
    assert (await app.queue().stats())["enqueued"] == 1
    assert await check_invariants(redis, app.queue()._keys) == {"order-1": "queued"}

    # a delayed duplicate does not reschedule the queued original either
    again = await charge.options(job_id="order-1", delay=60).enqueue(4)
    assert again.id == "order-1"
    assert await first.state() is JobState.QUEUED


async def test_a_plain_record_stores_neither_its_attempts_nor_the_default_maximum(
    app: App, redis: Redis
) -> None:
    """A new record leaves out a (0) and m when it is the default (10 bytes: its listpack
    drops into the next smaller size class); claim, fail and the readers take them as 0 and
    DEFAULT_MAX_ATTEMPTS, so such a job still gets its retries; another maximum is stored."""

    @app.task(name="flaky")
    async def flaky() -> None:
        return None

    q = app.queue()
    plain = await flaky.enqueue()
    five = await flaky.options(max_attempts=5).enqueue()
    raw = await redis.hgetall(q._keys.job(plain.id))
    assert sorted(raw) == [b"ct", b"p", b"s", b"t"]
    assert await job_field(redis, app, five.id, "m") == "5"
    assert (await q.job(plain.id).info()).max_attempts == DEFAULT_MAX_ATTEMPTS == 3
    (summary,) = [s for s in (await q.jobs("queued")).items if s.id == plain.id]
    assert (summary.attempts, summary.max_attempts) == (0, DEFAULT_MAX_ATTEMPTS)
    seen: list[tuple[int, int]] = []
    retried: list[bool] = []
    while True:
        got = [r for r in await q.reserve(5, lease=60) if r.id == plain.id]
        if not got:
            break
        (r,) = got
        seen.append((r.attempt, r.max_attempts))
        retried.append(await q.fail(r, "boom", delay=0))
    assert seen == [(1, 3), (2, 3), (3, 3)]
    assert retried == [True, True, False]
    info = await q.job(plain.id).info()
    assert (info.state.value, info.attempts, info.max_attempts) == ("failed", 3, 3)


async def test_a_lone_plain_job_is_stored_as_the_general_way_stores_it(
    app: App, redis: Redis
) -> None:
    """enqueue.lua writes one plain job (one run of one job, runnable now, of no group,
    batch, priority, options or lock, into a queue without events or a backlog limit) on a
    short way of its own; the same job sent with another (the general way) gets the same
    record, the same place in the ready list, the same counts and the same answer, and so
    does a retry of either (an id that exists takes the general way)."""

    @app.task(name="lone")
    async def lone(x: int) -> None:
        return None

    q = app.queue()
    keys = q._keys
    fields: dict[str, set[Any]] = {}
    for label, most in (("default maximum", None), ("its own maximum", 5)):
        short = await lone.options(max_attempts=most).enqueue(x=1)  # one job: the short way
        pair = await lone.options(max_attempts=most).enqueue_many([{"x": 1}, {"x": 1}])
        records = [await redis.hgetall(keys.job(j.id)) for j in (short, *pair)]
        for record in records:
            record.pop(b"ct")
        assert records[0] == records[1] == records[2], label
        fields[label] = set(records[0])
        # a retry of a stored id is answered "exists" and stores nothing more, either way
        for job in (short, pair[0]):
            again = await q.enqueue("lone", kwargs={"x": 1}, job_id=job.id, max_attempts=most)
            assert again.id == job.id
    assert fields["default maximum"] == {b"t", b"p", b"s"}
    assert fields["its own maximum"] == {b"t", b"p", b"s", b"m"}
    ready = [text(i) for i in await redis.lrange(keys.ready, 0, -1)]
    assert len(set(ready)) == len(ready) == 6
    assert (await q.counts())["queued"] == 6
    assert (await q.stats())["enqueued"] == 6
    assert await check_invariants(redis, keys) == dict.fromkeys(ready, "queued")


async def test_a_lone_plain_job_leaves_the_queue_as_the_general_way_leaves_it(
    app: App, redis: Redis
) -> None:
    """With no worker parked, the short way also pushes and counts the job itself; what it
    leaves (the ready list, the ring, the wake token, the stats and the backlog per task)
    is what the general way leaves for the same job: here, a queue with a backlog limit,
    which the short way never takes."""

    @app.task(name="lone")
    async def lone(x: int) -> None:
        return None

    async def state(queue: str) -> dict[str, Any]:
        keys = app.queue(queue)._keys
        return {
            "ready": len(await redis.lrange(keys.ready, 0, -1)),
            "ring": await redis.zrange(keys.ring, 0, -1),
            "wake": await redis.lrange(keys.wake, 0, -1),
            "stats": await redis.hgetall(keys.stats),
            "backlog": await redis.hgetall(keys.base + "backlog"),
        }

    await app.queue("general").set_max_queued(1_000_000)
    seen = []
    for queue in ("short", "general"):
        for i in range(3):
            await lone.options(queue=queue).enqueue(x=i)
        seen.append(await state(queue))
        ids = [text(i) for i in await redis.lrange(app.queue(queue)._keys.ready, 0, -1)]
        assert await check_invariants(redis, app.queue(queue)._keys) == dict.fromkeys(ids, "queued")
    assert seen[0] == seen[1]
    assert seen[0]["ready"] == 3
    assert seen[0]["ring"] == [b""]
    assert seen[0]["wake"] == [b"1"]
    assert seen[0]["backlog"] == {b"t:lone": b"3"}


async def test_max_attempts_timeout_and_result_ttl_are_stored(app: App, redis: Redis) -> None:
    @app.task
    async def ping() -> None:
        return None

    job = await ping.options(max_attempts=7, timeout=30, result_ttl=60).enqueue()
    assert await job_field(redis, app, job.id, "m") == "7"
    assert json.loads(await job_field(redis, app, job.id, "o")) == {
        "timeout": 30.0,
        "result_ttl": 60.0,
    }
    by_name = await app.queue().enqueue(
        "ping", max_attempts=2, timeout=timedelta(seconds=5), result_ttl=0
    )
    assert await job_field(redis, app, by_name.id, "m") == "2"
    assert json.loads(await job_field(redis, app, by_name.id, "o")) == {
        "timeout": 5.0,
        "result_ttl": 0.0,
    }
    plain = await ping.enqueue()
    assert await redis.hget(app.queue()._keys.job(plain.id), "o") is None

    reserved = {r.id: r for r in await app.queue().reserve(3)}
    assert reserved[job.id].options == {"timeout": 30.0, "result_ttl": 60.0}
    assert reserved[job.id].max_attempts == 7
    assert reserved[plain.id].options == {}


# ---------------------------------------------------------------------------- batches


async def test_enqueue_many_is_one_round_trip(
    fresh_server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A private server, so that its command statistics count only this test's commands."""
    n = 1234  # three script calls of at most 500 jobs, pipelined
    observer = Redis.from_url(fresh_server.url)
    try:
        async with open_app(fresh_server.url) as app:

            @app.task
            async def square(x: int) -> int:
                return x * x

            await square.enqueue_many([{"x": -1}])  # the server now knows the script

            async def evalsha_calls() -> int:  # script calls: FCALL (or EVALSHA)
                stats = await observer.info("commandstats")
                return sum(
                    int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("fcall", "evalsha")
                )

            writes = 0
            send = AbstractConnection.send_packed_command

            async def counting_send(self: AbstractConnection, *args: Any, **kwargs: Any) -> None:
                nonlocal writes
                writes += 1
                await send(self, *args, **kwargs)

            before = await evalsha_calls()
            monkeypatch.setattr(AbstractConnection, "send_packed_command", counting_send)
            jobs = await square.enqueue_many([((i,), {}) for i in range(n)])
            monkeypatch.undo()
            calls = await evalsha_calls() - before

            assert writes == 1, f"enqueue_many wrote to the server {writes} times"
            assert calls == math.ceil(n / 500), f"{calls} script calls for {n} jobs"
            assert len({j.id for j in jobs}) == n
            states = await check_invariants(observer, app.queue()._keys)
            assert len(states) == n + 1
            assert (await app.queue().counts())["queued"] == n + 1
            # FIFO across the script calls of one batch
            ready = [text(m) for m in await observer.lrange(app.queue()._keys.ready, 0, -1)]
            assert ready[1:] == [j.id for j in jobs]
    finally:
        await observer.aclose()


async def test_enqueue_many_accepts_mappings_and_pairs_with_bound_options(
    app: App, redis: Redis
) -> None:
    @app.task
    async def add(x: int, y: int = 0) -> int:
        return x + y

    jobs = await add.options(delay=30, priority=5).enqueue_many([{"x": 1}, ((2,), {"y": 3})])
    infos = [await j.info() for j in jobs]
    assert [(i.args, i.kwargs) for i in infos] == [((), {"x": 1}), ((2,), {"y": 3})]
    assert all(i.state is JobState.SCHEDULED and i.priority == 5 for i in infos)
    assert all(i.due_ms == i.created_ms + 30_000 for i in infos)
    assert await add.enqueue_many([]) == []
    with pytest.raises(ConfigurationError):
        await add.options(job_id="one").enqueue_many([{"x": 1}])
    await check_invariants(redis, app.queue()._keys)


# ---------------------------------------------------------------------------- bad input (I7)


@pytest.mark.parametrize("bad", [object(), {1, 2}, b"raw bytes", {"k": object()}, [1, {2, 3}]])
async def test_unserialisable_arguments_fail_at_enqueue_and_store_nothing(
    app: App, redis: Redis, bad: Any
) -> None:
    @app.task
    async def take(value: Any) -> None:
        return None

    with pytest.raises(SerializationError, match="json"):
        await take.enqueue(bad)
    with pytest.raises(SerializationError):
        await take.enqueue(value=bad)
    with pytest.raises(TypeError):  # SerializationError is also a TypeError
        await app.queue().enqueue("take", [bad])
    with pytest.raises(SerializationError):  # one bad job: the whole batch is refused
        await take.enqueue_many([{"value": 1}, {"value": bad}, {"value": 3}])
    assert await stored_keys(redis, app) == []


async def test_json_app_stores_a_datetime_in_iso_form(app: App, redis: Redis) -> None:
    """Once refused (orjson turned it into a string, silently changing its type); now the
    task's annotation decides what the job receives (tests/test_args.py): ``Any`` gets the
    ISO string stored here, ``datetime`` a datetime."""

    @app.task
    async def when(at: Any) -> None:
        return None

    job = await when.enqueue(datetime(2030, 1, 1, tzinfo=UTC))
    assert (await job.info()).args == ("2030-01-01T00:00:00+00:00",)


async def test_json_app_refuses_nan(app: App, redis: Redis) -> None:
    """Regression: orjson used to write NaN as null, so the job got None."""

    @app.task
    async def measure(value: float) -> None:
        return None

    with pytest.raises(SerializationError):
        await measure.enqueue(math.nan)
    assert await stored_keys(redis, app) == []


async def test_pickle_is_only_used_on_explicit_opt_in(redis_url: str, redis: Redis) -> None:
    moment = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    async with open_app(redis_url) as json_app:
        assert json_app.serializer.name == "json"

        @json_app.task
        async def when(at: Any) -> None:
            return None

        with pytest.raises(SerializationError):
            await when.enqueue({1, 2})

    with pytest.raises(ConfigurationError, match="signing_key"):  # unsigned pickle: refused
        App(redis_url, serializer="pickle")
    async with open_app(redis_url, serializer="pickle", allow_unsigned_pickle=True) as pickle_app:

        @pickle_app.task
        async def when_p(at: datetime, tags: set[str]) -> dict[str, datetime]:
            return {"at": at}

        job = await when_p.enqueue(moment, {"a", "b"})
        raw = await redis.hget(pickle_app.queue()._keys.job(job.id), "p")
        assert isinstance(raw, bytes)
        assert raw.startswith(b"\x80")  # a pickle stream, not JSON
        (reserved,) = await pickle_app.queue().reserve()
        assert reserved.args == (moment, {"a", "b"})
        await pickle_app.queue().complete(reserved, {"at": moment})
        assert await job.result(timeout=5) == {"at": moment}

    with pytest.raises(ConfigurationError):
        App(redis_url, serializer="yaml")


async def test_oversized_payload_is_refused(redis_url: str, redis: Redis) -> None:
    limit = 200
    async with open_app(redis_url, max_payload_bytes=limit) as app:

        @app.task
        async def store(blob: str) -> None:
            return None

        overhead = len(app.codec.dump_args("default", "id", "t", ("",), {}))
        fits = "x" * (limit - overhead)
        job = await store.enqueue(fits)  # exactly at the limit: accepted
        assert (await job.info()).args == (fits,)
        with pytest.raises(PayloadTooLarge, match="max_payload_bytes"):
            await store.enqueue(fits + "x")
        with pytest.raises(SerializationError):  # PayloadTooLarge is a SerializationError
            await app.queue().enqueue("store", [fits + "x"])
        with pytest.raises(PayloadTooLarge):
            await store.enqueue_many([{"blob": "small"}, {"blob": fits + "x"}])
        assert await check_invariants(redis, app.queue()._keys) == {job.id: "queued"}

    async with open_app(redis_url, max_payload_bytes=0) as unlimited:

        @unlimited.task
        async def store_any(blob: str) -> None:
            return None

        big = await store_any.enqueue("y" * 2_000_000)
        assert await big.state() is JobState.QUEUED


# ---------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    "url", ["http://localhost:6379", "localhost:6379", "mysql://db/0", "tcp://127.0.0.1:6379"]
)
def test_bad_url_is_a_configuration_error(url: str) -> None:
    with pytest.raises(ConfigurationError, match="URL"):
        App(url)


def test_bad_url_from_the_environment_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIOQUEUE_REDIS_URL", "ftp://example.com")
    with pytest.raises(ConfigurationError):
        App()
    monkeypatch.setenv("AIOQUEUE_REDIS_URL", "valkey://127.0.0.1:1/0")
    assert App().url == "redis://127.0.0.1:1/0"


@pytest.mark.parametrize("name", ["a b", "{tag}", "a}b", "x" * 201, "tab\t", "é", "a/b"])
async def test_invalid_queue_names_and_prefixes(app: App, redis_url: str, name: str) -> None:
    with pytest.raises(ConfigurationError):
        app.queue(name)
    with pytest.raises(ConfigurationError):
        App(redis_url, queue=name)
    with pytest.raises(ConfigurationError):
        App(redis_url, prefix=name)
    with pytest.raises(ConfigurationError):

        @app.task(queue=name)
        async def ping() -> None:
            return None

    @app.task
    async def routed() -> None:
        return None

    with pytest.raises(ConfigurationError):
        await routed.options(queue=name).enqueue()


async def test_closed_app_raises_closed_error(redis_url: str) -> None:
    app = App(redis_url, prefix=unique_prefix())

    @app.task
    async def ping() -> None:
        return None

    with pytest.raises(ClosedError, match="not open"):  # never opened: no I/O happened
        await ping.enqueue()
    async with app:
        job = await ping.enqueue()
        assert await job.state() is JobState.QUEUED
    calls: list[Callable[[], Awaitable[object]]] = [
        ping.enqueue,
        lambda: app.queue().enqueue("ping"),
        lambda: app.queue().reserve(),
        job.state,
        app.queue().counts,
    ]
    for call in calls:
        with pytest.raises(ClosedError, match="closed"):
            await call()
    with pytest.raises(ClosedError):
        await app.open()


async def test_unreachable_server_raises_connection_error_on_open() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    app = App(f"redis://user:s3cret@127.0.0.1:{port}/0")  # no I/O before open
    with pytest.raises(aioqueue.ServerUnavailable) as caught:
        await app.open()
    assert isinstance(caught.value, OSError)
    assert "s3cret" not in str(caught.value)
    with pytest.raises(ClosedError):
        _ = app.redis
