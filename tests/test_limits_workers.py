"""Named limiters with real worker processes (``python -m aioqueue worker
tests.limitsapp:app``) on a real server: a keyed rate limit is exact across processes by the
server's clock and kept up to; a concurrency limit holds, and its slots come back within the
lease when a holder is killed with SIGKILL. The figures measured are printed (``-rP``)."""

from __future__ import annotations

import itertools
import json
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from aioqueue import App

from . import limitsapp
from .support.clirun import aioqueue_cli
from .support.processes import WorkerProcesses
from .support.waiting import wait_until

APP = "tests.limitsapp:app"


@pytest.fixture
def limit_workers(
    tmp_path: Path, redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[WorkerProcesses]:
    monkeypatch.setenv("LIMITSAPP_RATE", str(RATE))
    procs = WorkerProcesses(tmp_path, redis_url, prefix, app=APP)
    try:
        yield procs
    finally:
        procs.close()
        print(procs.logs()[-3000:])


def declare(app: App) -> None:
    """The limiters and tasks of tests.limitsapp, on the producer's App."""
    app.limiter("per_customer", rate=(RATE, 1.0), key=lambda customer, i: customer)
    app.limiter("slots", concurrency=limitsapp.SLOTS)
    app.task(name="charge", limits=["per_customer"])(limitsapp.charge.fn)
    app.task(name="hold", limits=["slots"])(limitsapp.hold.fn)


# 2,000 jobs of 20 customers at 20/s each in the suite; the size (10,000 jobs of 20
# customers at 50/s each) with AIOQUEUE_LIMITS_EXACT=20,500,50 (docs/flow-control.md has
# both runs' figures)
CUSTOMERS, PER_CUSTOMER, RATE = (
    int(n) for n in os.environ.get("AIOQUEUE_LIMITS_EXACT", "20,100,20").split(",")
)


async def test_a_keyed_rate_is_exact_across_four_processes_and_kept_up_to(
    limit_workers: WorkerProcesses, producer: App, redis: Redis
) -> None:
    declare(producer)
    for _ in range(4):
        limit_workers.start(concurrency=20)
    await limit_workers.wait_idle(redis, *limit_workers.procs, timeout=60)
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((f"c{c}", i), {}) for i in range(PER_CUSTOMER) for c in range(CUSTOMERS)
    ]
    t0 = time.monotonic()
    jobs = await producer.tasks["charge"].enqueue_many(calls)
    q = producer.queue()

    async def all_done() -> bool:
        return (await q.stats()).get("completed", 0) >= len(jobs)

    await wait_until(all_done, timeout=PER_CUSTOMER / RATE * 4 + 60, interval=0.5, what="drain")
    elapsed = time.monotonic() - t0
    pipe = redis.pipeline(transaction=False)
    for job in jobs:
        pipe.hmget(f"{producer.prefix}:{{default}}:job:{job.id}", "st", "a", "s")
    rows = await pipe.execute()
    starts: dict[str, list[int]] = defaultdict(list)
    for (args, _), (st, a, s) in zip(calls, rows, strict=True):
        assert (s, a) == (b"completed", b"1"), args
        starts[args[0]].append(int(st))
    worst_window, rates, min_gap = 0, [], 1e9
    for key, ts in starts.items():
        ts.sort()
        assert len(ts) == PER_CUSTOMER, key
        # no window of 1 s holds more than RATE starts: the RATE+1-th start after any start
        # is at least 1000 ms later (by the server's clock: the claim's TIME)
        for i in range(len(ts) - RATE):
            worst_window = max(worst_window, sum(1 for t in ts[i:] if t < ts[i] + 1000))
            assert ts[i + RATE] - ts[i] >= 1000, (key, i, ts[i : i + RATE + 1])
        # no start while the limit was empty: GCRA keeps starts at least half a turn apart
        min_gap = min(min_gap, min(b - a for a, b in itertools.pairwise(ts)))
        rates.append((len(ts) - 1) * 1000 / (ts[-1] - ts[0]))
    print(
        f"{len(jobs)} jobs, {CUSTOMERS} keys at {RATE}/s, 4 processes: drained in {elapsed:.1f} s;"
        f" worst 1 s window {worst_window}; min gap {min_gap} ms;"
        f" per-key rate min {min(rates):.2f}/s mean {sum(rates) / len(rates):.2f}/s"
    )
    assert worst_window <= RATE
    assert min_gap >= 1000 / RATE / 2
    # kept up to: 19.7-19.9/s (within 2 %) on a calm machine; a start no claim could make in
    # time (a worker starved of CPU) is lost beyond half a turn, so under heavy load (load
    # average 23 on 2 cores) it was 18.4/s: the bound here is what no load should break
    assert min(rates) >= RATE * 0.8, rates


