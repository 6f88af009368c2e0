"""Quality of service through the pull API, on a real server: fair groups (round-robin),
priorities, per-group concurrency limits, rate limits, pause/resume, and the cost of the one
claim path with many blocked groups.

Every job here carries ``(label, seq)`` as its arguments, so a reservation tells which lane it
came from without reading the store. Another ``App`` on the same prefix (its own connection
pool) stands in for another process.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from redis.asyncio import Redis

from aioqueue import App, ConfigurationError, JobState, Queue, Reservation, Task, Worker

from .support.apps import drop_keys, open_app
from .support.instrumented import Gate, instrument, stopping
from .support.invariants import check_invariants
from .support.server import blocked_in, clients_named, server_ms
from .support.waiting import PROMPT_S, wait_until

# also on a local Valkey Cluster (tests/conftest.py)
pytestmark = pytest.mark.cluster

Work = Task[[str, int], None]


def define(app: App) -> Work:
    """The suite's one task: a job labelled by its lane and its order within the lane."""

    @app.task(name="work")
    async def work(label: str, seq: int) -> None:
        return None

    return work


async def fill(
    work: Work,
    label: str,
    n: int,
    *,
    group: str | None = "",
    priority: int | None = None,
    queue: str | None = None,
) -> None:
    """Enqueue ``n`` jobs ``(label, 0..n-1)`` in one round trip; ``group`` defaults to the
    label (``None``: no group)."""
    opts = work.options(group=label if group == "" else group, priority=priority, queue=queue)
    await opts.enqueue_many([((label, i), {}) for i in range(n)])


def labels(rs: Sequence[Reservation]) -> list[str]:
    return [str(r.args[0]) for r in rs]


def seqs(rs: Sequence[Reservation]) -> list[int]:
    return [int(r.args[1]) for r in rs]


async def reserve_each(q: Queue, n: int, **kwargs: Any) -> list[Reservation]:
    """``n`` single-job reservations, one claim each (the order consumers see)."""
    out: list[Reservation] = []
    for _ in range(n):
        got = await q.reserve(1, **kwargs)
        assert len(got) <= 1
        out += got
    return out


# ---------------------------------------------------------------------------- fair groups


async def test_groups_interleave_round_robin_while_one_floods(app: App, redis: Redis) -> None:
    work = define(app)
    q = app.queue()
    await fill(work, "A", 3000)
    await fill(work, "B", 5)
    await fill(work, "C", 5)

    got = await reserve_each(q, 15)
    order = labels(got)
    # one job per group per turn: every turn of three serves each group once
    for turn in range(5):
        assert sorted(order[3 * turn : 3 * turn + 3]) == ["A", "B", "C"], order
    for lane in "ABC":  # FIFO within each lane
        assert [r.args[1] for r in got if r.args[0] == lane] == list(range(5))
    # B and C are done; A alone now gets every claim
    assert labels(await reserve_each(q, 5)) == ["A"] * 5
    assert await q.group_counts() == {"A": 2990}
    await check_invariants(redis, q._keys)


async def test_one_batch_claim_is_fair_too(app: App) -> None:
    work = define(app)
    q = app.queue()
    await fill(work, "A", 2000)
    await fill(work, "B", 3)
    await fill(work, "C", 100)
    got = await q.reserve(12)
    assert Counter(labels(got)) == {"A": 5, "B": 3, "C": 4}, labels(got)
    # the lanes take turns inside the one claim, in ring order
    assert labels(got)[:9] == ["A", "B", "C"] * 3


async def test_a_new_group_is_served_within_one_turn_per_active_group(app: App) -> None:
    work = define(app)
    q = app.queue()
    flooders = [f"flood-{i}" for i in range(5)]
    for g in flooders:
        await fill(work, g, 1000)
    await reserve_each(q, 7)  # the ring is in mid-turn
    await fill(work, "new", 1)
    got = await reserve_each(q, len(flooders) + 1)
    assert "new" in labels(got), labels(got)
    # and the same holds for a consumer that claims many jobs at once
    await reserve_each(q, 3)
    await fill(work, "newer", 1)
    batch = await q.reserve(50)
    assert labels(batch).index("newer") <= len(flooders), labels(batch)


