"""Unique jobs (``.options(unique=True)`` / ``unique_key=``): one lock per key, taken in
enqueue.lua; each scope (queued, running, ttl) and each conflict mode (existing, replace,
debounce), also under enqueues racing from two threads with their own Apps; the lock freed on
completion, cancellation and dead-letter, kept across a killed worker's lease expiry, bounded
by its TTL; enqueue_many; signing with replace."""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
from typing import Any
from uuid import uuid4

import pytest
from redis.asyncio import Redis

from aioqueue import App, ConfigurationError, JobState, Worker
from aioqueue._queue.unique import derived_key

from .support.processes import WorkerProcesses, run_records
from .support.server import text
from .support.waiting import wait_until


async def holder(redis: Redis, app: App, key: str, queue: str = "default") -> str | None:
    """The job id the lock of ``key`` names, or None when it is free."""
    value = await redis.get(app.queue(queue)._keys.unique(key))
    return None if value is None else text(value)


async def job_count(app: App, queue: str = "default") -> int:
    """How many jobs were stored."""
    return (await app.queue(queue).stats()).get("enqueued", 0)


# ---------------------------------------------------------------------- keys and options
def test_the_derived_key_is_the_task_and_the_canonical_arguments() -> None:
    assert derived_key("t", (1,), {"a": 1, "b": 2}) == derived_key("t", [1], {"b": 2, "a": 1})
    assert derived_key("t", (1,), {}) != derived_key("t", (2,), {})
    assert derived_key("t", (1,), {}) != derived_key("u", (1,), {})
    assert derived_key("t", (1,), {}).startswith("t:")


def test_bad_unique_options_are_refused(app: App) -> None:
    @app.task
    async def work(x: int) -> None:
        pass

    with pytest.raises(ConfigurationError, match="need unique=True"):
        work.options(unique_for=5)
    with pytest.raises(ConfigurationError, match="unique_scope"):
        work.options(unique=True, unique_scope="forever")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="on_conflict"):
        work.options(unique=True, on_conflict="merge")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="needs delay="):
        work.options(unique=True, on_conflict="debounce")
    with pytest.raises(ConfigurationError, match="more than 0"):
        work.options(unique=True, unique_for=0)
    with pytest.raises(ConfigurationError, match="unique_key"):
        work.options(unique_key="")
    with pytest.raises(ConfigurationError, match="batch members"):
        work.options(unique=True).call(1)


async def test_arguments_that_are_not_json_need_a_unique_key(app: App) -> None:
    @app.task
    async def work(x: Any) -> None:
        pass

    with pytest.raises(ConfigurationError, match="unique_key="):
        await work.options(unique=True).enqueue({1, 2})
    assert await job_count(app) == 0


# ---------------------------------------------------------------------- existing (default)
async def test_a_duplicate_returns_the_job_that_holds_the_key(app: App, redis: Redis) -> None:
    @app.task
    async def work(x: int) -> int:
        return x

    first = await work.options(unique=True).enqueue(1)
    again = await work.options(unique=True).enqueue(1)
    other = await work.options(unique=True).enqueue(2)
    plain = await work.enqueue(1)  # not unique: never checked
    assert again.id == first.id
    assert len({first.id, other.id, plain.id}) == 3
    assert await job_count(app) == 3
    key = derived_key(work.name, (1,), {})
    assert await holder(redis, app, key) == first.id
    assert (await app.queue().job_info(first.id)).args == (1,)


# ---------------------------------------------------------------------- scopes
async def test_scope_running_holds_while_queued_and_running(app: App, redis: Redis) -> None:
    @app.task
    async def work() -> None:
        pass

    opts = work.options(unique_key="k")  # scope "running" is the default
    job = await opts.enqueue()
    [r] = await app.queue().reserve(1, lease=30)
    assert (await opts.enqueue()).id == job.id  # running: still held
    await app.queue().complete(r)
    assert await holder(redis, app, "k") is None
    again = await opts.enqueue()
    assert again.id != job.id
    assert await holder(redis, app, "k") == again.id


async def test_scope_queued_frees_the_key_when_the_job_starts(app: App, redis: Redis) -> None:
    @app.task
    async def work() -> None:
        pass

    opts = work.options(unique_key="k", unique_scope="queued")
    job = await opts.enqueue()
    assert (await opts.enqueue()).id == job.id  # queued: held
    [r] = await app.queue().reserve(1, lease=30)
    assert r.id == job.id
    assert await holder(redis, app, "k") is None
    second = await opts.enqueue()  # the first runs; a second may wait
    assert second.id != job.id
    await app.queue().complete(r)  # the first's end does not free the second's lock
    assert await holder(redis, app, "k") == second.id
    assert (await opts.enqueue()).id == second.id


