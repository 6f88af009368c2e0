"""Sentinel: ``redis+sentinel://`` URLs, an App and worker processes on a primary, a replica
and three sentinels (tests/support/sentinel.py), the primary SIGKILLed mid-run, and the
durability mode (``wait_replicas``) against the replica."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from aioqueue import (
    App,
    ConfigurationError,
    JobState,
    NotReplicated,
    ServerUnavailable,
    Worker,
)
from aioqueue._model.safetext import redact_url as redact
from aioqueue._store.connect import resolve_url
from aioqueue._store.embedded import EmbeddedServer
from aioqueue._store.sentinel import parse

from .support.apps import unique_prefix
from .support.ports import free_port
from .support.processes import WorkerProcesses
from .support.sentinel import SERVICE, SentinelGroup
from .support.waiting import wait_until

# ------------------------------------------------------------------ the URL


def test_url_forms() -> None:
    u = parse("redis+sentinel://u:p%40ss@h1:26379,h2:26380/svc/3?sentinel_password=sp")
    assert u.sentinels == [("h1", 26379), ("h2", 26380)]
    assert (u.service, u.db, u.username, u.password) == ("svc", 3, "u", "p@ss")
    assert u.sentinel_password == "sp"
    assert u.node_options() == {"db": 3, "username": "u", "password": "p@ss"}
    bare = parse("redis+sentinel://h1/svc")
    assert bare.sentinels == [("h1", 26379)]
    assert (bare.db, bare.username, bare.password) == (0, None, None)
    assert resolve_url("valkey+sentinel://h1:1/svc") == "redis+sentinel://h1:1/svc"


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://h1:26379",  # no service
        "redis+sentinel://h1:26379/",  # empty service
        "redis+sentinel://h1:notaport/svc",
        "redis+sentinel://h1:70000/svc",
        "redis+sentinel://h1:1,,h2:2/svc",  # an empty host
        "redis+sentinel://h1:1/svc/x",  # a db that is no number
        "redis+sentinel://h1:1/svc?password=x",  # an unknown parameter
    ],
)
def test_bad_urls_are_refused_when_the_app_is_made(url: str) -> None:
    with pytest.raises(ConfigurationError, match="Sentinel URL"):
        App(url)


def test_passwords_are_redacted() -> None:
    url = "redis+sentinel://u:secret@h1:1,h2:2/svc?sentinel_password=other"
    shown = redact(url)
    assert "secret" not in shown
    assert "other" not in shown
    assert shown == "redis+sentinel://u:***@h1:1,h2:2/svc?sentinel_password=***"


async def test_no_sentinel_answering_is_server_unavailable() -> None:
    port = free_port()  # nothing listens there
    app = App(f"redis+sentinel://:secret@127.0.0.1:{port}/svc", socket_timeout=2)
    with pytest.raises(ServerUnavailable) as info:
        await app.open()
    assert "secret" not in str(info.value)
    assert f"127.0.0.1:{port}/svc" in str(info.value)


# ------------------------------------------------------------------ a live deployment


@pytest.fixture
def two_replicas(tmp_path: Path) -> Iterator[SentinelGroup]:
    """Two replicas: after a failover one is left to acknowledge writes (``WAIT 1``)."""
    group = SentinelGroup(tmp_path, replicas=2)
    try:
        group.wait_ready()
        yield group
    finally:
        group.close()


@contextlib.asynccontextmanager
async def primary_client(group: SentinelGroup) -> AsyncIterator[Redis]:
    client = Redis(port=group.primary.port, socket_timeout=None)
    try:
        yield client
    finally:
        await client.aclose()


async def test_an_app_finds_the_primary_through_the_sentinels(sentinels: SentinelGroup) -> None:
    async with App(sentinels.url, prefix=unique_prefix()) as app:

        @app.task
        async def double(x: int) -> int:
            return 2 * x

        job = await double.enqueue(21)
        await Worker(app, burst=True).run()
        assert await job.result(timeout=10) == 42
        # the write reached the primary the sentinels named (not a replica: those refuse it)
        async with primary_client(sentinels) as primary:
            assert await primary.exists(f"{app.prefix}:{{default}}:stats")
    # the blocking producer goes through the sentinels too
    with App(sentinels.url, prefix=app.prefix).sync() as sync:
        assert sync.job(job.id, "default").info().state is JobState.COMPLETED


async def test_durability_mode_waits_for_the_replica(sentinels: SentinelGroup) -> None:
    async with App(sentinels.url, prefix=unique_prefix(), wait_replicas=1) as app:
        q = app.queue()
        job = await q.enqueue("noop", job_id="j1")
        (r,) = await q.reserve(1)
        await q.complete(r, "done")
        assert (await job.info()).state is JobState.COMPLETED
        # acknowledged means replicated: the replica has the completed job already
        replica = Redis(port=sentinels.replicas[0].port, socket_timeout=None)
        try:
            record = await replica.hgetall(f"{app.prefix}:{{default}}:job:j1")
        finally:
            await replica.aclose()
        assert record
        assert record == await app.redis.hgetall(f"{app.prefix}:{{default}}:job:j1")


async def test_too_few_replicas_raise_not_replicated(sentinels: SentinelGroup) -> None:
    async with App(sentinels.url, prefix=unique_prefix(), wait_replicas=2, wait_timeout=0.2) as app:
        q = app.queue()
        with pytest.raises(NotReplicated) as info:
            await q.enqueue("noop", job_id="j1")
        assert info.value.acknowledged == 1
        # the write is on the primary; enqueueing the same id again is safe (and still short)
        assert (await q.job("j1").info()).state is JobState.QUEUED
        (r,) = await q.reserve(1)
        with pytest.raises(NotReplicated):
            await q.complete(r, None)
        assert (await q.job("j1").info()).state is JobState.COMPLETED


async def test_a_worker_logs_completions_not_replicated_and_goes_on(
    sentinels: SentinelGroup, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = unique_prefix()
    async with App(sentinels.url, prefix=prefix) as producer:
        await producer.queue().enqueue("noop", job_id="j1")
    async with App(sentinels.url, prefix=prefix, wait_replicas=2, wait_timeout=0.2) as app:

        @app.task
        async def noop() -> None:
            return None

        with caplog.at_level(logging.WARNING, logger="aioqueue"):
            await Worker(app, burst=True).run()
        assert (await app.queue().job("j1").info()).state is JobState.COMPLETED
    assert "acknowledged by 1 of 2 replicas" in caplog.text


async def test_durability_off_sends_no_wait(redis_url: str, redis: Redis) -> None:
    async def waits() -> int:
        stats = await redis.info("commandstats")
        return int(stats.get("cmdstat_wait", {}).get("calls", 0))

    before = await waits()
    async with App(redis_url, prefix=unique_prefix()) as app:
        q = app.queue()
        await q.enqueue("noop")
        (r,) = await q.reserve(1)
        await q.complete(r, None)
    assert await waits() == before


async def test_wait_aof_waits_for_the_local_fsync(fresh_server: EmbeddedServer) -> None:
    async with App(fresh_server.url, prefix=unique_prefix(), wait_aof=True) as app:
        job = await app.queue().enqueue("noop")  # WAITAOF 1 0: fsynced locally
        assert (await job.info()).state is JobState.QUEUED
        stats = await app.redis.info("commandstats")
        assert int(stats["cmdstat_waitaof"]["calls"]) >= 1
        # the scripts flushed: the calls that met NOSCRIPT run again once loaded, and wait
        q = app.queue()
        await app.redis.script_flush()
        await q.enqueue("noop", job_id="after-flush")
        await app.redis.script_flush()
        jobs = await q.reserve(2)
        assert {r.id for r in jobs} == {job.id, "after-flush"}
        await app.redis.script_flush()
        await q.complete(jobs[0], None)
        assert (await q.job(jobs[0].id).info()).state is JobState.COMPLETED
        after = await app.redis.info("commandstats")
        assert int(after["cmdstat_waitaof"]["calls"]) >= int(stats["cmdstat_waitaof"]["calls"]) + 2


def test_durability_settings_are_checked() -> None:
    with pytest.raises(ConfigurationError):
        App(wait_replicas=-1)
    with pytest.raises(ConfigurationError):
        App(wait_replicas=1, wait_timeout=0)
    with pytest.raises(ConfigurationError):
        App(wait_replicas=1, wait_timeout=60, socket_timeout=30)
    assert App().durability is None
    d = App(wait_replicas=2, wait_timeout=0.5).durability
    assert d is not None
    assert (d.replicas, d.timeout_ms, d.aof) == (2, 500, False)


# ------------------------------------------------------------------ failover


@pytest.mark.slow
async def test_workers_and_producers_go_on_after_the_primary_is_killed(
    two_replicas: SentinelGroup, tmp_path: Path
) -> None:
    """A worker process and a producer run; the primary is SIGKILLed; the sentinels promote
    the replica; both carry on through the sentinels. With asynchronous replication a
    failover loses the writes the replica had not received when the primary died; the
    producer runs in durability mode (``wait_replicas=1``), so every enqueue it saw
    acknowledged is on the replica, and each of those jobs completes. A completion lost
    that way runs the job again when its lease runs out (at least once). Two replicas, so
    that one is left to acknowledge writes after the other is promoted."""
    sentinels = two_replicas
    prefix = unique_prefix()
    procs = WorkerProcesses(tmp_path, sentinels.url, prefix, lease=2.0)
    acked: list[str] = []
    stop = asyncio.Event()
    errors: list[BaseException] = []
    try:
        worker = procs.start(concurrency=8)
        async with primary_client(sentinels) as primary:
            await procs.wait_idle(primary, worker, timeout=30)
        async with App(sentinels.url, prefix=prefix, wait_replicas=1, wait_timeout=2) as app:
            q = app.queue()

            async def produce() -> None:
                i = 0
                while not stop.is_set():
                    job_id = f"j{i}"
                    try:  # an unacknowledged enqueue is retried with its id (idempotent)
                        await q.enqueue("record", kwargs={"tag": job_id}, job_id=job_id)
                    except (NotReplicated, OSError) as exc:
                        errors.append(exc)
                        await asyncio.sleep(0.05)
                        continue
                    acked.append(job_id)
                    i += 1
                    await asyncio.sleep(0.005)

            producer = asyncio.create_task(produce())
            await wait_until(lambda: len(acked) >= 50, timeout=30, what="50 enqueues")
            await asyncio.to_thread(sentinels.kill_primary)
            await asyncio.to_thread(sentinels.wait_replicas_follow)
            before = len(acked)
            await wait_until(
                lambda: len(acked) >= before + 50, timeout=60, what="enqueues after failover"
            )
            stop.set()
            await producer

            async def all_done() -> bool:
                assert worker.popen.poll() is None, worker.log_text()
                infos = [await q.job(j).info() for j in acked]
                return all(i.state is JobState.COMPLETED for i in infos)

            await wait_until(all_done, timeout=90, interval=0.5, what="every acked job done")
        assert worker.popen.poll() is None  # the worker survived the failover
    finally:
        procs.close()
    assert SERVICE in sentinels.url