async def test_jobs_without_a_group_are_one_lane_of_the_ring(app: App, redis: Redis) -> None:
    work = define(app)
    q = app.queue()
    await fill(work, "none", 300, group=None)
    await fill(work, "A", 300)
    await fill(work, "B", 300)
    got = await reserve_each(q, 30)
    assert Counter(labels(got)) == {"none": 10, "A": 10, "B": 10}
    # ungrouped priority-0 jobs still wait in the plain ready LIST, as without groups
    assert await redis.llen(q._keys.ready) == 290
    assert await q.group_counts() == {"A": 290, "B": 290}
    assert await q.counts() == {"scheduled": 0, "queued": 870, "active": 30, "failed": 0}


async def test_a_trickling_group_does_not_starve_a_waiting_backlog(app: App) -> None:
    """One job of A arrives before every claim: A's lane empties and refills each time. Served
    round-robin, B (a backlog, waiting all along) gets every other claim. (Regression: a lane
    that rejoined the ring took the front turn, so A got all 40 claims.)"""
    work = define(app)
    q = app.queue()
    await fill(work, "B", 100)
    got: list[Reservation] = []
    for i in range(40):
        await work.options(group="A").enqueue("A", i)
        got += await q.reserve(1)
    served = Counter(labels(got))
    assert served == {"A": 20, "B": 20}, f"B got {served['B']} of 40 claims while waiting"
    assert labels(got)[:6] in (["A", "B"] * 3, ["B", "A"] * 3), labels(got)


# ---------------------------------------------------------------------------- priorities


async def test_priorities_within_a_group_higher_first_fifo_within_a_level(app: App) -> None:
    work = define(app)
    q = app.queue()
    levels = [*range(-100, 101)]
    # every level twice, in a scrambled order, and a run of equal priorities
    order = [levels[(i * 11) % len(levels)] for i in range(len(levels))] * 2 + [7] * 5
    for seq, p in enumerate(order):
        await work.options(group="A", priority=p).enqueue("A", seq)
    got = await q.reserve(len(order))
    expected = sorted(range(len(order)), key=lambda i: (-order[i], i))
    assert seqs(got) == expected
    assert [order[s] for s in seqs(got)][:3] == [100, 100, 99]


async def test_priorities_of_jobs_without_a_group(app: App, redis: Redis) -> None:
    work = define(app)
    q = app.queue()
    order = [0, 5, -5, 100, 5, 0, -100, 100, 0, -1, 1]
    for seq, p in enumerate(order):
        await work.options(priority=p).enqueue("none", seq)
    assert await redis.llen(q._keys.ready) == 3  # priority 0: the plain FIFO list
    got = await reserve_each(q, len(order))
    assert seqs(got) == sorted(range(len(order)), key=lambda i: (-order[i], i))


async def test_groups_take_turns_whatever_their_priorities(app: App) -> None:
    """Round-robin across groups, priority within a group: B's priority-100 jobs do not jump
    ahead of A's turn, they only go first among B's own jobs."""
    work = define(app)
    q = app.queue()
    for seq in range(4):
        await work.options(group="A", priority=-100).enqueue("A", seq)
    await work.options(group="B").enqueue("B", 0)
    for seq in range(1, 4):
        await work.options(group="B", priority=100).enqueue("B", seq)
    got = await reserve_each(q, 8)
    assert labels(got) == ["A", "B"] * 4
    assert [r.args[1] for r in got if r.args[0] == "B"] == [1, 2, 3, 0]


async def test_a_released_job_goes_back_ahead_of_its_level_not_of_higher_ones(app: App) -> None:
    work = define(app)
    q = app.queue()
    for seq, p in enumerate([5, 5, 5]):
        await work.options(group="A", priority=p).enqueue("A", seq)
    (first,) = await q.reserve(1)
    await work.options(group="A", priority=9).enqueue("A", 3)
    await q.release(first)
    got = await q.reserve(3)
    assert seqs(got) == [3, 0, 1]


