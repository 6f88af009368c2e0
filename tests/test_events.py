"""Job events (issue 14, point 1): the per-queue event stream written by the transition
scripts, switched by ``queue.set_events``, read by ``app.events()`` and ``queue.events_page()``.

Real server, real workers (in-process, and a process that is killed and buried)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from aioqueue import (
    App,
    ConfigurationError,
    JobEvent,
    JobEventKind,
    JobState,
    Retry,
    Worker,
    current_job,
)

from .support.apps import open_app, unique_prefix
from .support.clirun import aioqueue_cli
from .support.processes import WorkerProcesses
from .support.server import blocked_in, clients_named
from .support.waiting import wait_until

K = JobEventKind


async def history(app: App, queue: str | None = None) -> list[JobEvent]:
    """Every event kept, oldest first."""
    return list(reversed(await app.queue(queue).events_page(count=1000)))


def of_job(events: list[JobEvent], job_id: str) -> list[JobEvent]:
    return [e for e in events if e.job_id == job_id]


def order(position: str) -> tuple[int, ...]:
    """A position's place in the stream: (ms, seq, number in its entry)."""
    entry, _, i = position.partition(":")
    ms, seq = entry.split("-")
    return int(ms), int(seq), int(i or 0)


def kinds(events: list[JobEvent]) -> list[JobEventKind]:
    return [e.kind for e in events]


@contextlib.asynccontextmanager
async def events_app(redis_url: str, **options: Any) -> AsyncIterator[App]:
    async with open_app(redis_url, **options) as app:
        await app.queue().set_events(1000)
        yield app


def register_tasks(app: App) -> None:
    @app.task(name="ok")
    async def ok(x: int) -> int:
        await current_job().progress({"done": x})
        return x

    @app.task(name="flaky", max_attempts=3)
    async def flaky() -> str:
        if current_job().attempt == 1:
            raise Retry(delay=0.05)
        return "second time"

    @app.task(name="bad", max_attempts=1)
    async def bad() -> None:
        raise ValueError("no good")


async def test_off_by_default_the_stream_never_exists(app: App, redis: Redis) -> None:
    register_tasks(app)
    q = app.queue()
    assert await q.events_maxlen() is None
    jobs = [
        await q.enqueue("ok", kwargs={"x": 1}),
        await q.enqueue("flaky"),
        await q.enqueue("bad"),
        await q.enqueue("ok", kwargs={"x": 2}, delay=3600),
    ]
    await q.cancel_jobs([jobs[3].id])
    async with Worker(app, concurrency=4, grace=2):
        assert await jobs[0].result(timeout=20) == 1
        assert await jobs[1].result(timeout=20) == "second time"

        async def failed() -> bool:
            return await jobs[2].state() is JobState.FAILED

        await wait_until(failed, timeout=20, what="the bad job to fail")
    assert await redis.exists(q._keys.events) == 0
    assert await q.events_page() == []