async def test_scope_ttl_holds_after_the_job_finished_until_the_ttl(app: App, redis: Redis) -> None:
    @app.task
    async def work() -> None:
        pass

    opts = work.options(unique_key="k", unique_scope="ttl", unique_for=600)
    job = await opts.enqueue()
    assert (await app.queue().job_info(job.id)).state is JobState.QUEUED
    await Worker(app, burst=True).run()
    assert (await job.info()).state is JobState.COMPLETED
    assert (await opts.enqueue()).id == job.id  # finished, but the TTL still runs
    assert await job_count(app) == 1
    lock = app.queue()._keys.unique("k")
    assert 0 < await redis.pttl(lock) <= 600_000
    await redis.pexpire(lock, 1)  # the TTL's end, without waiting 10 minutes
    await wait_until(lambda: _free(redis, app, "k"), timeout=30, what="the lock's TTL to end")
    assert (await opts.enqueue()).id != job.id


async def _free(redis: Redis, app: App, key: str) -> bool:
    return await holder(redis, app, key) is None


async def test_the_ttl_bounds_a_lock_whose_job_never_runs(app: App, redis: Redis) -> None:
    @app.task
    async def work() -> None:
        pass

    opts = work.options(unique_key="k", unique_for=0.5)
    job = await opts.enqueue()
    pttl = await redis.pttl(app.queue()._keys.unique("k"))
    assert pttl == -2 or 0 < pttl <= 500  # -2: already gone on a slow machine
    await wait_until(lambda: _free(redis, app, "k"), timeout=30, what="the lock's TTL to end")
    assert (await opts.enqueue()).id != job.id
    assert await job_count(app) == 2


# ---------------------------------------------------------------------- releases
async def test_the_key_is_freed_when_a_waiting_job_is_cancelled(app: App, redis: Redis) -> None:
    @app.task
    async def work() -> None:
        pass

    job = await work.options(unique_key="k", delay=60).enqueue()
    assert await holder(redis, app, "k") == job.id
    await job.cancel()
    assert await holder(redis, app, "k") is None
    assert (await work.options(unique_key="k").enqueue()).id != job.id


async def test_the_key_is_freed_when_a_running_job_is_cancelled(app: App, redis: Redis) -> None:
    started = asyncio.Event()

    @app.task
    async def work() -> None:
        started.set()
        await asyncio.sleep(60)

    job = await work.options(unique_key="k").enqueue()
    async with Worker(app):
        await asyncio.wait_for(started.wait(), 30)
        assert await holder(redis, app, "k") == job.id
        await job.cancel()
        await wait_until(
            lambda: _state_is(app, job.id, JobState.CANCELLED), timeout=30, what="the cancel"
        )
    assert await holder(redis, app, "k") is None


async def _state_is(app: App, job_id: str, state: JobState) -> bool:
    return (await app.queue().job_info(job_id)).state is state


async def test_the_key_is_freed_when_the_job_is_dead_lettered(app: App, redis: Redis) -> None:
    @app.task(max_attempts=1)
    async def work() -> None:
        raise RuntimeError("boom")

    job = await work.options(unique_key="k").enqueue()
    await Worker(app, burst=True).run()
    assert (await job.info()).state is JobState.FAILED
    assert await holder(redis, app, "k") is None


async def test_the_key_is_freed_when_the_job_completes_and_its_record_is_dropped(
    app: App, redis: Redis
) -> None:
    @app.task(keep_result=False)
    async def work() -> None:
        pass

    job = await work.options(unique_key="k").enqueue()
    await Worker(app, burst=True).run()
    assert await holder(redis, app, "k") is None
    assert (await work.options(unique_key="k").enqueue()).id != job.id


# ---------------------------------------------------------------------- replace
async def test_replace_changes_the_arguments_of_a_waiting_job(app: App) -> None:
    @app.task
    async def work(x: int) -> int:
        return x

    first = await work.options(unique_key="k", on_conflict="replace").enqueue(1)
    second = await work.options(unique_key="k", on_conflict="replace").enqueue(2)
    assert second.id == first.id
    assert await job_count(app) == 1
    await Worker(app, burst=True).run()
    assert await first.result(timeout=10) == 2


async def test_replace_leaves_a_running_job_alone(app: App) -> None:
    @app.task
    async def work(x: int) -> int:
        return x

    first = await work.options(unique_key="k", on_conflict="replace").enqueue(1)
    [r] = await app.queue().reserve(1, lease=30)
    second = await work.options(unique_key="k", on_conflict="replace").enqueue(2)
    assert second.id == first.id
    assert (await first.info()).args == (1,)
    await app.queue().complete(r, r.args[0])
    assert await first.result(timeout=10) == 1