@pytest.mark.parametrize("priority", [101, -101, 1000, True, 1.5, "9"])
async def test_out_of_range_priorities_are_refused(app: App, priority: Any) -> None:
    work = define(app)
    q = app.queue()
    with pytest.raises(ConfigurationError):
        await work.options(priority=priority, group="A").enqueue("A", 0)
    with pytest.raises(ConfigurationError):
        await q.enqueue("work", ["A", 0], priority=priority, group="A")
    with pytest.raises(ConfigurationError):

        @app.task(name="other", priority=priority)
        async def other() -> None:
            return None

    assert await q.counts() == {"scheduled": 0, "queued": 0, "active": 0, "failed": 0}


@pytest.mark.parametrize("priority", [-100, 100])
async def test_the_extreme_priorities_are_accepted(app: App, priority: int) -> None:
    work = define(app)
    job = await work.options(priority=priority, group="A").enqueue("A", 0)
    assert (await job.info()).priority == priority


@pytest.mark.parametrize("group", ["", 7, None])
async def test_bad_groups_are_refused(app: App, group: Any) -> None:
    work = define(app)
    if group is None:
        group = "x" * 201
    with pytest.raises(ConfigurationError):
        await work.options(group=group).enqueue("A", 0)
    with pytest.raises(ConfigurationError):
        await app.queue().enqueue("work", ["A", 0], group=group)


# ---------------------------------------------------------------------------- concurrency limits


async def test_a_group_limit_caps_its_reservations_and_each_ending_frees_a_slot(
    app: App, redis: Redis
) -> None:
    work = define(app)
    q = app.queue()
    await q.set_group_limit("L", 2)
    await fill(work, "L", 10)
    await fill(work, "O", 10)

    first = await q.reserve(10, lease=60)
    assert Counter(labels(first)) == {"L": 2, "O": 8}
    assert labels(await q.reserve(10, lease=60)) == ["O", "O"]
    assert await q.reserve(10) == []  # L is at its limit, nothing else is queued
    held = [r for r in first if r.args[0] == "L"]

    # completing one frees one slot, for the very next claim
    await q.complete(held[0])
    (nxt,) = await q.reserve(10, lease=60)
    assert nxt.args == ("L", 2)
    assert await q.reserve(10) == []

    # a failed attempt (retried later) frees its slot too
    assert await q.fail(held[1], "boom", delay=60) is True
    (nxt2,) = await q.reserve(10, lease=60)
    assert nxt2.args == ("L", 3)

    # a dead-lettered one as well
    assert await q.fail(nxt, "fatal", retry=False) is False
    (nxt3,) = await q.reserve(10, lease=60)
    assert nxt3.args == ("L", 4)

    # a released job frees its slot and is next in line again
    await q.release(nxt2)
    (again,) = await q.reserve(10, lease=60)
    assert again.id == nxt2.id
    assert await q.reserve(10) == []
    assert await redis.hget(q._keys.gactive, "L") == b"2"
    states = Counter((await check_invariants(redis, q._keys)).values())
    assert states == {"active": 12, "completed": 1, "queued": 5, "scheduled": 1, "failed": 1}


async def test_an_expired_lease_frees_the_slot_at_once(app: App, redis: Redis) -> None:
    work = define(app)
    q = app.queue()
    await q.set_group_limit("L", 1)
    await fill(work, "L", 3)
    (held,) = await q.reserve(5, lease=0.3)
    deadline = await redis.zscore(q._keys.active, held.id)
    assert deadline is not None
    loop = asyncio.get_running_loop()
    start = loop.time()
    # blocks until the lease runs out (no polling), then gets the abandoned job back
    got = await q.reserve(5, lease=60, wait=5)
    waited = loop.time() - start
    assert [(r.id, r.attempt) for r in got] == [(held.id, 2)]
    assert await server_ms(redis) >= deadline  # not before the lease ran out
    assert waited < 1.5  # (a loaded machine may spend the whole 0.3 s before this reserve)
    assert await q.reserve(5) == []  # the limit holds for the recovered job as well
    assert (await q.stats())["expired"] == 1


