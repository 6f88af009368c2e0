"""Worker processes that die, run long, or are told to stop (I3, I5, graceful shutdown).

Real ``python -m aioqueue worker tests.workerapp:app`` processes on the shared server; the
tasks of ``tests.workerapp`` record every start and every finished body, with the server's
clock, so the tests can count executions across processes.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Awaitable
from pathlib import Path

import pytest
from redis.asyncio import Redis

from aioqueue import App, JobFailed, JobState

from .support.invariants import JobRecord, check_records
from .support.processes import WorkerProcess, WorkerProcesses, run_records, side_effects
from .support.server import blocked_in, server_ms, text
from .support.waiting import PROMPT_S, wait_until

# also on a local Valkey Cluster (tests/conftest.py)
pytestmark = pytest.mark.cluster


async def runs_count(redis: Redis, prefix: str) -> int:
    return len(await run_records(redis, prefix))


async def started_and_blocked(
    redis: Redis, prefix: str, worker: WorkerProcess, runs: int = 1
) -> None:
    """Wait until ``runs`` job starts are recorded and the worker's fetch loop is blocked idle
    on the server again (so a signal finds it there, not mid-command)."""
    await wait_until(
        lambda: _at_least(runs_count(redis, prefix), runs), timeout=10, what="the job to start"
    )
    await wait_until(lambda: blocked_in(redis, worker.name), what="the fetch loop to block")


async def _at_least(value: Awaitable[int], n: int) -> bool:
    return await value >= n


async def _not(value: Awaitable[bool]) -> bool:
    return not await value


# ---------------------------------------------------------------------- a worker dies (I3)
async def test_kill_9_mid_job_is_recovered_once_within_the_lease(
    workers: WorkerProcesses, producer: App, redis: Redis, prefix: str
) -> None:
    lease = 1.0
    procs = [workers.start(lease=lease), workers.start(lease=lease)]
    await workers.wait_idle(redis, *procs)
    release = f"{prefix}:release"
    job = await producer.queue().enqueue("wait_for_key", kwargs={"key": release})
    await wait_until(lambda: _at_least(runs_count(redis, prefix), 1), what="the job to start")
    first = (await run_records(redis, prefix))[0]
    victim = workers.by_pid(first.pid)
    survivor = next(p for p in procs if p is not victim)
    killed_ms = await server_ms(redis)
    victim.signal(signal.SIGKILL)
    assert await victim.wait_exit(5) == -signal.SIGKILL
    await redis.set(release, 1)  # the next run finishes at once
    assert await job.result(timeout=lease + 5) == survivor.pid
    runs = await run_records(redis, prefix)
    assert [(r.pid, r.attempt) for r in runs] == [(victim.pid, 1), (survivor.pid, 2)]
    recovery_ms = runs[1].ms - killed_ms
    print(f"\nkill -9 recovery with lease {lease} s: {recovery_ms} ms (server clock)")
    # not before the last renewal ran out (heartbeats every lease/3), and within the lease
    assert lease * 1000 / 2 < recovery_ms < lease * 1000 + 1000
    starts, done = await side_effects(redis, prefix)
    assert (starts, done) == ({job.id: 2}, {job.id: 1})
    stats = await producer.queue().stats()
    assert (stats["completed"], stats["expired"]) == (1, 1)
    assert await check_records(redis, producer.queue()._keys) == {
        job.id: JobRecord("completed", 2, None)
    }


async def test_jobs_handed_to_a_worker_killed_while_parked_come_back_with_the_lease(
    workers: WorkerProcesses, producer: App, redis: Redis, prefix: str
) -> None:
    """A worker killed while parked stays registered for a few seconds: jobs enqueued then
    are leased to it (see test_handoff.py) and come back when it is buried or the lease runs
    out, without spending an attempt (it never started them; see test_registry.py)."""
    lease = 1.0
    victim = workers.start(lease=lease)
    await workers.wait_idle(redis, victim)
    keys = producer.queue()._keys
    victim_id = await _parked_id(redis, keys.idle)
    victim.signal(signal.SIGKILL)
    assert await victim.wait_exit(5) == -signal.SIGKILL
    jobs = [await producer.queue().enqueue("record", kwargs={"tag": str(i)}) for i in range(3)]
    values = await redis.lrange(keys.hand(victim_id), 0, -1)
    handed = {text(values[i]) for i in range(0, len(values), 7)}
    assert handed, "no job was handed to the dead worker"
    assert handed <= {j.id for j in jobs}
    enqueued_ms = await server_ms(redis)
    survivor = workers.start(lease=lease)
    # the survivor is up once it registered (on a busy machine, starting a process can take
    # longer than the lease): from then on, or from the lease's end, the jobs run at once
    up_ms = await _registered_ms(redis, keys.workers, other_than=victim_id)
    assert [await j.result(timeout=lease + 15) for j in jobs] == [survivor.pid] * 3
    runs = await run_records(redis, prefix)
    # each job ran once, on the survivor, as its first attempt: the dead worker never
    # started those handed to it, so they got their attempt back
    assert sorted((r.id, r.pid, r.attempt) for r in runs) == sorted(
        (j.id, survivor.pid, 1) for j in jobs
    )
    waited = max(r.ms for r in runs) - max(enqueued_ms + int(lease * 1000), up_ms)
    print(f"\n{len(handed)} jobs handed to a dead parked worker ran {waited} ms after the lease")
    assert waited < 1000
    assert await redis.exists(keys.hand(victim_id)) == 0
    assert (await producer.queue().stats())["expired"] == len(handed)


async def _registered_ms(redis: Redis, workers_key: str, other_than: str) -> int:
    """The server's time once a worker other than ``other_than`` is in the registry."""

    async def registered() -> bool:
        return any(text(w) != other_than for w in await redis.zrange(workers_key, 0, -1))

    await wait_until(registered, timeout=30, interval=0.02, what="the survivor to register")
    return await server_ms(redis)


