"""No waiting on the dead (I10), with real worker processes killed with ``kill -9``
(issue 24, points 5 and 11).

The bounds, for a worker with heartbeat ``h`` (``App.heartbeat``, 2 s by default):

- hand-off: a worker killed while parked gets at most **one hand-off** (the jobs of one
  enqueue call; with jobs enqueued one by one, one job) before it is known dead, and none
  after: a hand-off ends its parking, and only its own next claim parks it again;
- burial: a killed worker is dead ``3 h`` after its last heartbeat and buried by the next
  heartbeat of a live worker on the queue, so its jobs (leased, prefetched, handed) come back
  within **``4 h``** of its death (8 s by default), plus the time a heartbeat takes, whatever
  the live workers are doing (not at their next claim, up to ``idle_block`` later).

The tests run with ``h`` = 0.5 s (burial bound 2 s) and a 30 s lease, so nothing they see is
lease expiry, and assert the bound with room for a loaded machine; they print what they
measured.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from redis.asyncio import Redis

from aioqueue import App, Job

from .support.invariants import check_invariants
from .support.processes import WorkerProcess, WorkerProcesses, run_records
from .support.server import server_ms
from .support.waiting import wait_until

pytestmark = pytest.mark.cluster

LEASE = 30.0
HEARTBEAT = 0.5
#: the burial bound: dead three heartbeats after its last one, buried by the next live one
BURIAL_BOUND_MS = int(4 * HEARTBEAT * 1000)
#: what a loaded machine may add (a late heartbeat, a slow script, the test's own polling)
ROOM_MS = 2000
#: recovered jobs after the first go back 100 ms apart (lua/lib/maintenance.lua SPREAD_MS)
SPREAD_MS = 100


@pytest.fixture
def short_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker processes started in the test beat every HEARTBEAT seconds."""
    monkeypatch.setenv("AIOQUEUE_TEST_HEARTBEAT", str(HEARTBEAT))


@dataclass
class Burial:
    """When (server ms) a worker was killed and when the registry saw it buried."""

    killed_ms: int
    buried_ms: int

    @property
    def after_ms(self) -> int:
        return self.buried_ms - self.killed_ms


async def kill_and_time_burial(
    redis: Redis, producer: App, victim: WorkerProcess, buried_before: int = 0
) -> tuple[int, asyncio.Task[Burial]]:
    """kill -9 ``victim``; returns the server time of the kill and a task that completes with
    its burial (the queue's ``buried`` count passes ``buried_before``)."""
    victim.signal(signal.SIGKILL)
    assert await victim.wait_exit(5) == -signal.SIGKILL
    killed = await server_ms(redis)
    q = producer.queue()

    async def buried() -> bool:
        return int((await q.stats()).get("buried", 0)) > buried_before

    async def watch() -> Burial:
        await wait_until(buried, timeout=30, interval=0.02, what="the killed worker's burial")
        return Burial(killed, await server_ms(redis))

    return killed, asyncio.create_task(watch())