async def test_a_waiting_reserve_gets_a_slot_freed_in_another_process(
    redis_url: str, app: App, redis: Redis
) -> None:
    work = define(app)
    q = app.queue()
    await q.set_group_limit("L", 1)
    await fill(work, "L", 2)
    (held,) = await q.reserve(1, lease=60)
    name = f"waiter-{app.prefix}"
    async with open_app(redis_url, prefix=app.prefix, redis_options={"client_name": name}) as c:
        waiter = asyncio.create_task(c.queue().reserve(1, wait=30))
        # it blocks on the server (BLPOP), it does not poll
        await wait_until(lambda: blocked_in(redis, name), what="the waiter to block")
        assert not waiter.done()
        loop = asyncio.get_running_loop()
        freed = loop.time()
        await q.complete(held)
        got = await asyncio.wait_for(waiter, 35)
        assert loop.time() - freed < PROMPT_S  # woken, not timed out
        assert labels(got) == ["L"]
        assert got[0].args == ("L", 1)


async def test_limits_change_at_runtime(app: App) -> None:
    work = define(app)
    q = app.queue()
    await q.set_group_limit("L", 2)
    await fill(work, "L", 20)
    held = await q.reserve(20, lease=60)
    assert len(held) == 2
    await q.set_group_limit("L", 5)  # raised: three more at once
    more = await q.reserve(20, lease=60)
    assert len(more) == 3
    await q.set_group_limit("L", 1)  # lowered below what runs: nothing until under it
    assert await q.reserve(20) == []
    for r in [*held, *more[:3]]:
        await q.complete(r)
    assert len(await q.reserve(20, lease=60)) == 1
    await q.set_group_limit("L", None)  # cleared: the rest at once
    assert len(await q.reserve(20, lease=60)) == 14


async def test_a_default_limit_applies_to_every_group_without_its_own(app: App) -> None:
    work = define(app)
    q = app.queue()
    await q.set_group_limit(None, 1)
    for g in "ABC":
        await fill(work, g, 3)
    await fill(work, "none", 3, group=None)  # no group: no limit
    got = await q.reserve(20, lease=60)
    assert Counter(labels(got)) == {"A": 1, "B": 1, "C": 1, "none": 3}
    await q.set_group_limit("A", 2)  # its own limit wins over the default
    assert labels(await q.reserve(20, lease=60)) == ["A"]
    await q.set_group_limit(None, None)  # the default cleared: B and C run freely
    assert Counter(labels(await q.reserve(20, lease=60))) == {"B": 2, "C": 2}
    assert await q.group_counts() == {"A": 1}


@pytest.mark.parametrize("limit", [0, -1, True, 2.0])
async def test_bad_limits_are_refused(app: App, limit: Any) -> None:
    q = app.queue()
    with pytest.raises(ConfigurationError):
        await q.set_group_limit("A", limit)
    with pytest.raises(ConfigurationError):
        await q.set_rate_limit(limit, 1.0, group="A")
    with pytest.raises(ConfigurationError):
        await q.set_group_limit("", 1)
    with pytest.raises(ConfigurationError):
        await q.set_rate_limit(5, 0)


async def test_lowering_the_default_limit_leaves_no_runnable_job_unserved(app: App) -> None:
    """After the default limit drops below what 300 groups already run, a group with room
    (its own higher limit) is served by the next claim, however many over-limit groups are
    still in the ring. (Regression: the claim loop's bound counted the turns that parked
    those groups, so reserve(1) returned [] twice first.)"""
    work = define(app)
    q = app.queue()
    for i in range(300):
        await fill(work, f"g{i:03d}", 2)
    await fill(work, "zz", 2)
    assert len(await q.reserve(301, lease=60)) == 301  # one of each: every lane has 1 left
    await q.set_group_limit("zz", 10)
    await q.set_group_limit(None, 1)
    assert labels(await q.reserve(1)) == ["zz"]


