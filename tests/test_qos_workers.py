"""Quality of service with real worker processes (``python -m aioqueue worker
tests.qosapp:app``) on a real server: fairness while one group floods, a group's concurrency
limit across processes (also when one is killed with SIGKILL), a rate limit across processes,
and pause/resume of a group and of the queue from another process.

The jobs keep their own record in Redis (see ``tests/qosapp.py``): how many of a label run at
once (the most ever seen is kept by the jobs themselves), every start with the claim's lease
deadline, and every completion in order. The figures each test measures are printed (run
with ``-rP`` to see them).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from aioqueue import App, Queue, Task

from . import qosapp
from .qosapp import QosKeys
from .support.apps import open_app, unique_prefix
from .support.server import server_ms, text
from .support.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent

Work = Task[[str, int, float], int]
LEASE_MS = 30_000  # the workers' lease (Workers.start's default)


@dataclass
class Start:
    """One start of a job, as ``qosapp.work`` logged it."""

    label: str
    seq: int
    id: str
    attempt: int
    pid: int
    now_ms: int
    lease_deadline_ms: int


@dataclass
class Workers:
    """Worker processes of one test; whatever is still running is killed at teardown."""

    url: str
    log_dir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, prefix: str, n: int, *, concurrency: int, lease: float = 30.0) -> None:
        env = {
            **os.environ,
            "AIOQUEUE_REDIS_URL": self.url,
            qosapp.PREFIX_ENV: prefix,
            qosapp.LEASE_ENV: str(lease),
        }
        for _ in range(n):
            i = len(self.procs)
            cmd = [
                *(sys.executable, "-m", "aioqueue", "worker", "tests.qosapp:app"),
                *("--concurrency", str(concurrency), "--url", self.url, "--grace", "5"),
                *("--log-level", "WARNING"),
            ]
            with (self.log_dir / f"worker-{i}.log").open("wb") as log:
                proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log)
            self.procs.append(proc)

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    async def stop(self) -> None:
        """SIGTERM (graceful), then SIGKILL for any that take longer than 10 s."""
        for p in self.alive():
            p.send_signal(signal.SIGTERM)
        try:
            await wait_until(lambda: not self.alive(), timeout=10, what="workers to exit")
        finally:
            self.kill_all()

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)


@pytest.fixture
def workers(redis_url: str, tmp_path: Path) -> Iterator[Workers]:
    w = Workers(redis_url, tmp_path)
    try:
        yield w
    finally:
        w.kill_all()


@pytest.fixture
async def app(redis_url: str, redis: Redis) -> AsyncIterator[App]:
    """An App on a fresh prefix with qosapp's task registered (overrides conftest's ``app``);
    its keys are deleted afterwards, the flood test leaves thousands."""
    async with open_app(redis_url, prefix=unique_prefix()) as opened:
        opened.task(name="work")(qosapp.work.fn)
        try:
            yield opened
        finally:
            keys = [k async for k in redis.scan_iter(match=opened.prefix + ":*", count=5000)]
            for i in range(0, len(keys), 5000):
                await redis.unlink(*keys[i : i + 5000])


def work_of(app: App) -> Work:
    task: Work = app.tasks["work"]
    return task


async def fill(app: App, label: str, n: int, *, sleep: float = 0.0, start: int = 0) -> None:
    """Enqueue jobs ``(label, start..start+n-1, sleep)`` in group ``label``."""
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((label, start + i, sleep), {}) for i in range(n)
    ]
    await work_of(app).options(group=label).enqueue_many(calls)


async def done_list(redis: Redis, keys: QosKeys, start: int = 0) -> list[str]:
    return [text(x) for x in await redis.lrange(keys.done, start, -1)]


async def done_of(redis: Redis, keys: QosKeys, label: str) -> set[int]:
    """The distinct seqs of ``label`` that completed."""
    return {int(x.split(":")[1]) for x in await done_list(redis, keys) if x.startswith(label + ":")}


async def starts(redis: Redis, keys: QosKeys) -> list[Start]:
    return [Start(*json.loads(x)) for x in await redis.lrange(keys.starts, 0, -1)]


async def running_now(redis: Redis, keys: QosKeys, label: str) -> int:
    return sum(int(v) for v in await redis.hvals(keys.running(label)))


async def max_seen(redis: Redis, keys: QosKeys, label: str) -> int:
    return int(await redis.get(keys.max(label)) or 0)


def report(what: str, **figures: Any) -> None:
    print(f"QOS {what}: " + ", ".join(f"{k}={v}" for k, v in figures.items()))


# ---------------------------------------------------------------------------- fairness


async def test_a_flood_of_one_group_delays_another_groups_jobs_by_a_few_jobs(
    app: App, redis: Redis, workers: Workers
) -> None:
    keys = QosKeys(app.prefix)
    q = app.queue()
    await fill(app, "A", 20_000)
    workers.start(app.prefix, 3, concurrency=10)

    async def a_done() -> bool:
        return await redis.llen(keys.done) >= 1000

    # generous timeouts: three worker processes on a loaded 2-core machine
    await wait_until(a_done, timeout=120, what="1,000 of A's jobs to finish")
    queued_a = (await q.group_counts())["A"]
    before = await redis.llen(keys.done)
    await fill(app, "B", 10)

    async def b_done() -> bool:
        later = await done_list(redis, keys, before)
        return sum(x.startswith("B:") for x in later) == 10

    await wait_until(b_done, timeout=120, what="B's 10 jobs to finish")
    after = await done_list(redis, keys, before)
    positions = [i + 1 for i, x in enumerate(after) if x.startswith("B:")]
    await workers.stop()

    # fairness is decided by the claims, in the server's order (each claim sets its jobs' lease
    # deadlines, claim time + the lease, by the server's clock), not by the order in which
    # three processes happen to finish their jobs on a busy machine
    started = await starts(redis, keys)
    claimed = {s.id: s.lease_deadline_ms - LEASE_MS for s in started}
    b_ids = [s.id for s in started if s.label == "B"]
    # when B's jobs were stored (one script: the same server time for all ten)
    b_came = min([int(await redis.hget(q._keys.job(i), "ct") or 0) for i in b_ids])
    last_b = max(claimed[i] for i in b_ids)
    a_between = sum(1 for s in started if s.label == "A" and b_came <= claimed[s.id] <= last_b)
    report(
        "fairness",
        a_queued_when_b_came=queued_a,
        a_claimed_while_b_waited=a_between,
        b_positions_among_later_completions=positions,
        in_flight_capacity=30,
    )
    assert queued_a > 15_000  # A was flooding the queue when B's jobs came
    assert len(b_ids) == 10
    # FIFO would claim all of A's ~19,000 queued jobs before B's; round-robin claims about
    # one of A's per B job (claims of several jobs alternate lanes), plus the claims already
    # under way when B's jobs came
    assert a_between <= 10 + 20, a_between


# ---------------------------------------------------------------------------- concurrency limits


async def test_a_group_limit_holds_across_worker_processes(
    app: App, redis: Redis, workers: Workers
) -> None:
    keys = QosKeys(app.prefix)
    q = app.queue()
    await q.set_group_limit("L", 3)
    await fill(app, "L", 120, sleep=0.02)
    await fill(app, "other", 300, sleep=0.01)  # unlimited jobs beside them
    workers.start(app.prefix, 3, concurrency=20)

    async def all_done() -> bool:
        return len(await done_list(redis, keys)) >= 420

    await wait_until(all_done, timeout=30, what="every job to finish")
    assert await done_of(redis, keys, "L") == set(range(120))
    assert await done_of(redis, keys, "other") == set(range(300))
    observed = await max_seen(redis, keys, "L")
    others = await max_seen(redis, keys, "other")
    await workers.stop()
    report("limit", group_limit=3, max_running_L=observed, max_running_unlimited=others)
    assert observed == 3  # never above the limit, and the limit is used to the full
    assert others > 3
    assert await redis.hlen(q._keys.gactive) == 0  # every slot given back


async def test_a_group_limit_holds_while_a_worker_is_killed(
    app: App, redis: Redis, workers: Workers
) -> None:
    """SIGKILL a worker while it runs jobs of the limited group: their slots stay taken until
    the worker is declared dead (three missed heartbeats: about the lease, 1 s) or their
    leases run out, then they run again elsewhere; never more than K at once."""
    keys = QosKeys(app.prefix)
    q = app.queue()
    await q.set_group_limit("L", 3)
    await fill(app, "L", 40, sleep=0.15)
    workers.start(app.prefix, 3, concurrency=20, lease=1.0)
    pids = {p.pid: p for p in workers.procs}

    victim: list[int] = []

    async def victim_found() -> bool:
        if len(await done_of(redis, keys, "L")) < 3:
            return False
        counts = await redis.hgetall(keys.running("L"))
        busy = [int(pid) for pid, n in counts.items() if int(n) > 0 and int(pid) in pids]
        victim[:] = busy[:1]
        return bool(victim)

    await wait_until(victim_found, timeout=30, what="a worker running L's jobs")
    pid = victim[0]
    pids[pid].send_signal(signal.SIGKILL)
    pids[pid].wait(10)
    # the dead process will never take its jobs out of the count: do it for it
    held = int(await redis.hget(keys.running("L"), str(pid)) or 0)
    await redis.hdel(keys.running("L"), str(pid))
    dead_jobs = [s for s in await starts(redis, keys) if s.pid == pid]
    lost = [s.id for s in dead_jobs if await redis.zscore(q._keys.active, s.id) is not None]
    deadlines = {i: int(await redis.zscore(q._keys.active, i) or 0) for i in lost}

    async def all_done() -> bool:
        return await done_of(redis, keys, "L") == set(range(40))

    await wait_until(all_done, timeout=30, what="every job of L to finish")
    observed = await max_seen(redis, keys, "L")
    log = await starts(redis, keys)
    reruns = {s.id: s.now_ms for s in log if s.id in deadlines and s.pid != pid}
    await workers.stop()

    reuse_ms = [reruns[i] - deadlines[i] for i in reruns]
    report(
        "limit under kill -9",
        group_limit=3,
        max_running_L=observed,
        jobs_running_in_killed_worker=held,
        leases_lost=len(lost),
        rerun_after_lease_deadline_ms=reuse_ms,
    )
    assert observed <= 3
    assert held >= 1
    assert lost, "the killed worker held no lease"
    assert set(reruns) == set(lost)  # each abandoned job ran again in a live worker
    assert all(r.attempt >= 2 for r in log if r.id in reruns and r.pid != pid)
    # the capacity came back as soon as the worker was buried or the lease ran out, not at
    # some later sweep (recovered jobs are spread 100 ms apart: see test_registry.py)
    assert all(-1000 < ms < 1000 for ms in reuse_ms), reuse_ms
    assert (await q.stats())["expired"] >= len(lost)


# ---------------------------------------------------------------------------- rate limits


async def test_a_group_rate_limit_holds_across_worker_processes(
    app: App, redis: Redis, workers: Workers
) -> None:
    keys = QosKeys(app.prefix)
    q = app.queue()
    n, period_ms, lease_ms = 50, 1000, 60_000
    await q.set_rate_limit(n, period_ms / 1000, group="R")
    await fill(app, "R", 400)
    await fill(app, "free", 200)
    workers.start(app.prefix, 3, concurrency=20, lease=lease_ms / 1000)

    async def enough() -> bool:
        return len(await done_of(redis, keys, "R")) >= 3 * n + 1

    await wait_until(enough, timeout=30, what="four rate windows")
    await q.pause()  # freeze the record before reading it: every claimed job has finished

    async def r_idle() -> bool:
        return await redis.hget(q._keys.gactive, "R") is None

    await wait_until(r_idle, what="R's claimed jobs to finish")
    log = [s for s in await starts(redis, keys) if s.label == "R"]
    free_done = len(await done_of(redis, keys, "free"))
    await workers.stop()

    # the claim's server time is the lease deadline it set minus the lease (the leases are
    # far longer than the test, so no heartbeat has moved them yet)
    windows = Counter((s.lease_deadline_ms - lease_ms) // period_ms for s in log)
    counts = [windows[w] for w in sorted(windows)]
    report("rate", limit=f"{n} per {period_ms} ms", starts_per_window=counts)
    assert max(counts) <= n, counts
    assert len(counts) >= 4
    assert all(c == n for c in counts[1:-1]), counts  # the windows in between are used fully
    assert free_done == 200  # the other group was never held back


# ---------------------------------------------------------------------------- pause / resume


async def test_pause_and_resume_a_group_and_the_queue_across_worker_processes(
    app: App, redis: Redis, workers: Workers
) -> None:
    keys = QosKeys(app.prefix)
    q = app.queue()
    lease_ms = 60_000  # no heartbeat moves a lease deadline during the test
    await fill(app, "P1", 1000, sleep=0.02)
    await fill(app, "P2", 1000, sleep=0.02)
    workers.start(app.prefix, 3, concurrency=10, lease=lease_ms / 1000)

    async def count(label: str) -> int:
        return len(await done_of(redis, keys, label))

    async def claims_of(label: str) -> list[int]:
        return [s.lease_deadline_ms for s in await starts(redis, keys) if s.label == label]

    await wait_until(lambda: _at_least(count("P1"), 30), timeout=30, what="P1 to run")

    # pause one group: its jobs stop starting, the other group's carry on
    await q.pause("P1")
    paused_at = await server_ms(redis)
    # every job of P1 handed out before the pause has finished and been acknowledged (a job
    # can be claimed and not started yet, or finished and not logged yet)
    await wait_until(lambda: _group_idle(redis, q, "P1"), what="P1 to drain")
    p1_done, p2_done = await count("P1"), await count("P2")
    await wait_until(lambda: _at_least(count("P2"), p2_done + 50), what="P2 to carry on")
    assert await count("P1") == p1_done
    assert max(await claims_of("P1")) - lease_ms <= paused_at

    await q.resume("P1")
    await wait_until(lambda: _at_least(count("P1"), p1_done + 30), what="P1 to resume")

    # pause the queue: nothing starts at all
    await q.pause()
    paused_at = await server_ms(redis)
    await wait_until(lambda: _group_idle(redis, q, "P1"), what="P1 to drain")
    await wait_until(lambda: _group_idle(redis, q, "P2"), what="P2 to drain")
    assert await running_now(redis, keys, "P1") + await running_now(redis, keys, "P2") == 0
    started = len(await starts(redis, keys))
    quiet_from = await server_ms(redis)
    calls_before = await evalsha_calls(redis)
    await wait_until(lambda: _server_past(redis, quiet_from + 500), what="half a second")
    idle_claims = await evalsha_calls(redis) - calls_before
    assert len(await starts(redis, keys)) == started
    last_claim = max(s.lease_deadline_ms for s in await starts(redis, keys)) - lease_ms
    assert last_claim <= paused_at
    assert (await q.counts())["queued"] > 0

    await q.resume()
    resumed_at = await server_ms(redis)
    await wait_until(
        lambda: _at_least(_len_starts(redis, keys), started + 50), what="work to resume"
    )
    first_after = min(s.now_ms for s in await starts(redis, keys) if s.now_ms >= resumed_at)
    await workers.stop()
    report(
        "pause",
        restart_after_resume_ms=first_after - resumed_at,
        script_calls_in_half_a_second_paused=idle_claims,
    )
    assert first_after - resumed_at < 500


async def evalsha_calls(redis: Redis) -> int:
    """Script calls the server has run, from every client (a figure for the report)."""
    stats = await redis.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("fcall", "evalsha"))


async def _at_least(value: Any, n: int) -> bool:
    return int(await value) >= n


async def _group_idle(redis: Redis, q: Queue, group: str) -> bool:
    """No job of ``group`` is active on the server (claimed and not yet acknowledged)."""
    return await redis.hget(q._keys.gactive, group) is None


async def _server_past(redis: Redis, ms: int) -> bool:
    return await server_ms(redis) >= ms


async def _len_starts(redis: Redis, keys: QosKeys) -> int:
    return int(await redis.llen(keys.starts))
