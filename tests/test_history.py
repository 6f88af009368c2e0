"""A job's attempt history in ``Queue.job_detail`` (issue 13): each attempt with its worker, its
start and end on the server's clock and how it ended; recovered leases of a killed worker; the
cap that keeps a record bounded (I8); garbage in the history field (I9); the CLI's ``job``."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess

from redis.asyncio import Redis

from aioqueue import App, AttemptInfo, Backoff, JobState, Worker
from aioqueue._queue.inspect import HISTORY_MAX

from .support.apps import unique_prefix
from .support.clirun import aioqueue_cli
from .support.invariants import check_invariants
from .support.processes import WorkerProcesses, run_records
from .support.server import server_ms
from .support.waiting import wait_until


def _ordered(a: AttemptInfo) -> None:
    """An ended attempt's times are known and in order."""
    assert a.started_ms is not None, a
    assert a.ended_ms is not None, a
    assert a.started_ms <= a.ended_ms, a


async def test_a_job_that_fails_twice_then_succeeds_shows_three_attempts(
    app: App, redis: Redis
) -> None:
    q = app.queue(app.default_queue)
    seen: list[int] = []

    @app.task(max_attempts=5, backoff=Backoff(base=0.01, jitter=0))
    async def flaky() -> str:
        seen.append(1)
        if len(seen) <= 2:
            raise ValueError(f"not yet {len(seen)}")
        return "ok"

    before = await server_ms(redis)
    job = await flaky.enqueue()
    worker = Worker(app, concurrency=2)
    run = asyncio.create_task(worker.run())
    try:
        assert await job.result(timeout=60) == "ok"
    finally:
        worker.stop()
        await asyncio.wait_for(run, 30)
    after = await server_ms(redis)

    d = await q.job_detail(job.id)
    assert d.info.state is JobState.COMPLETED
    assert [a.number for a in d.history] == [1, 2, 3]
    assert [a.outcome for a in d.history] == ["retried", "retried", "completed"]
    assert [a.worker for a in d.history] == [worker.id] * 3
    assert [(a.error_type, a.error_message) for a in d.history] == [
        ("ValueError", "not yet 1"),
        ("ValueError", "not yet 2"),
        (None, None),
    ]
    for a in d.history:
        _ordered(a)
        assert before <= a.started_ms <= after  # type: ignore[operator]
    # one after the other: each attempt starts once the one before it has ended
    for prev, nxt in zip(d.history, d.history[1:], strict=False):
        assert prev.ended_ms <= nxt.started_ms  # type: ignore[operator]
    assert d.history[-1].ended_ms == d.info.finished_ms
    assert d.started_ms == d.history[-1].started_ms
    await check_invariants(redis, q._keys)


async def test_pull_api_attempts_released_running_and_dead_lettered(app: App) -> None:
    q = app.queue(app.default_queue)
    job = await q.enqueue("t", max_attempts=2)
    [r] = await q.reserve(1)
    d = await q.job_detail(job.id)
    [running] = d.history
    assert (running.number, running.outcome, running.worker, running.ended_ms) == (
        1,
        "running",
        None,  # a pull-API consumer is no registered worker
        None,
    )
    assert running.started_ms is not None
    await q.release(r)  # refunded: the next lease is attempt 1 again
    [r] = await q.reserve(1)
    await q.fail(r, RuntimeError("boom"), delay=0)
    [r] = await q.reserve(1)
    await q.fail(r, KeyError("gone"), retry=False)
    d = await q.job_detail(job.id)
    assert d.info.state is JobState.FAILED
    assert [(a.number, a.outcome, a.error_type) for a in d.history] == [
        (1, "released", None),
        (1, "retried", "RuntimeError"),
        (2, "failed", "KeyError"),
    ]
    for a in d.history:
        _ordered(a)


async def test_a_job_cancelled_while_running_records_the_cancelled_attempt(
    redis_url: str,
) -> None:
    # a short lease: the worker hears of the cancellation at its next heartbeat (lease / 3)
    async with App(redis_url, prefix=unique_prefix(), lease=1.5) as app:
        q = app.queue(app.default_queue)
        started = asyncio.Event()

        @app.task
        async def hang() -> None:
            started.set()
            await asyncio.sleep(60)

        job = await hang.enqueue()
        worker = Worker(app, concurrency=1)
        run = asyncio.create_task(worker.run())
        try:
            await asyncio.wait_for(started.wait(), 30)
            await q.cancel_jobs([job.id])
            await wait_until(
                lambda: _state_is(q, job.id, JobState.CANCELLED), timeout=30, what="the cancel"
            )
        finally:
            worker.stop()
            await asyncio.wait_for(run, 30)
        d = await q.job_detail(job.id)
        [a] = d.history
        assert (a.number, a.worker, a.outcome) == (1, worker.id, "cancelled")
        _ordered(a)