async def test_a_claim_finds_a_job_behind_many_cancelled_ones(app: App) -> None:
    """Cancelled jobs leave their lane at once: a claim never wades through them."""
    work = define(app)
    q = app.queue()
    for group in ("A", None):
        label = group or "none"
        jobs = await work.options(group=group).enqueue_many([((label, i), {}) for i in range(300)])
        await work.options(group=group).enqueue(label, 300)
        assert await q.cancel_jobs([j.id for j in jobs]) == 300
        got = await q.reserve(1)
        assert [r.args for r in got] == [(label, 300)]


async def test_cancelled_jobs_are_not_counted_as_queued(app: App) -> None:
    """...in counts() and group_counts(), and a group left with none is not listed."""
    work = define(app)
    q = app.queue()
    jobs = await work.options(group="A").enqueue_many([(("A", i), {}) for i in range(5)])
    gone = await work.options(group="C").enqueue("C", 0)
    await work.options(group="B").enqueue("B", 0)
    assert await q.cancel_jobs([j.id for j in jobs[:3]] + [gone.id]) == 4
    assert await q.group_counts() == {"A": 2, "B": 1}
    assert (await q.counts())["queued"] == 3


async def test_a_burst_worker_drains_a_limited_group(app: App) -> None:
    """Regression: a burst worker stopped while its own unsent acks still held the group's
    slots, so the group looked full and 8 of 10 jobs were left queued."""
    work = define(app)
    q = app.queue()
    await q.set_group_limit("L", 2)
    await fill(work, "L", 10)
    worker = Worker(app, concurrency=10, burst=True)
    await asyncio.wait_for(worker.run(), 20)
    assert worker.completed == 10
    assert await q.counts() == {"scheduled": 0, "queued": 0, "active": 0, "failed": 0}


# ---------------------------------------------------------------------------- rate limits