async def test_concurrency_slots_come_back_within_the_lease_after_sigkill(
    limit_workers: WorkerProcesses, producer: App, redis: Redis
) -> None:
    declare(producer)
    lease = 2.0
    procs = [limit_workers.start(concurrency=5, lease=lease) for _ in range(2)]
    await limit_workers.wait_idle(redis, *procs, timeout=60)
    await producer.tasks["hold"].enqueue_many([((30.0,), {}) for _ in range(8)])
    running = limitsapp.running_key(producer.prefix)

    async def counts() -> dict[int, int]:
        return {int(k): int(v) for k, v in (await redis.hgetall(running)).items()}

    async def full() -> bool:
        return sum((await counts()).values()) == limitsapp.SLOTS

    await wait_until(full, timeout=30, what="the 3 slots taken")
    now = await counts()
    victim = next(p for p in procs if now.get(p.pid))
    held = now[victim.pid]
    limit_workers.kill(victim)
    await redis.hdel(running, str(victim.pid))  # its runs never end: uncount them
    t0 = time.monotonic()
    await wait_until(full, timeout=lease * 3 + 20, what="the killed holder's slots back")
    back = time.monotonic() - t0
    print(f"lease {lease} s: {held} slot(s) of a SIGKILLed holder back in {back:.2f} s")
    assert int(await redis.get(limitsapp.max_key(producer.prefix)) or 0) == limitsapp.SLOTS
    survivor = next(p for p in procs if p is not victim)
    assert (await counts()) == {survivor.pid: limitsapp.SLOTS}


async def test_the_limiter_command_shows_a_key_and_changes_the_rate_for_everyone(
    producer: App, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LIMITSAPP_RATE", "1")
    declare(producer)
    producer.limiters.clear()  # one start per 10 s, here and in the command's App
    producer.limiter("per_customer", rate=(1, 10.0), key=lambda customer, i: customer)
    q = producer.queue()
    jobs = [await producer.tasks["charge"].enqueue("c1", i) for i in range(2)]
    assert [r.id for r in await q.reserve(5)] == [jobs[0].id]
    cmd = ("limiter", "tests.limitsapp:app", "per_customer", "--key", "c1", "--json")
    shown = aioqueue_cli(redis_url, producer.prefix, *cmd)
    assert shown.returncode == 0, shown.stderr
    state = json.loads(shown.stdout)
    assert (state["tokens"], state["waiting"], state["holders"]) == (0, 1, 0)
    changed = aioqueue_cli(redis_url, producer.prefix, *cmd[:-1], "--rate", "1000/1")
    assert changed.returncode == 0, changed.stderr
    assert "run-time settings {'n': '1000', 'ms': '1000'}" in changed.stdout

    async def second() -> bool:
        return [r.id for r in await q.reserve(5)] == [jobs[1].id]

    await wait_until(second, timeout=10, what="the waiting job under the new rate")
    bad = aioqueue_cli(redis_url, producer.prefix, "limiter", "tests.limitsapp:app", "nobody")
    assert bad.returncode == 1
    assert "no limiter named 'nobody'" in bad.stderr
