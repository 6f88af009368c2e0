"""The worker side's cost per job (issue 17): a claim over fair groups serves the ring's next
lanes from one read and leases them in one pass, in exactly the turns that serving one lane at a
time gives; a finishing job of a group whose lane is in the ring costs one lookup; job ids are
short (each queued job stores its id twice); records written by the previous version still run.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import pytest
from redis.asyncio import Redis

from aioqueue import App, EmbeddedServer, Queue, Reservation, Task
from aioqueue._model.checks import _Ids, new_job_id

Work = Task[[str, int], None]


def define(app: App) -> Work:
    @app.task(name="work")
    async def work(label: str, seq: int) -> None:
        return None

    return work


async def fill(
    work: Work, label: str, n: int, *, group: str | None = "", queue: str | None = None
) -> None:
    """``n`` jobs ``(label, 0..n-1)`` in lane ``label`` (``group=None``: the default lane)."""
    opts = work.options(group=label if group == "" else group, queue=queue)
    await opts.enqueue_many([((label, i), {}) for i in range(n)])


def labels(rs: Sequence[Reservation]) -> list[str]:
    return [f"{r.args[0]}{r.args[1]}" for r in rs]


async def reserve_each(q: Queue, n: int) -> list[Reservation]:
    """``n`` claims of one job each: the order of serving one lane at a time."""
    out: list[Reservation] = []
    for _ in range(n):
        out += await q.reserve(1, lease=60)
    return out


# ---------------------------------------------------------------------------- the ring


async def fill_lanes(work: Work, queue: str | None = None) -> None:
    await fill(work, "A", 5, queue=queue)
    await fill(work, "B", 2, queue=queue)
    await fill(work, "C", 1, queue=queue)
    await fill(work, "D", 2, group=None, queue=queue)  # the default lane joins the ring last


ROUND_ROBIN = ["A0", "B0", "C0", "D0", "A1", "B1", "D1", "A2", "A3", "A4"]


async def test_one_claim_takes_the_turns_one_job_claims_take(app: App) -> None:
    """Lanes read together and moved back together: the same order as one claim per job (a
    lane that empties leaves the ring, a lane alone gives all it has at once)."""
    work = define(app)
    q = app.queue()
    await fill_lanes(work)
    assert labels(await q.reserve(50, lease=60)) == ROUND_ROBIN
    assert await q.reserve(10) == []

    other = app.queue("other")
    await fill_lanes(work, "other")
    assert labels(await reserve_each(other, 12)) == ROUND_ROBIN


async def test_claims_of_a_few_jobs_keep_the_turns_across_calls(app: App) -> None:
    """A claim for fewer jobs than lanes serves the next lanes and sends them to the back; the
    next claim goes on from there."""
    work = define(app)
    q = app.queue()
    await fill_lanes(work)
    got: list[Reservation] = []
    for n in (3, 2, 1, 3, 5):
        got += await q.reserve(n, lease=60)
    assert labels(got) == ROUND_ROBIN


async def test_limits_read_together_still_hold_within_one_claim(app: App) -> None:
    """The running counts of the lanes due are read once per read of the ring: a group at its
    limit is parked in the same claim, and the next claim sees what completing one freed."""
    work = define(app)
    q = app.queue()
    await q.set_group_limit(None, 2)
    for g in "ABC":
        await fill(work, g, 5)
    first = await q.reserve(50, lease=60)
    assert labels(first) == ["A0", "B0", "C0", "A1", "B1", "C1"]
    assert await q.reserve(10) == []
    await q.complete(first[1])  # B0
    assert labels(await q.reserve(10, lease=60)) == ["B2"]
    await q.set_group_limit("C", 3)
    assert labels(await q.reserve(10, lease=60)) == ["C2"]
    assert await q.reserve(10) == []


# ---------------------------------------------------------------------------- commands per job


@pytest.fixture
async def private() -> AsyncIterator[Redis]:
    """A private server (no other test's commands in its INFO commandstats)."""
    with EmbeddedServer(appendonly=False) as server:
        client = Redis.from_url(server.url)
        try:
            yield client
        finally:
            await client.aclose()


async def commands(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    return sum(
        int(v["calls"])
        for k, v in stats.items()
        if not k.startswith(("cmdstat_eval", "cmdstat_info", "cmdstat_config", "cmdstat_script"))
    )


@asynccontextmanager
async def grouped(private: Redis, groups: int, limit: int | None) -> AsyncIterator[Queue]:
    """An App on the private server whose default queue holds 4 jobs in each of ``groups``
    groups (``limit``: the queue's default group limit)."""
    url = private.connection_pool.connection_kwargs
    async with App(f"redis://{url['host']}:{url['port']}") as app:
        work = define(app)
        q = app.queue()
        if limit:
            await q.set_group_limit(None, limit)
        for g in range(groups):
            await fill(work, f"g{g:03d}", 4)
        yield q


@pytest.mark.parametrize("limit", [None, 5])
async def test_a_job_of_a_group_costs_a_bounded_number_of_commands(
    private: Redis, limit: int | None
) -> None:
    """Claiming jobs of 100 groups 10 a claim, completing each with its own call: about 20
    Redis commands per job inside the scripts (30 before the ring was read in one go and a
    finished job's group checked in one lookup; 31 with a limit), and 2 more since the
    dashboard's trends count each completion in their minute and hour buckets
    (lib/trends.lua: a worker's acks count a whole batch in those 2, a pull-API completion
    is a batch of one)."""
    async with grouped(private, 100, limit) as q:
        before = await commands(private)
        done = 0
        while held := await q.reserve(10, lease=60):
            await asyncio.gather(*(q.complete(r) for r in held))
            done += len(held)
        per_job = (await commands(private) - before) / done
    assert done == 400
    assert per_job <= 26, per_job


@pytest.mark.parametrize("limit", [None, 3])
async def test_finished_jobs_of_groups_look_at_their_lanes_only_under_a_limit(
    private: Redis, limit: int | None
) -> None:
    """A freed slot matters only to a lane a concurrency limit held out of the ring: a complete
    call for the jobs of 10 groups looks up none of their lanes without a limit (it looked up
    each one before), and with a limit it puts each group held at it back in the ring."""
    async with grouped(private, 10, limit) as q:
        held = await q.reserve(30, lease=60)  # 3 of each group: 1 left in each lane
        assert len(held) == 30
        ring = q._keys.ring
        assert await private.zcard(ring) == (0 if limit else 10)  # at the limit: out of it
        before = (await private.info("commandstats")).get("cmdstat_zscore", {"calls": 0})
        done = await q._scripts.complete([(r.id, r.token, b"null", 60_000) for r in held])
        assert all(o.value == "ok" for o in done), done
        after = (await private.info("commandstats")).get("cmdstat_zscore", {"calls": 0})
        lookups = after["calls"] - before["calls"]
        assert await private.zcard(ring) == 10
        if limit:
            assert lookups >= 10
        else:
            assert lookups == 0


async def test_a_busy_claim_looks_at_no_lane_and_an_emptied_one_leaves_at_its_next_turn(
    private: Redis,
) -> None:
    """A claim that finds more lanes in the ring than it can serve does not ask whether each
    lane it served is now empty (an EXISTS a job in a busy drain of fair groups): a lane
    that gave its last job stays in the ring until its next turn finds it empty. A claim
    that can serve the whole ring looks, and leaves no empty lane behind."""
    url = private.connection_pool.connection_kwargs
    async with App(f"redis://{url['host']}:{url['port']}") as app:
        work = define(app)
        q = app.queue()
        for g in range(20):
            await fill(work, f"g{g:02d}", 1)
        ring = q._keys.ring

        async def exists_calls() -> int:
            stats = await private.info("commandstats")
            return int(stats.get("cmdstat_exists", {"calls": 0})["calls"])

        before = await exists_calls()
        first = await q.reserve(10, lease=60)
        assert labels(first) == [f"g{g:02d}0" for g in range(10)]
        # (one a claim, whether any group has settings of its own; none a lane: 10 before)
        assert await exists_calls() - before <= 1
        assert await private.zcard(ring) == 20  # 10 emptied lanes still in it
        rest = await q.reserve(100, lease=60)
        assert labels(rest) == [f"g{g:02d}0" for g in range(10, 20)]
        assert await private.zcard(ring) == 0
        assert await q.reserve(10) == []


# ---------------------------------------------------------------------------- ids, old records


def test_new_ids_are_short_letters_and_digits() -> None:
    ids = _Ids()
    first = ids.next()
    assert re.fullmatch(r"[0-9A-Za-z]{11}1", first), first
    assert ids.next() == first[:11] + "2"
    prefixes = set()
    for _ in range(200):
        ids.reseed()
        prefixes.add(ids.prefix)
        assert re.fullmatch(r"[0-9A-Za-z]{11}", ids.prefix), ids.prefix
    assert len(prefixes) == 200
    assert len(new_job_id()) <= 16  # until the 1,048,576th id of a process


async def test_a_record_written_by_the_previous_version_still_runs(app: App, redis: Redis) -> None:
    """Hand-written as the previous version stored a queued job: a 16-hex-digit id with a hex
    counter, and every field it wrote."""

    @app.task(name="add")
    async def add(a: int, b: int) -> int:
        return a + b

    q = app.queue()
    k = q._keys
    job_id = "9f86d081884c7d65" + "1a"
    now = int(time.time() * 1000)
    await redis.hset(
        k.job(job_id),
        mapping={"t": "add", "p": "[[2,3],{}]", "a": "0", "m": "3", "ct": str(now), "s": "queued"},
    )
    await redis.rpush(k.ready, job_id)
    await redis.zadd(k.ring, {"": await redis.incr(k.seq)})
    (r,) = await q.reserve(5, lease=60)
    assert (r.id, r.task, r.args, r.attempt, r.max_attempts) == (job_id, "add", (2, 3), 1, 3)
    await q.complete(r, 5)
    info = await q.job(job_id).info()
    assert (info.state.value, info.attempts, info.max_attempts) == ("completed", 1, 3)
    assert await q.job(job_id).result(timeout=5) == 5


@pytest.mark.parametrize("seed", range(6))
async def test_claims_of_any_size_give_the_order_of_one_job_claims(app: App, seed: int) -> None:
    """Random lanes (groups of random sizes and priorities, the default lane, a default group
    limit on half the seeds) queued alike on two queues: claims of random sizes on one give the
    jobs in the same order as claims of one job on the other."""
    rng = random.Random(seed)
    work = define(app)
    plan = []
    for i in range(rng.randint(3, 12)):
        label = f"g{i}" if rng.random() < 0.8 else None
        plan.append((label or f"d{i}", rng.randint(1, 6), label, rng.choice([None, 0, 5, -5])))
    limit = 2 if seed % 2 else None
    for queue in ("many", "one"):
        if limit:
            await app.queue(queue).set_group_limit(None, limit)
        for name, n, group, priority in plan:
            opts = work.options(group=group, priority=priority, queue=queue)
            await opts.enqueue_many([((name, k), {}) for k in range(n)])
    total = sum(n for _, n, _, _ in plan)
    many: list[Reservation] = []
    for _ in range(total + 1):
        many += await app.queue("many").reserve(rng.randint(1, 7), lease=60)
    one = await reserve_each(app.queue("one"), total + 1)
    assert labels(many) == labels(one)
    if not limit:
        assert len(one) == total