async def claim_windows(
    redis: Redis, q: Queue, got: Sequence[Reservation], lease_ms: int, period_ms: int
) -> Counter[int]:
    """How many of ``got`` were claimed in each rate window (the claim's server time is its
    lease deadline minus the lease)."""
    pipe = redis.pipeline(transaction=False)
    for r in got:
        pipe.zscore(q._keys.active, r.id)
    deadlines = await pipe.execute()
    assert None not in deadlines
    return Counter((int(d) - lease_ms) // period_ms for d in deadlines)


async def reserve_for(q: Queue, seconds: float, *, n: int = 20) -> list[Reservation]:
    """Everything a consumer gets in ``seconds`` of ``reserve(n, wait=...)`` (long leases)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    got: list[Reservation] = []
    while (left := end - loop.time()) > 0:
        got += await q.reserve(n, lease=60, wait=left)
    return got


async def test_a_group_rate_limit_counts_starts_per_window(app: App, redis: Redis) -> None:
    work = define(app)
    q = app.queue()
    n, period = 5, 0.4
    await q.set_rate_limit(n, period, group="R")
    await fill(work, "R", 200)
    await fill(work, "free", 30)
    got = await reserve_for(q, 1.5)
    r_jobs = [r for r in got if r.args[0] == "R"]
    assert len([r for r in got if r.args[0] == "free"]) == 30  # other lanes are not held back
    windows = await claim_windows(redis, q, r_jobs, 60_000, int(period * 1000))
    assert max(windows.values()) <= n, windows
    # the windows strictly inside the run are used to the full
    inner = sorted(windows)[1:-1]
    assert len(inner) >= 2, windows
    assert all(windows[w] == n for w in inner), windows
    assert seqs(r_jobs) == list(range(len(r_jobs)))  # FIFO across windows


async def test_a_queue_rate_limit_covers_every_lane(app: App, redis: Redis) -> None:
    work = define(app)
    q = app.queue()
    n, period = 7, 0.4
    await q.set_rate_limit(n, period)
    await fill(work, "none", 100, group=None)
    await fill(work, "A", 100)
    got = await reserve_for(q, 1.5)
    windows = await claim_windows(redis, q, got, 60_000, int(period * 1000))
    assert max(windows.values()) <= n, windows
    inner = sorted(windows)[1:-1]
    assert len(inner) >= 2, windows
    assert all(windows[w] == n for w in inner), windows
    assert {"none", "A"} <= set(labels(got))
    await q.set_rate_limit(None)  # cleared: everything left at once
    assert len(await q.reserve(500)) == 200 - len(got)


async def test_a_default_group_rate_limits_each_group_on_its_own(app: App, redis: Redis) -> None:
    work = define(app)
    q = app.queue()
    await q.set_default_group_rate_limit(3, 30)
    await q.set_rate_limit(5, 30, group="own")
    for g in ("A", "B", "own"):
        await fill(work, g, 20)
    await fill(work, "none", 4, group=None)
    got = await q.reserve(100)
    assert Counter(labels(got)) == {"A": 3, "B": 3, "own": 5, "none": 4}
    assert await q.reserve(100) == []
    # the groups wait for their next window, parked (not in the ring)
    assert await redis.zcard(q._keys.ring) == 0
    assert await redis.zcard(q._keys.gwait) == 3
    await q.set_default_group_rate_limit(None)
    assert Counter(labels(await q.reserve(100))) == {"A": 17, "B": 17}


# ---------------------------------------------------------------------------- pause / resume


async def test_pause_and_resume_the_queue_from_another_process(redis_url: str, app: App) -> None:
    work = define(app)
    q = app.queue()
    await fill(work, "A", 5)
    await fill(work, "none", 5, group=None)
    async with open_app(redis_url, prefix=app.prefix) as other:
        await other.queue().pause()
        assert await q.reserve(10) == []
        await fill(work, "B", 5)  # enqueueing still works while paused
        assert await q.counts() == {"scheduled": 0, "queued": 15, "active": 0, "failed": 0}

        waiter = asyncio.create_task(q.reserve(20, wait=30))
        done, _ = await asyncio.wait({waiter}, timeout=0.2)  # an observation window
        assert not done, "reserve returned while the queue was paused"
        loop = asyncio.get_running_loop()
        resumed = loop.time()
        await other.queue().resume()
        got = await asyncio.wait_for(waiter, 35)
        assert loop.time() - resumed < PROMPT_S  # woken, not timed out
        got += await q.reserve(20)
        assert Counter(labels(got)) == {"A": 5, "B": 5, "none": 5}


async def test_pause_and_resume_one_group_from_another_process(
    redis_url: str, app: App, redis: Redis
) -> None:
    work = define(app)
    q = app.queue()
    await fill(work, "A", 5)
    await fill(work, "B", 5)
    (running,) = await q.reserve(1, lease=60)
    assert running.args[0] == "A"
    async with open_app(redis_url, prefix=app.prefix) as other:
        await other.queue().pause("A")
        got = await q.reserve(20, lease=60)
        assert labels(got) == ["B"] * 5
        await work.options(group="A").enqueue("A", 5)  # into the paused group: held too
        assert await q.reserve(20) == []
        assert await q.group_counts() == {"A": 5}
        await q.complete(running)  # a job already running finishes normally
        assert await q.reserve(20) == []
        assert await redis.zcard(q._keys.ring) == 0  # parked, not polled

        waiter = asyncio.create_task(q.reserve(20, lease=60, wait=30))
        done, _ = await asyncio.wait({waiter}, timeout=0.2)  # an observation window
        assert not done, "reserve returned while the group was paused"
        loop = asyncio.get_running_loop()
        resumed = loop.time()
        await other.queue().resume("A")
        got = await asyncio.wait_for(waiter, 35)
        assert loop.time() - resumed < PROMPT_S  # woken, not timed out
        got += await q.reserve(20, lease=60)
        assert sorted(seqs(got)) == [1, 2, 3, 4, 5]
        assert labels(got) == ["A"] * 5


async def commands_of(redis: Redis, name: str) -> int:
    """Commands the server has run for the connections called ``name`` (those its scripts
    ran included)."""
    return sum(int(c["tot-cmds"]) for c in await clients_named(redis, name))


async def claims_while_waiting(url: str, prefix: str, redis: Redis, wait: float) -> float:
    """How many claims a consumer (another App) makes during ``reserve(1, wait=wait)`` that
    finds nothing, measured by the server in units of what one claim costs it."""
    name = f"consumer-{prefix}"
    async with open_app(url, prefix=prefix, redis_options={"client_name": name}) as c:
        start = await commands_of(redis, name)
        assert await c.queue().reserve(1) == []  # one claim, to learn what one costs
        one = await commands_of(redis, name) - start
        start += one
        assert await c.queue().reserve(1, wait=wait) == []
        return (await commands_of(redis, name) - start) / one


async def test_a_consumer_waiting_on_a_paused_queue_does_not_poll(
    redis_url: str, app: App, redis: Redis
) -> None:
    """A consumer blocked while the queue is paused sits in BLPOP until resume; it does not
    claim again and again (DESIGN: no CPU or Redis load while idle)."""
    work = define(app)
    await fill(work, "A", 5)
    await app.queue().pause()
    claims = await claims_while_waiting(redis_url, app.prefix, redis, 0.5)
    assert claims <= 5, f"about {claims:.0f} claims in 0.5 s of waiting while paused"


async def test_a_consumer_waiting_for_the_queue_rate_window_does_not_poll(
    redis_url: str, app: App, redis: Redis
) -> None:
    work = define(app)
    await fill(work, "none", 5, group=None)
    # windows are fixed (aligned to the server's clock): with 30 s ones, a run that began in
    # a window's last second saw the next one open during its wait; an hour makes that rare
    await app.queue().set_rate_limit(1, 3600)
    assert len(await app.queue().reserve(5)) == 1
    claims = await claims_while_waiting(redis_url, app.prefix, redis, 0.5)
    assert claims <= 5, f"about {claims:.0f} claims in 0.5 s of waiting for the rate window"


# ---------------------------------------------------------------------------- cost and counts


async def timed_claim(q: Queue) -> float:
    """Seconds one one-job claim took; it must return a job of the group ``free``."""
    t0 = time.perf_counter()
    got = await q.reserve(1, lease=60)
    elapsed = time.perf_counter() - t0
    assert labels(got) == ["free"]
    return elapsed


@pytest.mark.no_cover  # a test of scale: coverage paused (tests/conftest.py, "Coverage")
async def test_claim_cost_does_not_grow_with_blocked_groups(app: App, redis: Redis) -> None:
    """2,000 groups with queued jobs that cannot run (1,000 at their limit, 1,000 paused)
    are parked out of the ring: a claim never looks at them, so it costs what it costs with
    none, and never returns their jobs. Claims on a queue without them and on the crowded one
    alternate, so a change in the machine's load touches both alike."""
    work = define(app)
    clean, crowded = app.queue("clean"), app.queue("crowded")
    for q in (clean, crowded):
        await q.set_group_limit(None, 1)
        await q.set_group_limit("free", 100_000)

    limited = [f"limited-{i}" for i in range(1000)]
    paused = [f"paused-{i}" for i in range(1000)]
    await asyncio.gather(*(fill(work, g, 2, queue="crowded") for g in limited))
    assert Counter(labels(await crowded.reserve(1000, lease=60))) == dict.fromkeys(limited, 1)
    await asyncio.gather(*(crowded.pause(g) for g in paused))
    await asyncio.gather(*(fill(work, g, 1, queue="crowded") for g in paused))
    counts = await crowded.group_counts()
    assert len(counts) == 2000
    assert set(counts.values()) == {1}

    for q in (clean, crowded):
        await fill(work, "free", 300, queue=q.name)
    assert await redis.zcard(crowded._keys.ring) == 1  # only the free group can be served
    times: dict[str, list[float]] = {"clean": [], "crowded": []}
    for i in range(300):
        for q in (clean, crowded):
            elapsed = await timed_claim(q)
            if i >= 50:  # the first ones warm up connections and caches
                times[q.name].append(elapsed)
    base, loaded = statistics.median(times["clean"]), statistics.median(times["crowded"])
    assert loaded < 3 * base, f"{loaded * 1e6:.0f} us vs {base * 1e6:.0f} us per claim"
    assert await crowded.reserve(100) == []
    assert await crowded.counts() == {"scheduled": 0, "queued": 2000, "active": 1300, "failed": 0}
    await drop_keys(redis, app.prefix)


async def test_counts_include_every_lane_and_every_parked_group(app: App, redis: Redis) -> None:
    work = define(app)
    q = app.queue()
    await q.set_group_limit("limited", 1)
    await q.set_rate_limit(1, 30, group="rated")
    await fill(work, "none", 4, group=None)
    await work.options(priority=9).enqueue("none", 4)
    await fill(work, "limited", 3)
    await fill(work, "rated", 3)
    await fill(work, "paused", 2)
    await fill(work, "plain", 2)
    await work.options(group="later", delay=60).enqueue("later", 0)
    await q.pause("paused")
    got = await q.reserve(100, lease=60)
    assert Counter(labels(got)) == {"none": 5, "limited": 1, "rated": 1, "plain": 2}
    assert await q.group_counts() == {"limited": 2, "rated": 2, "paused": 2}
    assert await q.counts() == {"scheduled": 1, "queued": 6, "active": 9, "failed": 0}
    states = Counter((await check_invariants(redis, q._keys)).values())
    assert states == {"active": 9, "queued": 6, "scheduled": 1}


async def test_a_grouped_job_keeps_its_group_through_retry_and_delay(
    app: App, redis: Redis
) -> None:
    work = define(app)
    q = app.queue()
    await q.set_group_limit("L", 1)
    job = await work.options(group="L", delay=0.2).enqueue("L", 9)
    await fill(work, "L", 1)
    (first,) = await q.reserve(5, lease=60)
    assert first.args == ("L", 0)
    assert first.id != job.id
    assert await q.reserve(5, wait=0.5) == []  # the delayed one fell due, but L is full
    await q.complete(first)
    (second,) = await q.reserve(5, lease=60, wait=2)
    assert second.id == job.id
    assert await q.fail(second, "again", delay=0.1) is True
    got = await q.reserve(5, lease=60, wait=2)
    assert [(r.id, r.attempt) for r in got] == [(job.id, 2)]
    assert await job.state() is JobState.ACTIVE
    await check_invariants(redis, q._keys)


# ---------------------------------------------------------------------- found by the benchmark


async def test_stop_is_prompt_when_it_comes_during_a_claim(app: App) -> None:
    """stop() while the fetch loop's claim is in flight (held at a gate): the claim finds
    nothing, and the loop must leave instead of blocking in BLPOP for idle_block. (Regression,
    found by benchmarks/groups.py: one stop in five took 5 s.)"""
    scripts = instrument(app)
    gate = scripts.gates["claim"] = Gate()
    worker = Worker(app, concurrency=10, idle_block=5.0)
    runner = asyncio.create_task(worker.run())
    await asyncio.wait_for(gate.entered.wait(), 5)  # the first claim is in flight
    loop = asyncio.get_running_loop()
    start = loop.time()
    worker.stop()
    await wait_until(lambda: stopping(worker), what="shutdown to begin")
    gate.open()
    done, _ = await asyncio.wait([runner], timeout=10)
    assert done, "the worker did not stop within 10 s"
    stopped = loop.time() - start
    assert stopped < 2.0, f"stop() took {stopped:.1f} s"