async def test_replace_with_signing_re_signs_for_the_holder(redis_url: str) -> None:
    async with App(redis_url, prefix=f"t{uuid4().hex[:12]}", signing_key=b"k" * 32) as app:

        @app.task
        async def work(x: int) -> int:
            return x

        first = await work.options(unique_key="k", on_conflict="replace").enqueue(1)
        again = await work.options(unique_key="k", on_conflict="replace").enqueue(2)
        assert again.id == first.id
        await Worker(app, burst=True).run()
        assert await first.result(timeout=10) == 2  # the replaced payload verified


# ---------------------------------------------------------------------- debounce
async def test_debounce_pushes_the_due_time_back_and_replaces_the_arguments(app: App) -> None:
    @app.task
    async def work(x: int) -> int:
        return x

    first = await work.options(unique_key="k", on_conflict="debounce", delay=1).enqueue(1)
    due = (await first.info()).due_ms
    assert due is not None
    second = await work.options(unique_key="k", on_conflict="debounce", delay=60).enqueue(2)
    assert second.id == first.id
    info = await first.info()
    assert info.state is JobState.SCHEDULED
    assert info.args == (2,)
    assert info.due_ms is not None
    assert info.due_ms >= due + 50_000
    assert await app.queue().reserve(1, lease=30) == []


async def test_debounce_moves_a_queued_job_out_of_its_lane(app: App, redis: Redis) -> None:
    @app.task
    async def work(x: int) -> int:
        return x

    first = await work.options(unique_key="k").enqueue(1)  # queued now
    again = await work.options(unique_key="k", on_conflict="debounce", delay=60).enqueue(2)
    assert again.id == first.id
    assert (await first.info()).state is JobState.SCHEDULED
    assert await redis.llen(app.queue()._keys.ready) == 0
    assert await app.queue().reserve(1, lease=30) == []
    assert 50_000 < await redis.pttl(app.queue()._keys.unique("k")) <= 3_600_000


async def test_debounce_to_a_short_delay_brings_a_job_forward(app: App) -> None:
    @app.task
    async def work(x: int) -> int:
        return x

    first = await work.options(unique_key="k", on_conflict="debounce", delay=600).enqueue(1)
    await work.options(unique_key="k", on_conflict="debounce", delay=0.05).enqueue(2)
    async with Worker(app):
        assert await first.result(timeout=30) == 2


# ---------------------------------------------------------------------- enqueue_many
async def test_enqueue_many_resolves_conflicts_in_order(app: App, redis: Redis) -> None:
    @app.task
    async def work(x: int, tag: str = "") -> str:
        return f"{x}{tag}"

    jobs = await work.options(unique=True).enqueue_many([((1,), {}), ((2,), {}), ((1,), {})])
    assert jobs[0].id == jobs[2].id != jobs[1].id
    assert await job_count(app) == 2
    replaced = await work.options(unique_key="k", on_conflict="replace").enqueue_many(
        [{"x": 1, "tag": "a"}, {"x": 1, "tag": "b"}, {"x": 1, "tag": "c"}]
    )
    assert len({j.id for j in replaced}) == 1
    assert (await replaced[0].info()).kwargs == {"x": 1, "tag": "c"}
    assert await holder(redis, app, "k") == replaced[0].id


# ---------------------------------------------------------------------- two processes racing
def _race(url: str, prefix: str, mode: str, scope: str, tag: str, ready: Any) -> list[str]:
    """200 enqueues of one key from a process with its own event loop and App."""

    async def main() -> list[str]:
        async with App(url, prefix=prefix) as app:

            @app.task(name="work")
            async def work(x: str) -> str:
                return x

            delay = 30 if mode == "debounce" else None
            opts = work.options(
                unique_key="race",
                unique_scope=scope,  # type: ignore[arg-type]
                on_conflict=mode,  # type: ignore[arg-type]
                delay=delay,
            )
            await app.queue().counts()  # connected before the race starts
            ready.wait(30)
            return [(await opts.enqueue(f"{tag}{i}")).id for i in range(200)]

    return asyncio.run(main())


def _race_process(
    url: str, prefix: str, mode: str, scope: str, tag: str, ready: Any, out: Any
) -> None:
    out.put((tag, _race(url, prefix, mode, scope, tag, ready)))