async def test_every_kind_of_a_worker_run_with_its_fields(redis_url: str, redis: Redis) -> None:
    async with events_app(redis_url) as app:
        register_tasks(app)
        q = app.queue()
        assert await q.events_maxlen() == 1000
        before = datetime.now(UTC) - timedelta(seconds=5)
        ok = await q.enqueue("ok", kwargs={"x": 7})
        flaky = await q.enqueue("flaky")
        bad = await q.enqueue("bad", max_attempts=1)
        later = await q.enqueue("ok", kwargs={"x": 1}, delay=3600)
        promoted = await q.enqueue("ok", kwargs={"x": 2}, delay=3600)
        expired = await q.enqueue("ok", kwargs={"x": 3}, expires=timedelta(milliseconds=1))
        await q.cancel_jobs([later.id])
        assert await q.promote([promoted.id]) == 1
        async with Worker(app, concurrency=4, grace=2) as worker:
            assert await ok.result(timeout=20) == 7
            assert await flaky.result(timeout=20) == "second time"
            assert await promoted.result(timeout=20) == 2

            async def bad_failed() -> bool:
                return K.FAILED in kinds(of_job(await history(app), bad.id))

            await wait_until(bad_failed, timeout=20, what="the bad job's failed event")

            async def expired_cancelled() -> bool:
                return await expired.state() is JobState.CANCELLED

            await wait_until(expired_cancelled, timeout=20, what="the expired job's end")
            # the operator's retry of the dead letter
            assert await q.requeue([bad.id]) == 1

            async def failed_twice() -> bool:
                return kinds(of_job(await history(app), bad.id)).count(K.FAILED) == 2

            await wait_until(failed_twice, timeout=20, what="the requeued job's failure")
            wid = worker.id
        events = await history(app)

    assert all(e.queue == app.default_queue and e.at >= before for e in events)
    positions = [e.position for e in events]
    assert positions == sorted(positions, key=order)

    ok_events = of_job(events, ok.id)
    assert kinds(ok_events) == [K.ENQUEUED, K.STARTED, K.PROGRESS, K.COMPLETED]
    assert all(e.task == "ok" for e in ok_events)
    assert [e.attempt for e in ok_events] == [0, 1, 1, 1]
    assert [e.worker for e in ok_events] == [None, wid, wid, wid]
    assert ok_events[0].due is None

    fl = of_job(events, flaky.id)
    assert kinds(fl) == [K.ENQUEUED, K.STARTED, K.RETRIED, K.STARTED, K.COMPLETED]
    retried = fl[2]
    assert retried.attempt == 1
    assert retried.reason is not None
    assert retried.reason.startswith("Retry")
    assert retried.due is not None
    assert retried.due > retried.at
    assert fl[3].attempt == 2

    b = of_job(events, bad.id)
    assert kinds(b) == [
        K.ENQUEUED, K.STARTED, K.FAILED, K.REQUEUED, K.STARTED, K.FAILED,
    ]  # fmt: skip
    assert b[2].reason == "ValueError: no good"
    assert b[2].worker == wid

    lt = of_job(events, later.id)
    assert kinds(lt) == [K.ENQUEUED, K.CANCELLED]
    assert lt[0].due is not None
    assert lt[0].due > datetime.now(UTC) + timedelta(minutes=30)

    assert kinds(of_job(events, promoted.id)) == [
        K.ENQUEUED, K.PROMOTED, K.STARTED, K.PROGRESS, K.COMPLETED,
    ]  # fmt: skip
    ex = of_job(events, expired.id)
    assert kinds(ex) == [K.ENQUEUED, K.CANCELLED]
    assert ex[1].reason is not None
    assert ex[1].reason.startswith("Expired")

    up = [e for e in events if e.kind is K.WORKER_UP]
    down = [e for e in events if e.kind is K.WORKER_DOWN]
    assert [(e.worker, e.job_id) for e in up] == [(wid, "")]
    assert [(e.worker, e.reason) for e in down] == [(wid, "stopped")]
    assert events.index(up[0]) < events.index(ok_events[1])
    assert events[-1] == down[0]
    # no payloads: nothing of the arguments or results is in the stream
    assert not any(e.reason == "7" for e in events)


async def test_reserve_and_release_through_the_pull_api(redis_url: str) -> None:
    async with events_app(redis_url) as app:
        q = app.queue()
        job = await q.enqueue("pulled")
        [r] = await q.reserve(1)
        await q.release(r, delay=60)
        events = of_job(await history(app), job.id)
    assert kinds(events) == [K.ENQUEUED, K.STARTED, K.RELEASED]
    assert events[1].worker is None
    assert events[1].attempt == 1
    assert events[2].attempt == 0  # the refunded attempt
    assert events[2].due is not None


async def test_switching_off_stops_the_events_and_keeps_those_written(
    redis_url: str, redis: Redis
) -> None:
    async with events_app(redis_url) as app:
        q = app.queue()
        first = await q.enqueue("t")
        await q.set_events(None)
        assert await q.events_maxlen() is None
        await q.enqueue("t")
        assert [e.job_id for e in await history(app)] == [first.id]


async def test_the_cap_holds(redis_url: str, redis: Redis) -> None:
    async with open_app(redis_url) as app:
        q = app.queue()
        await q.set_events(50)
        for i in range(1500):
            await q.enqueue("t", job_id=f"j{i}")
        # MAXLEN ~ trims whole nodes of the stream (100 entries each by default)
        length = await redis.xlen(q._keys.events)
        assert 50 <= length <= 250, length
        page = await q.events_page(count=10)
        assert [e.job_id for e in page] == [f"j{i}" for i in range(1499, 1489, -1)]