async def test_a_killed_parked_worker_gets_at_most_one_hand_off_and_no_job_waits_past_the_bound(
    short_heartbeat: None, workers: WorkerProcesses, producer: App, redis: Redis, prefix: str
) -> None:
    """Issue 24 point 5: two parked workers, one killed, then 40 jobs enqueued one by one:
    at most one goes to the dead worker (the victim parked last, so it is first in line for
    the first), and none starts later than the burial bound after the kill."""
    survivor = workers.start(lease=LEASE, concurrency=20)
    await workers.wait_idle(redis, survivor)
    victim = workers.start(lease=LEASE, concurrency=20)
    await workers.wait_idle(redis, victim)
    q = producer.queue()
    killed, burial = await kill_and_time_burial(redis, producer, victim)
    jobs = [await q.enqueue("record", kwargs={"tag": str(i)}, max_attempts=1) for i in range(40)]
    results = await asyncio.gather(*(j.result(timeout=LEASE - 5) for j in jobs))
    assert results == [survivor.pid] * 40
    buried = await asyncio.wait_for(burial, 30)
    runs = {r.id: r for r in await run_records(redis, prefix)}
    # every job ran once, on the live worker, as its first attempt (a hand-off to the dead
    # worker is refunded: it never started it)
    assert sorted((i, r.attempt, r.pid) for i, r in runs.items()) == sorted(
        (j.id, 1, survivor.pid) for j in jobs
    )
    stats = await q.stats()
    # the jobs handed to the dead worker: their first attempt ended with its burial
    details = [await q.job_detail(j.id) for j in jobs]
    to_dead = [d.info.id for d in details if any(a.outcome == "buried" for a in d.history)]
    created = {d.info.id: d.info.created_ms for d in details}
    waits = {j.id: runs[j.id].ms - created[j.id] for j in jobs}
    late = [runs[i].ms - killed for i in to_dead]
    print(
        f"\nhand-off: {len(to_dead)} of 40 jobs went to the dead worker, started {late} ms "
        f"after the kill; burial {buried.after_ms} ms after the kill (bound "
        f"{BURIAL_BOUND_MS} ms); the other jobs' longest wait from enqueue to start "
        f"{max(w for i, w in waits.items() if i not in to_dead)} ms"
    )
    assert len(to_dead) <= 1
    assert int(stats["buried"]) == 1
    assert int(stats.get("expired", 0)) == len(to_dead)
    assert buried.after_ms <= BURIAL_BOUND_MS + ROOM_MS
    for j in jobs:
        # started at once, or (the one handed to the dead worker) by the burial bound
        assert runs[j.id].ms - max(created[j.id], killed) <= BURIAL_BOUND_MS + ROOM_MS, waits
    assert [w.pid for w in await q.workers()] == [survivor.pid]
    await check_invariants(redis, q._keys)


@dataclass
class Killed:
    """A worker killed holding jobs (``kill_holding``), and the live worker left."""

    victim: WorkerProcess
    survivor: WorkerProcess
    running: list[Job[Any]]
    prefetched: list[Job[Any]]
    burial: Burial


async def kill_holding(
    workers: WorkerProcesses,
    producer: App,
    redis: Redis,
    running: int,
    prefetched: int,
    *,
    load: bool = False,
) -> Killed:
    """A worker at concurrency ``running`` runs that many jobs (each waits for a key) with
    ``prefetched`` more leased into its buffer, never started; a live worker idles (parked,
    its next claim up to idle_block = 5 s away) or, with ``load``, is kept busy by a producer
    enqueueing 50 ms jobs faster than it runs them; the first is killed, then the key set (the
    jobs that were running may finish on the survivor). Returns once the victim is buried and
    every job has finished."""
    q = producer.queue()
    key = f"{producer.prefix}:go"
    run = [
        await q.enqueue("wait_for_key", kwargs={"key": key, "tag": f"r{i}"}) for i in range(running)
    ]
    pre = [await q.enqueue("record", kwargs={"tag": f"p{i}"}) for i in range(prefetched)]
    victim = workers.start(lease=LEASE, concurrency=running, extra=("--prefetch", str(prefetched)))
    await wait_holding(redis, producer, victim, run, running + prefetched)
    survivor = workers.start(lease=LEASE, concurrency=4)
    await workers.wait_idle(redis, survivor)
    stop = asyncio.Event()
    loaded: list[Job[Any]] = []

    async def produce() -> None:
        while not stop.is_set():
            loaded.append(await q.enqueue("record", kwargs={"tag": "load", "duration": 0.05}))
            await asyncio.sleep(0.01)

    producing = asyncio.create_task(produce()) if load else None
    if load:  # the survivor is busy before the kill
        await wait_until(lambda: len(loaded) >= 20, timeout=20, what="the load to start")
    _killed, burial = await kill_and_time_burial(redis, producer, victim)
    await redis.set(key, "1")
    buried = await asyncio.wait_for(burial, 30)
    stop.set()
    if producing is not None:
        await producing
    await asyncio.gather(*(j.result(timeout=LEASE - 5) for j in [*run, *pre, *loaded]))
    return Killed(victim, survivor, run, pre, buried)