@pytest.mark.parametrize("scope", ["queued", "running", "ttl"])
@pytest.mark.parametrize("mode", ["existing", "replace", "debounce"])
async def test_racing_enqueues_from_two_processes_store_one_job(
    redis_url: str, redis: Redis, mode: str, scope: str
) -> None:
    prefix = f"t{uuid4().hex[:12]}"
    # two processes (spawned: nothing shared but the server), released together
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Barrier(2)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_race_process, args=(redis_url, prefix, mode, scope, tag, ready, out))
        for tag in ("a", "b")
    ]
    for p in procs:
        p.start()
    try:
        results = dict([await asyncio.to_thread(out.get, True, 120) for _ in procs])
    finally:
        for p in procs:
            await asyncio.to_thread(p.join, 30)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    assert set(results) == {"a", "b"}
    ids = {i for r in results.values() for i in r}
    assert len(ids) == 1, ids
    async with App(redis_url, prefix=prefix) as app:

        @app.task(name="work")
        async def work(x: str) -> str:
            return x

        assert await job_count(app) == 1
        [job_id] = ids
        info = await app.queue().job_info(job_id)
        if mode == "existing":
            assert info.args in (("a0",), ("b0",))
        else:  # replaced 399 times: the arguments of one of the last calls
            assert info.args in (("a199",), ("b199",))
        if mode == "debounce":
            assert info.state is JobState.SCHEDULED
            await app.queue().promote([job_id])
        await Worker(app, burst=True).run()
        stats = await app.queue().stats()
        assert (stats["enqueued"], stats["completed"]) == (1, 1)


# ---------------------------------------------------------------------- a killed worker
async def test_a_killed_worker_never_leaks_the_lock(
    workers: WorkerProcesses, producer: App, redis: Redis, prefix: str
) -> None:
    @producer.task(name="wait_for_key")
    async def wait_for_key(key: str, tag: str = "", timeout: float = 60.0) -> int:
        return 0  # runs in the worker processes (tests/workerapp.py)

    lease = 1.0
    victim = workers.start(lease=lease)
    await workers.wait_idle(redis, victim)
    release = f"{prefix}:release"
    opts = wait_for_key.options(unique_key="k", unique_for=600)
    job = await opts.enqueue(release)

    async def started() -> bool:
        return len(await run_records(redis, prefix)) >= 1

    await wait_until(started, timeout=30, what="the job to start")
    victim.signal(signal.SIGKILL)
    assert await victim.wait_exit(10) == -signal.SIGKILL
    # its lease runs out and the job is requeued: it keeps its lock all the while
    await producer.queue().reap()
    await wait_until(lambda: _not_active(producer, job.id), timeout=30, what="the lease to end")
    assert await holder(redis, producer, "k") == job.id
    assert (await opts.enqueue(release)).id == job.id
    survivor = workers.start(lease=lease)
    await redis.set(release, 1)
    assert await job.result(timeout=30) == survivor.pid
    assert await holder(redis, producer, "k") is None
    assert (await opts.enqueue(release)).id != job.id


async def _not_active(app: App, job_id: str) -> bool:
    await app.queue().reap()
    return (await app.queue().job_info(job_id)).state is not JobState.ACTIVE


async def test_the_blocking_producer_refuses_unique_jobs(app: App) -> None:
    @app.task
    async def work(x: int) -> None:
        pass

    with app.sync() as sync:
        with pytest.raises(ConfigurationError, match="unique"):
            sync.enqueue(work.options(unique=True), 1)
        with pytest.raises(ConfigurationError, match="unique"):
            sync.enqueue_many(work.options(unique_key="k"), [{"x": 1}])
    assert await job_count(app) == 0


async def test_enqueue_by_name_takes_the_unique_options(app: App, redis: Redis) -> None:
    q = app.queue()
    first = await q.enqueue("remote.sync", [7], unique=True)
    assert (await q.enqueue("remote.sync", [7], unique=True)).id == first.id
    assert (await q.enqueue("remote.sync", [8], unique=True)).id != first.id
    assert await holder(redis, app, derived_key("remote.sync", [7], {})) == first.id
    again = await q.enqueue("remote.sync", [9], unique_key="k", on_conflict="replace")
    replaced = await q.enqueue("remote.sync", [10], unique_key="k", on_conflict="replace")
    assert replaced.id == again.id
    assert (await again.info()).args == (10,)
    with pytest.raises(ConfigurationError, match="needs delay="):
        await q.enqueue("remote.sync", unique=True, on_conflict="debounce")


async def test_a_lock_key_of_the_wrong_type_is_set_aside_and_taken(app: App, redis: Redis) -> None:
    @app.task
    async def work() -> None:
        pass

    lock = app.queue()._keys.unique("k")
    await redis.hset(lock, "garbage", "1")
    job = await work.options(unique_key="k").enqueue()
    assert await holder(redis, app, "k") == job.id
    assert (await app.queue().stats())["garbled"] == 1
    await Worker(app, burst=True).run()
    assert await holder(redis, app, "k") is None


async def test_a_lock_without_a_ttl_is_garbage_and_taken(app: App, redis: Redis) -> None:
    @app.task
    async def work() -> None:
        pass

    lock = app.queue()._keys.unique("k")
    await redis.set(lock, "nobody")  # not written by enqueue: it would hold the key for ever
    job = await work.options(unique_key="k", unique_for=60).enqueue()
    assert await holder(redis, app, "k") == job.id
    assert 0 < await redis.pttl(lock) <= 60_000