async def _parked_id(redis: Redis, idle_key: str) -> str:
    parked = [text(w) for w in await redis.zrange(idle_key, 0, -1)]
    assert len(parked) == 1, parked
    return parked[0]


async def test_slow_job_keeps_its_lease_and_runs_once(
    workers: WorkerProcesses, producer: App, redis: Redis, prefix: str
) -> None:
    lease, seconds = 0.5, 2.5  # each job runs 5 leases long
    procs = [workers.start(lease=lease), workers.start(lease=lease)]
    await workers.wait_idle(redis, *procs)
    jobs = [
        await producer.queue().enqueue("slow", kwargs={"seconds": seconds, "tag": str(i)})
        for i in range(4)
    ]
    pids = [await job.result(timeout=seconds + 10) for job in jobs]
    assert set(pids) <= {p.pid for p in procs}
    starts, done = await side_effects(redis, prefix)
    assert starts == done == {job.id: 1 for job in jobs}
    stats = await producer.queue().stats()
    assert stats["completed"] == 4
    assert stats.get("expired", 0) == 0  # no lease ever ran out
    assert all(r.attempt == 1 for r in await run_records(redis, prefix))


# ---------------------------------------------------------------------- a poison job (I5)
async def test_poison_job_is_dead_lettered_after_max_attempts(
    workers: WorkerProcesses, producer: App, redis: Redis, prefix: str
) -> None:
    lease = 0.5
    job = await producer.queue().enqueue("poison", max_attempts=3)
    dead = []
    for _ in range(3):  # each run kills its worker; start another each time
        proc = workers.start(lease=lease)
        assert await proc.wait_exit(15) == 1
        dead.append(proc.pid)
    survivor = workers.start(lease=lease)
    with pytest.raises(JobFailed) as failed:
        await job.result(timeout=lease + 10)
    assert failed.value.error_type == "LeaseExpired"
    assert "attempt 3 of 3" in failed.value.error_message
    runs = await run_records(redis, prefix)
    assert [(r.pid, r.attempt) for r in runs] == list(zip(dead, [1, 2, 3], strict=True))
    info = await job.info()
    assert (info.state, info.attempts) == (JobState.FAILED, 3)
    assert await check_records(redis, producer.queue()._keys) == {
        job.id: JobRecord("failed", 3, None)
    }
    # the worker that outlived it is unharmed and stops cleanly
    survivor.signal(signal.SIGTERM)
    assert await survivor.wait_exit(10) == 0