async def test_the_burial_bound_holds_while_the_live_worker_is_busy(
    short_heartbeat: None, workers: WorkerProcesses, producer: App, redis: Redis
) -> None:
    """The same kill while the live worker runs a backlog of jobs that a producer keeps
    filling: its heartbeats and claims go on, and the dead worker is buried within the bound."""
    k = await kill_holding(workers, producer, redis, running=4, prefetched=8, load=True)
    print(
        f"\nburial under load: {k.burial.after_ms} ms after the kill (bound {BURIAL_BOUND_MS} ms)"
    )
    assert k.burial.after_ms <= BURIAL_BOUND_MS + ROOM_MS
    await check_invariants(redis, producer.queue()._keys)


async def test_a_killed_workers_leased_and_prefetched_jobs_come_back_within_the_burial_bound(
    short_heartbeat: None, workers: WorkerProcesses, producer: App, redis: Redis, prefix: str
) -> None:
    """A worker running 4 jobs with 8 more prefetched is killed while a live worker idles:
    all 12 come back within the burial bound, and run on the live worker."""
    k = await kill_holding(workers, producer, redis, running=4, prefetched=8)
    runs = await run_records(redis, prefix)
    on_survivor = {r.id: r.ms for r in runs if r.pid == k.survivor.pid}
    assert set(on_survivor) == {j.id for j in [*k.running, *k.prefetched]}
    last_start = max(on_survivor.values()) - k.burial.killed_ms
    print(
        f"\nburial: {k.burial.after_ms} ms after the kill (bound {BURIAL_BOUND_MS} ms); the 12 "
        f"jobs all started on the live worker {last_start} ms after the kill"
    )
    assert k.burial.after_ms <= BURIAL_BOUND_MS + ROOM_MS
    # the recovered jobs go back spread 100 ms apart; each starts when it falls due
    assert last_start <= BURIAL_BOUND_MS + 11 * SPREAD_MS + ROOM_MS
    await check_invariants(redis, producer.queue()._keys)


async def test_prefetched_jobs_of_a_killed_worker_come_back_with_their_attempt_refunded(
    short_heartbeat: None, workers: WorkerProcesses, producer: App, redis: Redis, prefix: str
) -> None:
    """Issue 24 point 11: a worker with 2 jobs running and 3 in its prefetch buffer (leased,
    never started) is killed: the 3 run again as attempt 1 (the attempt refunded, I10), the 2
    that had started as attempt 2. A worker that reported its prefetched jobs as started
    (e.g. counting its whole claim as started at once) fails this test."""
    k = await kill_holding(workers, producer, redis, running=2, prefetched=3)
    runs = await run_records(redis, prefix)
    assert sorted((r.tag, r.attempt, r.pid) for r in runs) == sorted(
        [(f"r{i}", 1, k.victim.pid) for i in range(2)]
        + [(f"r{i}", 2, k.survivor.pid) for i in range(2)]
        + [(f"p{i}", 1, k.survivor.pid) for i in range(3)]
    )
    assert [(await j.info()).attempts for j in k.prefetched] == [1, 1, 1]
    assert [(await j.info()).attempts for j in k.running] == [2, 2]


async def wait_holding(
    redis: Redis, producer: App, victim: WorkerProcess, running: Sequence[object], held: int
) -> None:
    """Wait until ``victim`` runs the ``running`` jobs and holds ``held`` jobs in all (the
    rest leased into its prefetch buffer, not started)."""
    q = producer.queue()

    async def holding() -> bool:
        assert victim.popen.poll() is None, victim.log_text()
        started = {r.id for r in await run_records(redis, producer.prefix)}
        ws = await q.workers()
        return len(started) == len(running) and [w.jobs_held for w in ws] == [held]

    await wait_until(holding, timeout=20, interval=0.02, what="the worker to hold its jobs")
    states = await check_invariants(redis, q._keys)
    assert sum(s == "active" for s in states.values()) == held
    assert all(s == "active" for s in states.values())