async def test_a_bad_setting_or_argument_is_a_typed_error(app: App) -> None:
    q = app.queue()
    for bad in (0, -1, 10_000_001, True, 1.5):
        with pytest.raises(ConfigurationError):
            await q.set_events(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        await q.events_page(count=0)
    with pytest.raises(ConfigurationError):
        await q.events_page(before="yesterday")
    with pytest.raises(ConfigurationError):
        app.events(block=0)
    for since in ("", "now", "1-2-3", datetime(2020, 1, 1)):
        with pytest.raises(ConfigurationError):
            await anext(app.events(since=since))
    with pytest.raises(ConfigurationError):
        await anext(app.events(kinds=["exploded"]))


async def test_events_page_pages_back_through_the_history(redis_url: str) -> None:
    async with events_app(redis_url) as app:
        q = app.queue()
        ids = [(await q.enqueue("t")).id for _ in range(25)]
        seen: list[str] = []
        before = None
        while page := await q.events_page(before=before, count=10):
            seen += [e.job_id for e in page]
            before = page[-1].position
        assert seen == ids[::-1]
        only = await q.events_page(kinds=["started"])
        assert only == []


# ---------------------------------------------------------------------- following the stream
async def take(it: AsyncIterator[JobEvent], n: int, timeout: float = 20.0) -> list[JobEvent]:
    out: list[JobEvent] = []
    async with asyncio.timeout(timeout):
        while len(out) < n:
            out.append(await anext(it))
    return out


async def test_following_new_events_and_resuming_from_a_saved_position(
    redis_url: str, redis: Redis
) -> None:
    name = f"ev{id(redis)}f"
    async with events_app(redis_url, redis_options={"client_name": name}) as app:
        q = app.queue()
        old = await q.enqueue("t")
        it = app.events(kinds=[K.ENQUEUED], block=0.5)
        first_read = asyncio.ensure_future(take(it, 3))
        # the iterator pins "$" at its first read, on its own connection
        await wait_until(lambda: blocked_in(redis, f"{name}:events", "xread"), timeout=10)
        ids = [(await q.enqueue("t")).id for _ in range(6)]
        got = await first_read
        # "$": nothing from before the iterator started
        assert [e.job_id for e in got] == ids[:3]
        await it.aclose()  # type: ignore[attr-defined]
        # a consumer restarted with its saved position gets exactly the rest
        again = app.events(since=got[-1].position, block=0.5)
        assert [e.job_id for e in await take(again, 3)] == ids[3:]
        await again.aclose()  # type: ignore[attr-defined]
        # "0": everything kept; a datetime: from then on
        everything = app.events(since="0", block=0.5)
        assert [e.job_id for e in await take(everything, 7)] == [old.id, *ids]
        await everything.aclose()  # type: ignore[attr-defined]


async def test_a_killed_connection_neither_loses_nor_repeats_an_event(
    redis_url: str, redis: Redis
) -> None:
    name = f"ev{id(redis)}"
    async with events_app(redis_url, redis_options={"client_name": name}) as app:
        q = app.queue()
        it = app.events(since="0", block=0.5)
        total = 60
        got: list[JobEvent] = []
        killed = 0

        async def produce() -> list[str]:
            nonlocal killed
            ids = []
            for i in range(total):
                ids.append((await q.enqueue("t")).id)
                if i % 15 == 7:
                    # kill the iterator's own connection (and only it) mid-stream
                    for c in await clients_named(redis, f"{name}:events"):
                        await redis.client_kill_filter(_id=c["id"])
                        killed += 1
                    await asyncio.sleep(0.05)
            return ids

        producer = asyncio.create_task(produce())
        got = await take(it, total, timeout=60)
        ids = await producer
        await it.aclose()  # type: ignore[attr-defined]
        assert [e.job_id for e in got] == ids
        assert killed >= 3
        # the App's pool never lent the iterator a connection: it has one of its own
        assert len(await clients_named(redis, f"{name}:events")) == 0


async def test_a_worker_killed_and_buried_shows_as_down(
    workers: WorkerProcesses, producer: App, redis: Redis
) -> None:
    q = producer.queue()
    await q.set_events(1000)
    proc = workers.start(lease=3.0, concurrency=2)
    await workers.wait_idle(redis, proc)
    job = await q.enqueue("slow", kwargs={"seconds": 60}, max_attempts=3)

    async def started() -> bool:
        return K.STARTED in kinds(of_job(await history(producer), job.id))

    await wait_until(started, timeout=20, what="the slow job to start")
    proc.signal(signal.SIGKILL)
    assert await proc.wait_exit(10) == -signal.SIGKILL

    async def buried() -> bool:
        await q.reap()
        return any(e.kind is K.WORKER_DOWN for e in await history(producer))

    await wait_until(buried, timeout=30, what="the killed worker to be buried")
    events = await history(producer)
    [up] = [e for e in events if e.kind is K.WORKER_UP]
    [down] = [e for e in events if e.kind is K.WORKER_DOWN]
    assert down.worker == up.worker
    assert down.reason == "dead"
    recovered = [e for e in of_job(events, job.id) if e.kind is K.RECOVERED]
    assert [(e.reason, e.worker) for e in recovered] == [("buried", up.worker)]


# ---------------------------------------------------------------------- the command line
def cli(url: str, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    return aioqueue_cli(url, prefix, "events", *args)


async def test_the_events_command_switches_and_tails(redis_url: str) -> None:
    prefix = unique_prefix()
    async with open_app(redis_url, prefix=prefix) as app:
        q = app.queue("jobs")
        res = await asyncio.to_thread(cli, redis_url, prefix, "status", "jobs")
        assert (res.returncode, res.stdout) == (0, "events of jobs: off\n"), res.stderr
        res = await asyncio.to_thread(cli, redis_url, prefix, "on", "jobs", "--maxlen", "500")
        assert (res.returncode, res.stdout) == (0, "events of jobs: on, about 500 kept\n")
        assert await q.events_maxlen() == 500
        job = await q.enqueue("t", delay=60)
        await q.cancel_jobs([job.id])
        args = ("tail", "jobs", "--since", "0", "--count", "2", "--json")
        res = await asyncio.to_thread(cli, redis_url, prefix, *args)
        assert res.returncode == 0, res.stderr
        lines = [json.loads(line) for line in res.stdout.splitlines()]
        assert [(d["kind"], d["job_id"]) for d in lines] == [
            ("enqueued", job.id),
            ("cancelled", job.id),
        ]
        assert lines[0]["due"] is not None
        res = await asyncio.to_thread(cli, redis_url, prefix, "tail", "jobs", "--since", "0",
                                      "--count", "1", "--kind", "cancelled")  # fmt: skip
        assert res.returncode == 0, res.stderr
        assert f"  cancelled  {job.id}  t  0  -  Cancelled" in res.stdout
        res = await asyncio.to_thread(cli, redis_url, prefix, "off", "jobs")
        assert (res.returncode, res.stdout) == (0, "events of jobs: off\n")
        res = await asyncio.to_thread(cli, redis_url, prefix, "on", "jobs", "--maxlen", "0")
        assert res.returncode == 2


async def test_the_events_of_one_loop_share_an_entry_and_positions_inside_it_resume(
    redis_url: str, redis: Redis
) -> None:
    """enqueue_many, a claim and a batch of completions write one entry per call and kind (at
    most 100 events); a position inside such an entry resumes right after that event."""
    async with events_app(redis_url) as app:

        @app.task
        async def noop(i: int) -> int:
            return i

        q = app.queue()
        jobs = await noop.enqueue_many([{"i": i} for i in range(150)])
        ids = [j.id for j in jobs]
        assert await redis.xlen(q._keys.events) == 2  # 100 + 50
        page = list(reversed(await q.events_page(count=1000)))
        assert [e.job_id for e in page] == ids
        assert all(e.kind is K.ENQUEUED and e.task == "noop" for e in page)
        entry = page[0].position.partition(":")[0]
        assert [e.position for e in page[:3]] == [f"{entry}:1", f"{entry}:2", f"{entry}:3"]
        # resume after the 10th event, inside the first entry
        it = app.events(since=page[9].position, block=0.5)
        assert [e.job_id for e in await take(it, 140)] == ids[10:]
        await it.aclose()  # type: ignore[attr-defined]
        # a page just before it: the 9th back to the 5th
        back = await q.events_page(before=page[9].position, count=5)
        assert [e.job_id for e in back] == ids[8:3:-1]
        # a claim of 150 leases: one entry per 100 events too
        reserved = await q.reserve(150)
        started = [e for e in await history(app) if e.kind is K.STARTED]
        assert sorted(e.job_id for e in started) == sorted(r.id for r in reserved)
        assert len({e.position.partition(":")[0] for e in started}) <= 3
        for r in reserved:
            await q.complete(r, r.kwargs["i"])
        done = [e for e in await history(app) if e.kind is K.COMPLETED]
        assert [e.attempt for e in done] == [1] * 150
        assert {e.task for e in done} == {"noop"}
