"""Acks ride on the next claim (issue 26, point 1): while a queue's claim is in flight the acker
does not send that queue's completions on their own; the fetch loop takes them along with the
claim it sends as soon as the one in flight returns, or wakes the acker when it does not claim
at once. Every job is acknowledged exactly once either way.

The claims are held in flight by a gate in front of the real scripts (``support.instrumented``:
the server runs them unchanged): that makes "a claim is in flight while jobs finish" certain
rather than a matter of timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aioqueue import App, Worker

from .support.instrumented import Gate, InstrumentedScripts, instrument, stopping
from .support.waiting import wait_until


async def until(cond: Callable[[], bool], what: str) -> None:
    await wait_until(cond, timeout=30.0, what=what)


async def let_everyone_run() -> None:
    """Let every ready task (the acker included) run as often as it wants to: no wall time."""
    for _ in range(20):
        await asyncio.sleep(0)


def acked(scripts: InstrumentedScripts) -> list[str]:
    return [i for _, ids in scripts.acks for i in ids]


async def test_acks_made_while_a_claim_is_in_flight_ride_on_the_next_claim(app: App) -> None:
    release = {f"a{i}": asyncio.Event() for i in range(1, 5)}
    finished: list[str] = []

    @app.task(name="work")
    async def work(name: str) -> None:
        if name in release:
            await release[name].wait()
        finished.append(name)

    # a1..a4 first (FIFO): the first claim takes them, b1..b4 come after
    names = [f"a{i}" for i in range(1, 5)] + [f"b{i}" for i in range(1, 5)]
    jobs = await work.enqueue_many([((n,), {}) for n in names])
    ids = {j.id: n for j, n in zip(jobs, names, strict=True)}
    scripts = instrument(app)
    gate = scripts.gates["complete_claim"] = Gate()  # the first claim carrying acks waits
    worker = Worker(app, concurrency=4, prefetch=0, max_batch=4, burst=True)
    run = asyncio.create_task(worker.run())
    try:
        await until(lambda: len(worker.slots.running) == 4, "a1..a4 running")
        release["a1"].set()  # a slot frees: a claim goes out carrying a1, and waits at the gate
        await asyncio.wait_for(gate.entered.wait(), 30)
        assert [(k, [ids[i] for i in a]) for k, a in scripts.acks] == [
            ("claim", []),
            ("complete_claim", ["a1"]),
        ]
        release["a2"].set()
        release["a3"].set()
        await until(lambda: {"a2", "a3"} <= set(finished), "a2 and a3 ran")
        await let_everyone_run()
        assert scripts.calls["complete"] == 0, "the acker sent acks while a claim was in flight"
        gate.open()  # that claim returns b1; slots are free, so a claim follows at once...
        await until(lambda: len(scripts.acks) >= 3, "the claim after it")
        kind, carried = scripts.acks[2]
        assert (kind, sorted(ids[i] for i in carried)) == ("complete_claim", ["a2", "a3"])
        release["a4"].set()
        await asyncio.wait_for(run, 60)
    finally:
        for e in release.values():
            e.set()
        gate.open()
        if not run.done():
            worker.stop()
            await run
    assert sorted(acked(scripts)) == sorted(ids), "each job acknowledged exactly once"
    assert (await app.queue().stats())["completed"] == 8
    assert (await app.queue().counts())["active"] == 0


async def test_acks_held_for_a_claim_go_with_the_acker_when_no_claim_follows(app: App) -> None:
    """A claim in flight while a job finishes, and no claim right after it (the queue is empty,
    the worker keeps running): the acker sends the ack once that claim returns, so a job's
    result does not wait for the next job to come."""
    release = asyncio.Event()
    finished: list[str] = []

    @app.task(name="work")
    async def work(name: str) -> None:
        if name == "slow":
            await release.wait()
        finished.append(name)

    slow = await work.enqueue("slow")
    scripts = instrument(app)
    worker = Worker(app, concurrency=4, prefetch=0, max_batch=4)
    run = asyncio.create_task(worker.run())
    gate = Gate()
    try:
        await until(lambda: bool(worker.slots.running), "the slow job started")
        # the next claim of either kind waits at the gate (one gate: one call held)
        scripts.gates["claim"] = scripts.gates["complete_claim"] = gate
        fast = await work.enqueue("fast")  # handed over or claimed: a claim follows
        await asyncio.wait_for(gate.entered.wait(), 30)
        release.set()
        await until(lambda: "slow" in finished, "the slow job ran")
        await let_everyone_run()
        assert slow.id not in acked(scripts)  # held for the claim in flight
        gate.open()
        await slow.result(timeout=30)
        await fast.result(timeout=30)
        assert await slow.state() == "completed"
        assert await fast.state() == "completed"
        assert acked(scripts).count(slow.id) == 1
    finally:
        release.set()
        gate.open()
        worker.stop()
        await run


async def test_a_busy_worker_keeps_two_claims_in_flight_and_loses_nothing(app: App) -> None:
    """While the queue has more than a claim asks for, the fetch loop sends the next claim
    before the reply to the one in flight is in (so the server works on one while the worker
    reads the other): two claims in flight, never more, each job run and acknowledged once."""
    runs: list[int] = []

    @app.task(name="work")
    async def work(i: int) -> None:
        runs.append(i)

    n = 600
    jobs = await work.enqueue_many([{"i": i} for i in range(n)])
    scripts = instrument(app)
    worker = Worker(app, concurrency=30, prefetch=0, max_batch=10, burst=True)
    await asyncio.wait_for(worker.run(), 120)
    assert sorted(runs) == list(range(n))
    assert scripts.most_claims_in_flight == 2
    assert sorted(acked(scripts)) == sorted(j.id for j in jobs), "each acknowledged once"
    assert (await app.queue().stats())["completed"] == n
    counts = await app.queue().counts()
    assert (counts["active"], counts["queued"]) == (0, 0)


async def test_a_stop_with_two_claims_in_flight_gives_back_what_they_leased(app: App) -> None:
    """A forced stop while two claims are in flight, one of them held after the server ran it:
    the jobs that claim leased go back to the queue as soon as its reply is in (none waits for
    its lease to run out), and the worker stops."""
    hold = asyncio.Event()
    started: list[int] = []

    @app.task(name="work")
    async def work(i: int) -> None:
        started.append(i)
        if i >= 10:
            await hold.wait()

    n = 200
    await work.enqueue_many([{"i": i} for i in range(n)])
    scripts = instrument(app)
    # the third claim (the busy loop's first two are in flight by then) is held after it ran
    gate = scripts.gates["claim"] = scripts.gates["complete_claim"] = Gate(after=True, skip=2)
    worker = Worker(app, concurrency=30, prefetch=0, max_batch=10)
    run = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(gate.entered.wait(), 30)
        assert gate.used
        assert scripts.most_claims_in_flight == 2
        worker.stop(force=True)
        await until(lambda: stopping(worker), "the stop to begin")
        gate.open()
        await asyncio.wait_for(run, 60)
    finally:
        hold.set()
        gate.open()
        if not run.done():
            worker.stop(force=True)
            await run
    counts = await app.queue().counts()
    stats = await app.queue().stats()
    assert counts["active"] == 0, "a lease left behind by a claim nobody took"
    assert counts["queued"] + stats["completed"] == n


async def test_a_busy_worker_starts_its_jobs_in_the_order_the_server_leased_them(
    app: App,
) -> None:
    """Two claims in flight go over one connection of their own (``OrderedLine``): the server
    runs them in the order the worker takes their replies, so jobs start in the queue's order
    (over two pooled connections, a claim that had to connect first could be overtaken by the
    one behind it: the jobs would start out of order, and the registry's count of the leases
    started would name the wrong ones)."""
    ran: list[int] = []

    @app.task(name="work")
    async def work(i: int) -> None:
        ran.append(i)

    n = 300
    await work.enqueue_many([{"i": i} for i in range(n)])
    scripts = instrument(app)
    worker = Worker(app, concurrency=4, prefetch=0, max_batch=2, burst=True)
    await asyncio.wait_for(worker.run(), 120)
    assert scripts.most_claims_in_flight == 2
    assert ran == list(range(n))


async def test_an_ordered_line_writes_and_reads_in_the_order_of_its_calls(app: App) -> None:
    """The second call waits behind the first even when the first has to connect: a blocking
    pop sent first is answered (empty, at its timeout) before the push sent after it runs."""
    from aioqueue._store.hot import ordered_line

    line = ordered_line(app.redis)
    assert line is not None
    key = f"{app.prefix}:line-test"
    try:
        first = asyncio.ensure_future(line.call(("BLPOP", key, "0.2"), 10.0))
        second = asyncio.ensure_future(line.call(("RPUSH", key, "v"), 10.0))
        assert await first is None  # the push was not run before it: nothing to pop
        assert await second == 1
        assert await app.redis.lpop(key) == b"v"
    finally:
        await line.close()
