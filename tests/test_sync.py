"""The blocking producer, ``app.sync()``: the same scripts and records as the async producer,
on redis-py's blocking client, from code without an event loop; jobs it enqueues are run by
real workers (an in-process one, and a worker process)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from aioqueue import (
    App,
    ClosedError,
    EnqueueEvent,
    JobCancelled,
    JobFailed,
    JobNotFound,
    JobState,
    PayloadTooLarge,
    ResultTimeout,
    SerializationError,
    ServerUnavailable,
    SyncClient,
    SyncJob,
    Worker,
)
from aioqueue._store.embedded import _free_port

from .support.apps import unique_prefix
from .support.processes import WorkerProcesses, run_records
from .support.waiting import wait_until


def make_app(url: str, **options: object) -> App:
    """An App (never opened: the blocking producer needs only its settings and tasks) with a
    unique prefix and a few tasks."""
    app = App(url, prefix=unique_prefix(), **options)  # type: ignore[arg-type]

    @app.task
    async def add(a: int, b: int = 0) -> int:
        return a + b

    @app.task(max_attempts=1)
    async def broken() -> None:
        raise ValueError("always")

    @app.task(queue="mail")
    async def send(to: str) -> str:
        return f"sent to {to}"

    return app


@pytest.fixture
def app(redis_url: str) -> Iterator[App]:
    app = make_app(redis_url)
    yield app
    app.sync().close()


def test_enqueue_inspect_and_cancel_without_an_event_loop(app: App) -> None:
    add = app.tasks["add"]
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()  # a plain, blocking test: no loop anywhere
    sync = app.sync()
    assert app.sync() is sync  # one per App
    job = sync.enqueue(add, 1, b=2)
    assert isinstance(job, SyncJob)
    assert job.queue == "default"
    assert job.state() is JobState.QUEUED
    info = job.info()
    assert (info.task, info.args, info.kwargs, info.attempts) == ("add", (1,), {"b": 2}, 0)
    assert sync.counts() == {"scheduled": 0, "queued": 1, "active": 0, "failed": 0}
    assert job.cancel() is True
    assert job.state() is JobState.CANCELLED
    with pytest.raises(JobCancelled):
        job.result(timeout=5)
    assert sync.job(job.id).state() is JobState.CANCELLED  # a handle by id
    with pytest.raises(JobNotFound):
        sync.job("no-such-job").state()
    with pytest.raises(JobNotFound):
        sync.job("no-such-job").info()


def test_options_many_and_by_name(app: App) -> None:
    add, send = app.tasks["add"], app.tasks["send"]
    sync = app.sync()
    later = sync.enqueue(add.options(delay=600, priority=7), 1)
    assert later.state() is JobState.SCHEDULED
    assert later.info().priority == 7
    fixed = sync.enqueue(add.options(job_id="order-42"), 1)
    again = sync.enqueue(add.options(job_id="order-42"), 99)  # idempotent by id
    assert fixed == again
    assert again.info().args == (1,)
    jobs = sync.enqueue_many(send, [{"to": f"u{i}"} for i in range(1200)])  # 3 script calls
    assert len({j.id for j in jobs}) == 1200
    assert {j.queue for j in jobs} == {"mail"}
    assert sync.counts("mail")["queued"] == 1200
    grouped = sync.enqueue_many(send.options(group="tenant-a"), [(("x",), {})])
    assert grouped[0].state() is JobState.QUEUED
    assert sync.counts("mail")["queued"] == 1201
    assert sync.enqueue_many(send, []) == []
    by_name = sync.enqueue_by_name("remote", "remote.task", [1], {"k": 2})
    assert by_name.info().task == "remote.task"
    assert sync.counts("remote")["queued"] == 1
    assert sync.cancel_jobs([j.id for j in jobs[:10]], "mail") == 10
    assert sync.cancel_jobs([]) == 0


def test_bad_calls_fail_before_anything_is_stored(redis_url: str) -> None:
    app = make_app(redis_url, max_payload_bytes=100)
    add = app.tasks["add"]
    sync = app.sync()
    with pytest.raises(TypeError, match="unexpected keyword argument 'c'"):
        sync.enqueue(add, 1, c=3)
    with pytest.raises(SerializationError):
        sync.enqueue(add, object())
    with pytest.raises(PayloadTooLarge):
        sync.enqueue(app.tasks["send"], "x" * 200)
    with pytest.raises(TypeError):
        sync.enqueue_many(add, [{"a": 1}, {"nope": 2}])
    with pytest.raises(ValueError, match="job_id"):
        sync.enqueue_many(add.options(job_id="x"), [{"a": 1}])
    assert sync.counts() == {"scheduled": 0, "queued": 0, "active": 0, "failed": 0}
    sync.close()
    with pytest.raises(ClosedError):
        sync.enqueue(add, 1)
    assert app.sync() is not sync  # a closed client is replaced


def test_enqueue_hooks_run_in_the_blocking_producer(app: App) -> None:
    seen: list[tuple[str, EnqueueEvent]] = []
    app.before_enqueue(lambda e: seen.append(("before", e)))
    app.after_enqueue(lambda e: seen.append(("after", e)))
    job = app.sync().enqueue(app.tasks["send"], "ann")
    many = app.sync().enqueue_many(app.tasks["add"], [{"a": 1}, {"a": 2}])
    assert seen == [
        ("before", EnqueueEvent("mail", "send", (job.id,))),
        ("after", EnqueueEvent("mail", "send", (job.id,))),
        ("before", EnqueueEvent("default", "add", (many[0].id, many[1].id))),
        ("after", EnqueueEvent("default", "add", (many[0].id, many[1].id))),
    ]


async def test_results_wait_on_pub_sub_for_a_worker(app: App, redis: Redis) -> None:
    add, broken = app.tasks["add"], app.tasks["broken"]
    sync = app.sync()
    job = sync.enqueue(add, 2, b=3)
    failing = sync.enqueue(broken)
    waiter = asyncio.create_task(asyncio.to_thread(job.result, 60))
    channel = f"{app.prefix}:{{default}}:done"
    # the waiter blocks on the queue's done channel (it does not poll)
    await wait_until(lambda: _subscribers(redis, channel), timeout=30, what="a subscriber to done")
    async with app, Worker(app):
        assert await waiter == 5
        with pytest.raises(JobFailed) as info:
            await asyncio.to_thread(failing.result, 60)
    assert info.value.error_type == "ValueError"
    assert await _subscribers(redis, channel) is False  # the waiter's connection is released


async def _subscribers(redis: Redis, channel: str) -> bool:
    counts = await redis.pubsub_numsub(channel)
    return bool(counts and counts[0][1])


def test_a_result_wait_is_bounded_by_its_timeout(app: App) -> None:
    job = app.sync().enqueue(app.tasks["add"], 1)
    t0 = time.monotonic()
    with pytest.raises(ResultTimeout, match=r"did not finish within 0\.3 s"):
        job.result(timeout=0.3)
    assert time.monotonic() - t0 >= 0.3
    with pytest.raises(ResultTimeout):
        job.result(timeout=0)
    with pytest.raises(JobNotFound):  # a timeout of 0 still reads the record once
        app.sync().job("no-such-job").result(timeout=0)
    assert job.cancel()
    with pytest.raises(JobCancelled):
        job.result(timeout=0)


async def test_a_timeout_of_zero_reads_the_record_once_async_and_blocking(app: App) -> None:
    sync = app.sync()
    done = sync.enqueue(app.tasks["add"], 1, b=1)
    async with app:
        await Worker(app, burst=True).run()
        queued = sync.enqueue(app.tasks["add"], 5)  # after the worker: still queued
        for job in (done, queued):
            async_job = app.queue(job.queue).job(job.id)
            if job is done:
                assert job.result(timeout=0) == 2
                assert await async_job.result(timeout=0) == 2
            else:
                with pytest.raises(ResultTimeout):
                    job.result(timeout=0)
                with pytest.raises(ResultTimeout):
                    await async_job.result(timeout=0)
        with pytest.raises(JobNotFound):
            await app.queue("default").job("no-such-job").result(timeout=0)


def test_threads_share_one_client(app: App) -> None:
    sync = app.sync()
    ids: list[str] = []
    lock = threading.Lock()

    def produce() -> None:
        for i in range(50):
            job = sync.enqueue(app.tasks["add"], i)
            with lock:
                ids.append(job.id)

    threads = [threading.Thread(target=produce) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(set(ids)) == 400
    assert sync.counts()["queued"] == 400


def test_scripts_are_loaded_again_after_a_flush(app: App) -> None:
    sync = app.sync()
    sync.redis.script_flush()
    job = sync.enqueue(app.tasks["add"], 1)
    assert job.state() is JobState.QUEUED
    sync.redis.script_flush()
    assert len(sync.enqueue_many(app.tasks["add"], [{"a": i} for i in range(1100)])) == 1100
    sync.redis.script_flush()
    assert job.cancel() is True


def test_an_unreachable_server_is_server_unavailable() -> None:
    app = make_app(f"redis://127.0.0.1:{_free_port()}/0")
    with pytest.raises(ServerUnavailable), app.sync() as sync:
        sync.enqueue(app.tasks["add"], 1)
    assert isinstance(sync, SyncClient)
    assert sync.closed


@pytest.mark.slow
async def test_a_worker_process_runs_what_a_blocking_producer_enqueued(
    tmp_path: Path, redis_url: str, redis: Redis
) -> None:
    prefix = unique_prefix()
    workers = WorkerProcesses(tmp_path, redis_url, prefix)
    try:
        proc = workers.start()
        # the producer's own App: the same prefix, a stub of the worker's task
        app = App(redis_url, prefix=prefix)

        @app.task
        async def record(tag: str = "", duration: float = 0.0) -> int:
            raise AssertionError("runs in the worker process, not here")

        def produce() -> list[int]:
            with app.sync() as sync:
                one = sync.enqueue(record, tag="one")
                many = sync.enqueue_many(record, [{"tag": f"m{i}"} for i in range(20)])
                return [j.result(timeout=60) for j in (one, *many)]

        pids = await asyncio.to_thread(produce)
        assert set(pids) == {proc.pid}
        tags = sorted(r.tag for r in await run_records(redis, prefix))
        assert tags == sorted(["one", *(f"m{i}" for i in range(20))])
        assert os.getpid() != proc.pid
    finally:
        workers.close()
        print(workers.logs())


async def test_a_signing_apps_blocking_producer_signs_what_workers_verify(redis_url: str) -> None:
    # jobs stored by the blocking producer are signed for their queue like the async
    # producer's (one by one, many, by name, on another queue), and their results verify
    app = make_app(redis_url, signing_key=b"s" * 32)
    add, send = app.tasks["add"], app.tasks["send"]
    sync = app.sync()
    try:
        jobs = [
            sync.enqueue(add, 1, b=2),
            *sync.enqueue_many(add, [((3,), {}), ((4,), {"b": 1})]),
            sync.enqueue_by_name("default", "add", [5]),
        ]
        mail = sync.enqueue(send, "ann")
        async with app, Worker(app, queues=["default", "mail"]):
            results = [await asyncio.to_thread(j.result, 60) for j in jobs]
            assert await asyncio.to_thread(mail.result, 60) == "sent to ann"
        assert results == [3, 3, 5, 5]
    finally:
        sync.close()