async def _state_is(q: object, job_id: str, state: JobState) -> bool:
    return (await q.job_info(job_id)).state is state  # type: ignore[attr-defined]


async def test_history_is_capped_and_survives_garbage(app: App, redis: Redis) -> None:
    q = app.queue(app.default_queue)
    fails = HISTORY_MAX + 5
    job = await q.enqueue("t", max_attempts=fails + 1)
    for _ in range(fails):
        [r] = await q.reserve(1)
        await q.fail(r, RuntimeError("x" * 1000), delay=0)
    d = await q.job_detail(job.id)
    assert len(d.history) == HISTORY_MAX
    # the oldest are dropped first
    assert [a.number for a in d.history] == list(range(fails - HISTORY_MAX + 1, fails + 1))
    # a message is kept short (the full last error is in info.error)
    assert all(len(a.error_message or "") <= 200 for a in d.history)
    key = q._keys.job(job.id)
    # bounded whatever the errors: about 300 bytes an entry
    assert await redis.hstrlen(key, "hx") < 400 * HISTORY_MAX

    # garbage written into the field: the detail still reads, and the next end starts afresh
    await redis.hset(key, "hx", b"\xff{not json")
    d = await q.job_detail(job.id)
    assert d.history == ()
    [r] = await q.reserve(1)
    await q.fail(r, RuntimeError("after garbage"), delay=0)
    d = await q.job_detail(job.id)
    assert [(a.number, a.error_message) for a in d.history] == [(fails + 1, "after garbage")]
    # entries of the wrong shape are skipped, the others kept
    await redis.hset(key, "hx", json.dumps([1, {"n": "x"}, {"n": 3, "o": "retried", "s": []}]))
    d = await q.job_detail(job.id)
    assert [(a.number, a.outcome, a.started_ms) for a in d.history] == [(3, "retried", None)]
    await check_invariants(redis, q._keys)


# ---------------------------------------------------------------------- a killed worker
async def test_a_lease_recovered_from_a_killed_worker_shows_in_the_history(
    workers: WorkerProcesses, redis_url: str, redis: Redis, prefix: str
) -> None:
    lease = 1.0
    procs = [workers.start(lease=lease), workers.start(lease=lease)]
    await workers.wait_idle(redis, *procs)
    release = f"{prefix}:release"
    async with App(redis_url, prefix=prefix) as producer:
        q = producer.queue()
        job = await q.enqueue("wait_for_key", kwargs={"key": release})

        async def started() -> bool:
            return len(await run_records(redis, prefix)) >= 1

        await wait_until(started, timeout=30, what="the job to start")
        victim = workers.by_pid((await run_records(redis, prefix))[0].pid)
        survivor = next(p for p in procs if p is not victim)
        victim.signal(signal.SIGKILL)
        assert await victim.wait_exit(10) == -signal.SIGKILL
        await redis.set(release, 1)
        assert await job.result(timeout=lease + 30) == survivor.pid

        d = await q.job_detail(job.id)
        lost, done = d.history
        # recovered by the lease running out, or by the burial of the worker that stopped
        # beating, whichever came first
        assert lost.outcome in ("expired", "buried")
        assert (lost.number, done.number, done.outcome) == (1, 2, "completed")
        assert lost.worker is not None
        assert f":{victim.pid}:" in lost.worker
        assert done.worker is not None
        assert f":{survivor.pid}:" in done.worker
        _ordered(lost)
        _ordered(done)
        assert lost.ended_ms <= done.started_ms  # type: ignore[operator]

        # the CLI shows the same, as a table and as JSON
        res = _cli(redis_url, prefix, "job", job.id, "--json")
        assert res.returncode == 0, res.stderr
        history = json.loads(res.stdout)["history"]
        assert [(h["number"], h["outcome"]) for h in history] == [
            (1, lost.outcome),
            (2, "completed"),
        ]
        assert set(history[0]) == {
            "number",
            "worker",
            "started_ms",
            "ended_ms",
            "outcome",
            "error_type",
            "error_message",
        }
        text = _cli(redis_url, prefix, "job", job.id).stdout
        assert "history:" in text
        lines = text.split("history:")[1].splitlines()[1:]
        assert lines[0].split()[:2] == ["#", "worker"]
        assert lines[1].split()[0] == "1"
        assert lost.outcome in lines[1]
        assert lines[2].split()[0] == "2"
        assert "completed" in lines[2]


def _cli(url: str, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    return aioqueue_cli(url, prefix, *args)