# ---------------------------------------------------------------------- graceful shutdown
async def test_sigterm_lets_the_running_job_finish(
    workers: WorkerProcesses, producer: App, redis: Redis, prefix: str
) -> None:
    proc = workers.start(grace=10)
    await workers.wait_idle(redis, proc)
    release = f"{prefix}:release"
    job = await producer.queue().enqueue("wait_for_key", kwargs={"key": release})
    await started_and_blocked(redis, prefix, proc)
    proc.signal(signal.SIGTERM)
    # it stops fetching at once...
    await wait_until(lambda: _not(blocked_in(redis, proc.name)), what="the fetch loop to stop")
    later = await producer.queue().enqueue("record", kwargs={"tag": "after SIGTERM"})
    # ...and lets the running job finish
    assert proc.popen.poll() is None
    await redis.set(release, 1)
    assert await proc.wait_exit(10) == 0
    assert await job.result(timeout=1) == proc.pid
    assert await later.state() is JobState.QUEUED
    starts, done = await side_effects(redis, prefix)
    assert (starts, done) == ({job.id: 1}, {job.id: 1})
    records = await check_records(redis, producer.queue()._keys)
    assert records == {
        job.id: JobRecord("completed", 1, None),
        later.id: JobRecord("queued", 0, None),
    }


async def test_sigterm_after_grace_returns_the_job_without_spending_an_attempt(
    workers: WorkerProcesses, producer: App, redis: Redis, prefix: str, tmp_path: Path
) -> None:
    grace = 0.3
    proc = workers.start(grace=grace)
    await workers.wait_idle(redis, proc)
    release = tmp_path / "release"
    job = await producer.queue().enqueue("wait_for_file", kwargs={"path": str(release)})
    await started_and_blocked(redis, prefix, proc)
    t0 = time.monotonic()
    proc.signal(signal.SIGTERM)
    assert await proc.wait_exit(10) == 0
    elapsed = time.monotonic() - t0
    print(f"\nSIGTERM with --grace {grace}: exited after {elapsed:.2f} s")
    assert elapsed >= grace
    assert elapsed < grace + 3
    # back in the queue at once, its attempt refunded
    assert await check_records(redis, producer.queue()._keys) == {
        job.id: JobRecord("queued", 0, None)
    }
    nxt = workers.start()
    release.touch()
    assert await job.result(timeout=10) == nxt.pid
    runs = await run_records(redis, prefix)
    assert [(r.pid, r.attempt) for r in runs] == [(proc.pid, 1), (nxt.pid, 1)]
    starts, done = await side_effects(redis, prefix)
    assert (starts, done) == ({job.id: 2}, {job.id: 1})
    assert (await producer.queue().stats())["completed"] == 1


async def test_second_sigterm_forces_a_prompt_exit_and_loses_nothing(
    workers: WorkerProcesses, producer: App, redis: Redis, prefix: str, tmp_path: Path
) -> None:
    lease = 1.0
    proc = workers.start(grace=30, lease=lease)
    await workers.wait_idle(redis, proc)
    release = tmp_path / "release"
    job = await producer.queue().enqueue("wait_for_file", kwargs={"path": str(release)})
    await started_and_blocked(redis, prefix, proc)
    proc.signal(signal.SIGTERM)
    await wait_until(lambda: _not(blocked_in(redis, proc.name)), what="the fetch loop to stop")
    assert proc.popen.poll() is None  # waiting (up to 30 s) for the job
    t0 = time.monotonic()
    proc.signal(signal.SIGTERM)
    assert await proc.wait_exit(10) == 0
    elapsed = time.monotonic() - t0
    print(f"\nsecond SIGTERM: exited after {elapsed:.2f} s")
    assert elapsed < 3 * PROMPT_S  # the first SIGTERM's grace is 30 s
    # not lost: handed back now, or by its lease
    records = await check_records(redis, producer.queue()._keys)
    assert records[job.id].state in ("queued", "active")
    nxt = workers.start(lease=lease)
    release.touch()
    assert await job.result(timeout=lease + 10) == nxt.pid
    runs = await run_records(redis, prefix)
    assert [r.pid for r in runs] == [proc.pid, nxt.pid]
    starts, done = await side_effects(redis, prefix)
    assert (starts, done) == ({job.id: 2}, {job.id: 1})
    assert (await producer.queue().stats())["completed"] == 1


async def test_second_sigterm_stops_even_a_job_that_ignores_cancellation(
    workers: WorkerProcesses, producer: App, redis: Redis, prefix: str, tmp_path: Path
) -> None:
    proc = workers.start(grace=30, lease=1.0)
    await workers.wait_idle(redis, proc)
    release = tmp_path / "release"
    await producer.queue().enqueue("stubborn", kwargs={"path": str(release)})
    await started_and_blocked(redis, prefix, proc)
    proc.signal(signal.SIGTERM)
    await wait_until(lambda: _not(blocked_in(redis, proc.name)), what="the fetch loop to stop")
    proc.signal(signal.SIGTERM)
    try:
        assert await proc.wait_exit(5) == 0
    finally:
        release.touch()
