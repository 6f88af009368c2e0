"""Fan-out / fan-in (DESIGN §3 item 9): batches of sub-jobs with an exactly-once callback,
streamed batches, failure policies, cancellation, per-batch limits, sub-jobs on other queues
(through the outbox), chains, waiting without polling, retention (I8).

In-process workers and the pull API against the real server; the worker processes killed with
``kill -9`` are in test_batch_crash.py. The tasks are those of ``tests.batchapp``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.connection import AbstractConnection

import aioqueue
import aioqueue._store.loader as loader
import aioqueue._store.scriptreads as scriptreads_module
import aioqueue._store.scripts as scripts_module
from aioqueue import (
    App,
    Batch,
    BatchCancelled,
    BatchFailed,
    BatchInfo,
    BatchNotFound,
    BatchState,
    ConfigurationError,
    JobCancelled,
    JobState,
    LeaseLost,
    Queue,
    ResultTimeout,
    Worker,
)
from aioqueue._queue.leases import forward_outbox
from aioqueue._store.embedded import EmbeddedServer
from aioqueue._store.loader import SCRIPTS
from aioqueue._store.outcomes import FailMode, Outcome
from aioqueue._store.wire import use_functions

from .batchapp import BatchTasks, Keys, register
from .support.apps import drop_keys, open_app, unique_prefix
from .support.invariants import check_invariants
from .support.proxy import ReplyDropProxy
from .support.server import clients_named, server_ms, text
from .support.waiting import PROMPT_S, wait_until

# also on a local Valkey Cluster (tests/conftest.py)
pytestmark = pytest.mark.cluster

OTHER = "other"  # the queue of ``work_other``


# ---------------------------------------------------------------------------- fixtures
async def load_scripts(redis: Redis) -> None:
    """Make the server know every script before a test runs: a batch's first use on a server
    that knows enqueue.lua but not batch.lua loses the batch (see
    test_first_batch_on_a_server_that_does_not_know_the_batch_script)."""
    for script in SCRIPTS.values():
        await redis.script_load(script.source)


@pytest.fixture(autouse=True)
async def _scripts_loaded(redis: Redis) -> None:
    await load_scripts(redis)


@pytest.fixture
async def bapp(redis_url: str) -> AsyncIterator[App]:
    """An App with a short lease, so that maintenance (and the outbox, forwarded by workers'
    maintenance every lease/2 s) runs often."""
    async with open_app(redis_url, lease=1.0) as opened:
        yield opened


@pytest.fixture
def tasks(bapp: App) -> BatchTasks:
    return register(bapp, other_queue=OTHER)


@pytest.fixture(scope="module")
def quiet_server() -> Iterator[EmbeddedServer]:
    """A private server, so that its command statistics count only one test's commands."""
    with EmbeddedServer(appendonly=False) as server:
        yield server


# ---------------------------------------------------------------------------- helpers
async def runs(redis: Redis, keys: Keys) -> list[int]:
    """The argument of every finished sub-job body, in order."""
    return [int(v) for v in await redis.lrange(keys.runs, 0, -1)]


async def cb_count(redis: Redis, keys: Keys) -> int:
    return int(await redis.get(keys.cb_count) or 0)


async def cb_runs(redis: Redis, keys: Keys) -> list[dict[str, Any]]:
    """What each run of the callback found in ``results()``."""
    return [json.loads(v) for v in await redis.lrange(keys.cb_runs, 0, -1)]


def bkey(batch: Batch[Any]) -> str:
    return batch.queue._keys.batch(batch.id)


async def check_batch(
    redis: Redis, batch: Batch[Any], *, total: int, done: int, failed: int
) -> BatchInfo:
    """Batch invariants: the counters agree with the sets and hashes they summarise. Every
    member of :seen (outcomes counted once) is a sub-job of :all; :res holds one result per
    success, :err one error per failure, and nothing is counted twice."""
    info = await batch.info()
    bk = bkey(batch)
    members = {text(m) for m in await redis.zrange(bk + ":all", 0, -1)}
    seen = {text(m) for m in await redis.smembers(bk + ":seen")}
    res = {text(m) for m in await redis.hkeys(bk + ":res")}
    err = {text(m) for m in await redis.hkeys(bk + ":err")}
    assert (info.total, info.done, info.failed) == (total, done, failed), info
    assert len(members) == total, f"{len(members)} members for total {total}"
    assert seen <= members, f"counted outcomes of non-members: {seen - members}"
    assert len(seen) == done + failed, f"{len(seen)} outcomes counted, {done + failed} expected"
    assert res | err == seen, "each counted outcome has a result or an error"
    assert not res & err, "no outcome has both a result and an error"
    assert (len(res), len(err)) == (done, failed)
    return info


async def drain(app: App, queues: list[str] | None = None) -> None:
    """Run every runnable job of ``queues`` in-process until they are empty."""
    await Worker(app, queues=queues, concurrency=20, burst=True, idle_block=0.2).run()


def ready_ids(values: list[Any]) -> list[str]:
    return [text(v) for v in values]


async def reserve_all(queue: Queue, n: int, **kwargs: Any) -> list[aioqueue.Reservation]:
    got = await queue.reserve(n, **kwargs)
    assert len(got) == n, f"reserved {len(got)} of {n}"
    return got


async def evalsha_calls(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("fcall", "evalsha"))


# ---------------------------------------------------------------------------- fan-out
async def test_an_all_at_once_batch_is_one_round_trip(
    quiet_server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 1234  # three enqueue calls of at most 500, plus open and seal, pipelined
    observer = Redis.from_url(quiet_server.url, socket_timeout=None)
    try:
        await load_scripts(observer)
        async with open_app(quiet_server.url) as app:
            t = register(app)
            writes = 0
            send = AbstractConnection.send_packed_command

            async def counting_send(self: AbstractConnection, *args: Any, **kwargs: Any) -> None:
                nonlocal writes
                writes += 1
                await send(self, *args, **kwargs)

            before = await evalsha_calls(observer)
            monkeypatch.setattr(AbstractConnection, "send_packed_command", counting_send)
            batch = await app.batch(
                [t.work.call(i) for i in range(n)], on_complete=t.collect.call()
            )
            monkeypatch.undo()
            calls = await evalsha_calls(observer) - before

            assert writes == 1, f"creating a batch wrote to the server {writes} times"
            assert calls == 2 + math.ceil(n / 500), f"{calls} script calls for {n} sub-jobs"
            info = await check_batch(observer, batch, total=n, done=0, failed=0)
            assert info.sealed
            assert (info.state, info.pending) == (BatchState.OPEN, n)
            assert batch.callback is not None
            assert await batch.callback.state() is JobState.WAITING
            q = app.queue()
            states = await check_invariants(observer, q._keys)
            assert sorted(states.values()) == ["queued"] * n + ["waiting"]
            # the sub-jobs are queued in the order given, and each names its batch
            ready = ready_ids(await observer.lrange(q._keys.ready, 0, -1))
            members = [text(m) for m in await observer.zrange(bkey(batch) + ":all", 0, -1)]
            assert len(ready) == n
            assert ready == members
            assert {text(await observer.hget(q._keys.job(ready[0]), "b"))} == {batch.id}
    finally:
        await observer.aclose()


async def test_the_callback_runs_once_with_results_in_add_order_and_failures_listed(
    bapp: App, tasks: BatchTasks, redis: Redis
) -> None:
    t = tasks
    calls = [
        t.work.call(1),
        t.maybe_fail.call(-2),
        t.work.call(3),
        t.maybe_fail.call(4),
        t.maybe_fail.call(-5),
        t.work.call(6),
    ]
    batch = await bapp.batch(calls, on_complete=t.collect.call())
    assert batch.callback is not None
    async with Worker(bapp, concurrency=10):
        info = await batch.wait(timeout=20)
        assert await batch.callback.result(timeout=20) == {"ok": 4, "failed": 2}
    assert info.state is BatchState.COMPLETED
    await check_batch(redis, batch, total=6, done=4, failed=2)
    assert await cb_count(redis, t.keys) == 1
    (summary,) = await cb_runs(redis, t.keys)
    members = [text(m) for m in await redis.zrange(bkey(batch) + ":all", 0, -1)]
    assert summary["batch"] == batch.id
    assert len(members) == 6
    assert summary["order"] == members  # every outcome, in add order
    assert summary["values"] == [10, 30, 40, 60]
    assert summary["errors"] == ["ValueError", "ValueError"]
    items = await batch.results()
    assert [i.ok for i in items] == [True, False, True, True, False, True]
    failed = [i for i in items if not i.ok]
    assert all(i.error is not None and "negative input" in i.error.message for i in failed)
    assert sorted(await runs(redis, t.keys)) == [1, 3, 4, 6]


async def test_a_streamed_batch_fires_only_after_it_is_sealed(
    bapp: App, tasks: BatchTasks, redis: Redis
) -> None:
    t = tasks
    batch = await bapp.batch(on_complete=t.collect.call())
    assert batch.callback is not None
    info = await batch.info()
    assert (info.total, info.done, info.sealed, info.state) == (0, 0, False, BatchState.OPEN)
    first = await batch.add(t.work.call(1), t.work.call(2))
    second = await batch.add_many(t.work.call(i) for i in range(3, 6))
    assert (await batch.info()).total == 5
    async with Worker(bapp, concurrency=4):

        async def done(n: int) -> bool:
            return (await batch.info()).done == n

        await wait_until(lambda: done(5), timeout=20, what="the first five sub-jobs to finish")
        # everything so far has finished, but the batch is not sealed: no callback yet
        info = await batch.info()
        assert (info.state, info.sealed, info.pending) == (BatchState.OPEN, False, 0)
        assert await batch.callback.state() is JobState.WAITING
        with pytest.raises(ResultTimeout):
            await batch.wait(timeout=0.3)
        third = await batch.add(t.work.call(6))
        await wait_until(lambda: done(6), timeout=20, what="the sixth sub-job to finish")
        assert await batch.callback.state() is JobState.WAITING
        assert await cb_count(redis, t.keys) == 0
        await batch.seal()
        info = await batch.wait(timeout=20)
        await batch.callback.result(timeout=20)
    assert (info.sealed, info.state) == (True, BatchState.COMPLETED)
    await check_batch(redis, batch, total=6, done=6, failed=0)
    assert await cb_count(redis, t.keys) == 1
    (summary,) = await cb_runs(redis, t.keys)
    assert summary["order"] == [j.id for j in (*first, *second, *third)]
    assert summary["values"] == [10, 20, 30, 40, 50, 60]
    with pytest.raises(ConfigurationError, match="sealed"):
        await batch.add(t.work.call(7))


async def test_an_empty_sealed_batch_fires_at_once(bapp: App, tasks: BatchTasks) -> None:
    batch = await bapp.batch([], on_complete=tasks.collect.call())
    assert batch.callback is not None
    info = await batch.wait(timeout=5)
    assert (info.total, info.state) == (0, BatchState.COMPLETED)
    assert await batch.callback.state() is JobState.QUEUED
    await drain(bapp)
    assert await batch.callback.result(timeout=5) == {"ok": 0, "failed": 0}


async def test_a_batch_without_a_callback_is_awaited(bapp: App, tasks: BatchTasks) -> None:
    batch: Batch[Any] = await bapp.batch([tasks.work.call(i) for i in range(5)])
    assert batch.callback is None
    async with Worker(bapp, concurrency=5):
        info = await batch.wait(timeout=20)
    assert (info.done, info.failed, info.total) == (5, 0, 5)
    assert [i.result for i in await batch.results()] == [0, 10, 20, 30, 40]


async def test_bad_batch_options_are_refused(bapp: App, tasks: BatchTasks) -> None:
    t = tasks
    with pytest.raises(ConfigurationError, match="on_failure"):
        await bapp.batch([t.work.call(1)], on_failure="sometimes")  # type: ignore[arg-type]
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ConfigurationError, match="concurrency"):
            await bapp.batch([t.work.call(1)], concurrency=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="group"):
        await bapp.batch([t.work.call(1)], concurrency=2, group="tenant")
    with pytest.raises(ConfigurationError, match="priority"):
        await bapp.batch([t.work.call(1)], priority=1000)
    with pytest.raises(ConfigurationError, match="concurrency limit"):
        await bapp.batch([t.work.call(1), t.work_other.call(2)], concurrency=2)
    with pytest.raises(TypeError):
        t.work.call(1, 2)  # type: ignore[call-arg]


async def test_an_unknown_batch_id_raises_batch_not_found(bapp: App, tasks: BatchTasks) -> None:
    missing: Batch[Any] = Batch(bapp.queue(), "nope")
    calls: list[Callable[[], Awaitable[object]]] = [
        missing.info,
        missing.wait,
        missing.results,
        missing.seal,
        missing.cancel,
        lambda: missing.add(tasks.work.call(1)),
    ]
    for call in calls:
        with pytest.raises(BatchNotFound, match="no batch 'nope'") as caught:
            await call()
        assert isinstance(caught.value, LookupError)
        assert caught.value.batch_id == "nope"
    assert await bapp.queue().counts() == {"scheduled": 0, "queued": 0, "active": 0, "failed": 0}
    # an existing batch with no sub-jobs yet is not "not found"
    empty: Batch[Any] = await bapp.batch()
    assert await empty.results() == []
    assert (await empty.info()).state is BatchState.OPEN


# ---------------------------------------------------------------------------- failure policies
async def test_policy_fail_fails_the_batch_and_cancels_the_callback(
    bapp: App, tasks: BatchTasks, redis: Redis
) -> None:
    t = tasks
    calls = [t.work.call(1), t.maybe_fail.call(-1), t.work.call(2)]
    batch = await bapp.batch(calls, on_complete=t.collect.call(), on_failure="fail")
    assert batch.callback is not None
    async with Worker(bapp, concurrency=4):
        with pytest.raises(BatchFailed) as caught:
            await batch.wait(timeout=20)
        assert (caught.value.info.failed, caught.value.info.total) == (1, 3)
        assert caught.value.info.state is BatchState.FAILED
        assert await batch.callback.state() is JobState.CANCELLED
        with pytest.raises(JobCancelled):
            await batch.callback.result(timeout=5)
    # the worker stopped with every queue empty: the cancelled callback was never handed out
    await check_batch(redis, batch, total=3, done=2, failed=1)
    assert await cb_count(redis, t.keys) == 0
    assert batch.callback.id not in ready_ids(await redis.lrange(bapp.queue()._keys.ready, 0, -1))
    assert sorted(await runs(redis, t.keys)) == [1, 2]


async def test_policy_ignore_is_deprecated_and_does_what_continue_does(
    bapp: App, tasks: BatchTasks, redis: Redis
) -> None:
    t = tasks
    calls = [t.maybe_fail.call(-1), t.work.call(2), t.maybe_fail.call(-3)]
    with pytest.warns(DeprecationWarning, match='"ignore" is deprecated') as warned:
        batch = await bapp.batch(calls, on_complete=t.collect.call(), on_failure="ignore")
    assert warned[0].filename == __file__  # points at the caller
    bk = bapp.queue()._keys.batch(batch.id)
    assert await redis.hget(bk, "policy") == b"continue"
    assert batch.callback is not None
    async with Worker(bapp, concurrency=4):
        info = await batch.wait(timeout=20)  # no BatchFailed
        assert await batch.callback.result(timeout=20) == {"ok": 1, "failed": 2}
    assert info.state is BatchState.COMPLETED
    await check_batch(redis, batch, total=3, done=1, failed=2)
    assert await cb_count(redis, t.keys) == 1


async def test_cancelling_a_batch(bapp: App, tasks: BatchTasks, redis: Redis) -> None:
    """Queued sub-jobs and the callback are cancelled, the running one finishes, the
    callback never runs and wait() raises BatchCancelled."""
    t = tasks
    key = f"{bapp.prefix}:t:release"
    batch = await bapp.batch(
        [t.hold.call(0, key), *(t.work.call(i) for i in range(1, 6))],
        on_complete=t.collect.call(),
    )
    assert batch.callback is not None
    members = [text(m) for m in await redis.zrange(bkey(batch) + ":all", 0, -1)]
    q = bapp.queue()
    async with Worker(bapp, concurrency=1) as worker:
        await wait_until(
            lambda: _started(redis, t.keys, 0), timeout=20, what="the held sub-job to start"
        )
        assert await batch.cancel() == 5
        with pytest.raises(BatchCancelled):
            await batch.wait(timeout=5)
        assert await batch.callback.state() is JobState.CANCELLED
        assert [await q.job(m).state() for m in members] == [JobState.ACTIVE] + [
            JobState.CANCELLED
        ] * 5
        assert await batch.cancel() == 0  # a second cancel does nothing
        await redis.set(key, 1)
        assert await q.job(members[0]).result(timeout=20) == 0
        # the worker drops the cancelled sub-jobs from the lane instead of running them

        async def idle() -> bool:
            return worker.running_jobs == 0 and await redis.llen(q._keys.ready) == 0

        await wait_until(idle, timeout=20, what="the worker to drop the cancelled sub-jobs")
    assert await runs(redis, t.keys) == [0]
    assert await cb_count(redis, t.keys) == 0
    info = await batch.info()
    assert (info.state, info.done) == (BatchState.CANCELLED, 1)
    with pytest.raises(BatchCancelled):
        await batch.wait(timeout=5)
    await check_invariants(redis, q._keys)


async def _started(redis: Redis, keys: Keys, x: int) -> bool:
    return str(x).encode() in await redis.lrange(keys.started, 0, -1)


# ---------------------------------------------------------------------------- limits and options
async def test_a_batch_concurrency_limit_holds_across_its_sub_jobs(
    bapp: App, tasks: BatchTasks, redis: Redis
) -> None:
    t = tasks
    k = 3
    batch = await bapp.batch(
        [t.tracked.call(i, 0.2) for i in range(12)], on_complete=t.collect.call(), concurrency=k
    )
    group = f"batch:{batch.id}"
    gconf = bapp.queue()._keys.gconf
    assert text(await redis.hget(gconf, f"limit:{group}")) == str(k)
    async with Worker(bapp, concurrency=20):
        await batch.wait(timeout=30)
        assert batch.callback is not None
        await batch.callback.result(timeout=20)
    peaks = [int(p) for p in await redis.lrange(t.keys.peaks, 0, -1)]
    assert len(peaks) == 12
    assert max(peaks) == k, f"at most {k} at once, saw {peaks}"
    assert sorted(await runs(redis, t.keys)) == list(range(12))
    # the limit was the batch's own: it is gone with the batch
    assert await redis.hget(gconf, f"limit:{group}") is None
    assert await cb_count(redis, t.keys) == 1


async def test_priority_and_group_are_passed_to_sub_jobs(
    bapp: App, tasks: BatchTasks, redis: Redis
) -> None:
    t = tasks
    q = bapp.queue()
    batch: Batch[Any] = await bapp.batch(
        [t.work.call(1), t.work.options(priority=-3, group="own").call(2), t.work.call(3)],
        priority=7,
        group="tenant-1",
    )
    streamed: Batch[Any] = await bapp.batch(priority=5)
    (added,) = await streamed.add(t.work.call(4))
    members = [text(m) for m in await redis.zrange(bkey(batch) + ":all", 0, -1)]
    fields = [await redis.hmget(q._keys.job(m), ["pr", "g", "b"]) for m in members]
    assert [[text(v) for v in f] for f in fields] == [
        ["7", "tenant-1", batch.id],
        ["-3", "own", batch.id],
        ["7", "tenant-1", batch.id],
    ]
    assert [text(v) for v in await redis.hmget(q._keys.job(added.id), ["pr", "b"])] == [
        "5",
        streamed.id,
    ]
    assert await q.group_counts() == {"tenant-1": 2, "own": 1}
    states = await check_invariants(redis, q._keys)
    assert sorted(states.values()) == ["queued"] * 4
    got = await q.reserve(4)
    assert {r.args for r in got} == {(1,), (2,), (3,), (4,)}


# ---------------------------------------------------------------------------- other queues
async def test_sub_jobs_on_other_queues_are_counted_through_the_outbox(
    bapp: App, tasks: BatchTasks, redis: Redis
) -> None:
    t = tasks
    calls = [t.work.call(1), t.work_other.call(2), t.work.call(3), t.work_other.call(4)]
    batch = await bapp.batch(calls, on_complete=t.collect.call())
    assert batch.queue.name == bapp.default_queue
    assert batch.callback is not None
    # a callback on a third queue: the batch lives there, every sub-job is foreign
    remote = await bapp.batch(
        [t.work.call(5), t.work_other.call(6)],
        on_complete=t.collect.options(queue="callbacks").call(),
    )
    assert remote.queue.name == "callbacks"
    assert remote.callback is not None
    async with Worker(bapp, queues=[bapp.default_queue, OTHER, "callbacks"], concurrency=10):
        info = await batch.wait(timeout=30)
        assert await batch.callback.result(timeout=20) == {"ok": 4, "failed": 0}
        assert (await remote.wait(timeout=30)).done == 2
        assert await remote.callback.result(timeout=20) == {"ok": 2, "failed": 0}
    assert info.state is BatchState.COMPLETED
    await check_batch(redis, batch, total=4, done=4, failed=0)
    await check_batch(redis, remote, total=2, done=2, failed=0)
    assert await cb_count(redis, t.keys) == 2
    summaries = {s["batch"]: s for s in await cb_runs(redis, t.keys)}
    assert sorted(summaries[batch.id]["values"]) == [10, 20, 30, 40]
    assert sorted(summaries[remote.id]["values"]) == [50, 60]
    for name in (bapp.default_queue, OTHER):
        assert await redis.llen(bapp.queue(name)._keys.outbox) == 0
    # a foreign member is named by its queue's key base
    members = {text(m) for m in await redis.zrange(bkey(batch) + ":all", 0, -1)}
    assert sum(m.startswith(bapp.queue(OTHER)._keys.base) for m in members) == 2


async def test_forward_outbox_applies_foreign_outcomes_once(
    bapp: App, tasks: BatchTasks, redis: Redis
) -> None:
    """Driven by hand (no worker): the scripts that finish sub-jobs on another queue leave
    their outcomes in that queue's outbox, until forwarded; forwarding again, even entries
    that were applied but not removed (a forwarder that died between the two), changes
    nothing."""
    t = tasks
    batch = await bapp.batch(
        [t.work_other.call(1), t.maybe_fail.options(queue=OTHER).call(-2)],
        on_complete=t.collect.call(),
    )
    assert batch.callback is not None
    other = bapp.queue(OTHER)
    bad, good = sorted(await reserve_all(other, 2), key=lambda r: r.args)
    assert (bad.args, good.args) == ((-2,), (1,))
    # the scripts alone (Queue.complete would forward at once)
    ttl = bapp.result_ttl_default_ms
    assert await other._scripts.complete([(good.id, good.token, bapp.codec.dump_result(10), ttl)])
    err = bapp.codec.dump_error(ValueError("boom"))
    dead = await other._scripts.fail(bad.id, bad.token, err, FailMode.DEAD, bapp.dead_ttl_ms)
    assert dead is Outcome.DEAD
    entries = await redis.lrange(other._keys.outbox, 0, -1)
    assert len(entries) == 2
    await check_batch(redis, batch, total=2, done=0, failed=0)  # nothing applied yet
    assert await forward_outbox(other) == 2
    info = await check_batch(redis, batch, total=2, done=1, failed=1)
    assert info.state is BatchState.COMPLETED
    assert await redis.llen(other._keys.outbox) == 0
    assert await batch.callback.state() is JobState.QUEUED
    await redis.rpush(other._keys.outbox, *entries, *entries)  # as if removals had been lost
    assert await forward_outbox(other) == 4
    assert await forward_outbox(other) == 0
    await check_batch(redis, batch, total=2, done=1, failed=1)
    ready = ready_ids(await redis.lrange(bapp.queue()._keys.ready, 0, -1))
    assert ready.count(batch.callback.id) == 1
    await drain(bapp)
    assert await cb_count(redis, t.keys) == 1
    (summary,) = await cb_runs(redis, t.keys)
    assert (summary["ok"], summary["failed"], summary["errors"]) == (1, 1, ["ValueError"])


async def test_every_script_call_of_a_cross_queue_batch_touches_one_slot(
    bapp: App, tasks: BatchTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis Cluster: a script may only touch keys of one slot. Each call's KEYS and the key
    base its keys are built from (ARGV[1]) must share one hash tag, though the batch spans
    three queues (so three slots)."""
    t = tasks
    seen: list[tuple[str, list[str]]] = []
    real_one = loader.evalsha
    real_many = loader.evalsha_many

    def record(keys: Any, args: Any) -> None:
        seen.append((str(args[0]), [str(k) for k in keys]))

    async def one(client: Any, script: Any, keys: Any, args: Any) -> Any:
        record(keys, args)
        return await real_one(client, script, keys, args)

    async def many(client: Any, calls: Any) -> Any:
        for _, keys, args in calls:
            record(keys, args)
        return await real_many(client, calls)

    # the door's modules each call these by their own global name
    for module in (scripts_module, scriptreads_module):
        if hasattr(module, "evalsha"):
            monkeypatch.setattr(module, "evalsha", one)
        if hasattr(module, "evalsha_many"):
            monkeypatch.setattr(module, "evalsha_many", many)
    batch = await bapp.batch(
        [t.work.call(1), t.work_other.call(2)],
        on_complete=t.collect.options(queue="callbacks").call(),
    )
    streamed = await bapp.batch(on_complete=t.collect.call())
    await streamed.add(t.work.call(3), t.work_other.call(4))
    await streamed.seal()
    cancelled: Batch[Any] = await bapp.batch(
        [t.work_other.call(5), t.work.call(6)], queue="callbacks"
    )
    assert await cancelled.cancel() == 2
    async with Worker(bapp, queues=[bapp.default_queue, OTHER, "callbacks"], concurrency=10):
        await batch.wait(timeout=30)
        await streamed.wait(timeout=30)
        assert batch.callback is not None
        assert streamed.callback is not None
        await batch.callback.result(timeout=20)
        await streamed.callback.result(timeout=20)
    assert len(seen) > 10
    tags = set()
    for base, keys in seen:
        tag = hash_tag(base)
        assert all(hash_tag(k) == tag for k in keys), (base, keys)
        tags.add(tag)
    assert tags == {"{default}", "{other}", "{callbacks}"}


def hash_tag(key: str) -> str:
    """The part of a key that decides its cluster slot."""
    found = re.search(r"\{([^}]*)\}", key)
    assert found is not None, f"key {key!r} has no hash tag"
    assert found[1], f"key {key!r} has an empty hash tag"
    return found[0]


# ---------------------------------------------------------------------------- exactly once
@pytest.mark.parametrize("how", ["one_script_call", "concurrent_calls"])
async def test_two_sub_jobs_finishing_at_the_same_instant(
    bapp: App, tasks: BatchTasks, redis: Redis, how: str
) -> None:
    t = tasks
    q = bapp.queue()
    batch = await bapp.batch([t.work.call(1), t.work.call(2)], on_complete=t.collect.call())
    assert batch.callback is not None
    r1, r2 = await reserve_all(q, 2)
    if how == "one_script_call":
        data = bapp.codec.dump_result(7)
        codes = await q._scripts.complete([(r.id, r.token, data, -1) for r in (r1, r2)])
        assert codes == [Outcome.OK, Outcome.OK]
    else:
        await asyncio.gather(q.complete(r1, 7), q.complete(r2, 7))
    info = await check_batch(redis, batch, total=2, done=2, failed=0)
    assert info.state is BatchState.COMPLETED
    ready = ready_ids(await redis.lrange(q._keys.ready, 0, -1))
    assert ready == [batch.callback.id]  # released once
    await drain(bapp)
    assert await cb_count(redis, t.keys) == 1
    assert await batch.callback.result(timeout=5) == {"ok": 2, "failed": 0}


async def test_a_sub_job_retried_after_its_lease_expired_is_counted_once(
    bapp: App, tasks: BatchTasks, redis: Redis
) -> None:
    t = tasks
    q = bapp.queue()
    batch = await bapp.batch([t.work.call(1), t.work.call(2)], on_complete=t.collect.call())
    assert batch.callback is not None
    first, other = await reserve_all(q, 2, lease=0.2)
    await q.complete(other, 20)
    deadline = await redis.zscore(q._keys.active, first.id)
    assert deadline is not None

    async def expired() -> bool:
        return await server_ms(redis) > deadline

    await wait_until(expired, timeout=10, what="the lease to run out")
    (again,) = await reserve_all(q, 1, lease=30)  # claim hands the expired lease out again
    assert (again.id, again.attempt) == (first.id, 2)
    with pytest.raises(LeaseLost):
        await q.complete(first, 10)  # the first holder is fenced off
    info = await check_batch(redis, batch, total=2, done=1, failed=0)
    assert info.state is BatchState.OPEN
    await q.complete(again, 10)
    with pytest.raises(LeaseLost):
        await q.complete(first, 10)
    info = await check_batch(redis, batch, total=2, done=2, failed=0)
    assert info.state is BatchState.COMPLETED
    assert ready_ids(await redis.lrange(q._keys.ready, 0, -1)) == [batch.callback.id]
    assert [i.result for i in await batch.results()] == [10, 20]


async def test_a_sub_job_retried_after_a_failure_is_counted_once(
    bapp: App, tasks: BatchTasks, redis: Redis
) -> None:
    t = tasks
    q = bapp.queue()
    batch = await bapp.batch([t.work.call(1)], on_complete=t.collect.call())
    (r,) = await reserve_all(q, 1)
    assert await q.fail(r, "try again", delay=0) is True
    info = await check_batch(redis, batch, total=1, done=0, failed=0)
    assert info.state is BatchState.OPEN
    (r2,) = await reserve_all(q, 1)
    await q.complete(r2, 10)
    info = await check_batch(redis, batch, total=1, done=1, failed=0)
    assert info.state is BatchState.COMPLETED


async def test_an_ack_resent_after_a_lost_reply_counts_the_last_sub_job_once(
    redis_url: str, redis: Redis
) -> None:
    """The reply to the last sub-job's completion is lost (as if its worker died right after
    sending it): the script ran, and the resent ack is recognised, not counted again."""
    async with ReplyDropProxy(redis_url) as proxy, open_app(proxy.url, lease=5.0) as app:
        t = register(app)
        q = app.queue()
        batch = await app.batch([t.work.call(1), t.work.call(2)], on_complete=t.collect.call())
        assert batch.callback is not None
        r1, r2 = await reserve_all(q, 2)
        await q.complete(r1, 10)
        proxy.arm(SCRIPTS["complete"].function.encode() + b"\r\n")
        # the reply is lost: an error, unless the client resent the ack on its own
        with contextlib.suppress(aioqueue.ServerUnavailable):
            await q.complete(r2, 20)
        assert proxy.dropped == 1
        await q.complete(r2, 20)  # the resent ack: accepted, not LeaseLost
        await check_batch(redis, batch, total=2, done=2, failed=0)
        ready = ready_ids(await redis.lrange(q._keys.ready, 0, -1))
        assert ready == [batch.callback.id]


async def test_applying_the_same_outcome_twice_counts_it_once(
    bapp: App, tasks: BatchTasks, redis: Redis
) -> None:
    """An outcome that reaches its batch again (a replayed outbox entry, through any
    forwarder, before or after the batch finished; a resent ack) is counted once."""
    t = tasks
    q = bapp.queue()
    other = bapp.queue(OTHER)
    batch = await bapp.batch([t.work_other.call(1), t.work.call(2)], on_complete=t.collect.call())
    assert batch.callback is not None
    (ro,) = await reserve_all(other, 1)
    ack = (ro.id, ro.token, bapp.codec.dump_result(10), bapp.result_ttl_default_ms)
    assert await other._scripts.complete([ack])
    (entry,) = await redis.lrange(other._keys.outbox, 0, -1)
    # two forwarders at once, each applying the same entry
    assert sum(await asyncio.gather(forward_outbox(other), forward_outbox(other))) >= 1
    await check_batch(redis, batch, total=2, done=1, failed=0)
    await redis.rpush(other._keys.outbox, entry)
    await forward_outbox(other)
    info = await check_batch(redis, batch, total=2, done=1, failed=0)
    assert info.state is BatchState.OPEN
    (r,) = await reserve_all(q, 1)
    await q.complete(r, 20)
    info = await check_batch(redis, batch, total=2, done=2, failed=0)
    assert info.state is BatchState.COMPLETED
    # after the batch finished: a stale entry, and the sub-job's ack sent again
    await redis.rpush(other._keys.outbox, entry)
    assert await forward_outbox(other) == 1
    assert await other._scripts.complete([ack]) == [Outcome.OK]  # recognised: not a second outcome
    assert await redis.llen(other._keys.outbox) == 0
    await check_batch(redis, batch, total=2, done=2, failed=0)
    assert ready_ids(await redis.lrange(q._keys.ready, 0, -1)) == [batch.callback.id]
    assert [i.result for i in await batch.results()] == [10, 20]


# ---------------------------------------------------------------------------- chains
async def test_a_chain_feeds_the_first_result_to_the_second_step(
    bapp: App, tasks: BatchTasks, redis: Redis
) -> None:
    t = tasks
    job = await t.work.call(4).then(t.describe, "!").enqueue()
    async with Worker(bapp, concurrency=4):
        assert await job.result(timeout=20) == "40!"
    assert [json.loads(v) for v in await redis.lrange(t.keys.chained, 0, -1)] == [[40, "!"]]
    assert await runs(redis, t.keys) == [4]


async def test_a_chain_whose_first_step_fails_never_runs_the_second(
    bapp: App, tasks: BatchTasks, redis: Redis
) -> None:
    t = tasks
    job = await t.maybe_fail.call(-1).then(t.describe, "?").enqueue()
    assert await job.state() is JobState.WAITING
    async with Worker(bapp, concurrency=4):
        with pytest.raises(JobCancelled):
            await job.result(timeout=20)
    assert await job.state() is JobState.CANCELLED
    assert await redis.llen(t.keys.chained) == 0  # the worker drained its queue meanwhile


async def test_a_chain_across_queues(bapp: App, tasks: BatchTasks, redis: Redis) -> None:
    t = tasks
    job = await t.work_other.call(5).then(t.describe, "x").enqueue()
    assert job.queue == t.describe.queue
    async with Worker(bapp, queues=[bapp.default_queue, OTHER], concurrency=4):
        assert await job.result(timeout=30) == "50x"


# ---------------------------------------------------------------------------- waiting
async def test_wait_returns_promptly_through_pub_sub(redis_url: str, redis: Redis) -> None:
    name = f"{unique_prefix()}-waiter"
    async with open_app(redis_url, redis_options={"client_name": name}) as app:
        t = register(app)
        q = app.queue()
        batch = await app.batch([t.work.call(i) for i in range(3)], on_complete=t.collect.call())
        res = await reserve_all(q, 3)
        for r in res[:2]:
            await q.complete(r, 1)
        events: Any = redis.pubsub()
        sharded = isinstance(redis, RedisCluster)  # the App listens sharded: so does this
        if sharded:
            await events.ssubscribe(q._keys.done_channel)
        else:
            await events.subscribe(q._keys.done_channel)
        waiter = asyncio.create_task(batch.wait(timeout=30))

        async def registered() -> bool:
            return await redis.hget(bkey(batch), "w") is not None

        await wait_until(registered, timeout=10, what="wait() to register")
        listening = await clients_named(redis, name)  # (sharded, ssub, on a cluster)
        subscribed = [c for c in listening if "1" in (c.get("sub"), c.get("ssub"))]
        assert subscribed, "the App listens on a pub/sub connection"
        assert not waiter.done()
        start = time.monotonic()
        await q.complete(res[2], 1)
        info = await waiter
        elapsed = time.monotonic() - start
        # a poll would take the re-check interval (5 s); a notification takes milliseconds
        assert elapsed < PROMPT_S, f"wait() returned {elapsed:.3f} s after the last completion"
        assert info.state is BatchState.COMPLETED
        # the event on completion: one message "batch:<id>" on the home queue's channel
        got: list[str] = []

        async def message() -> bool:
            get = events.get_sharded_message if sharded else events.get_message
            msg = await get(ignore_subscribe_messages=True, timeout=0.05)
            if msg is not None:
                got.append(text(msg["data"]))
            return bool(got)

        await wait_until(message, timeout=5, what="the completion event")
        assert got == [f"batch:{batch.id}"]
        await events.aclose()


# what a waiter may send over a quiet second: its checks (and the commands they run inside
# the script), and a connection's handshake
_QUIET_COMMANDS = {
    "cmdstat_fcall", "cmdstat_evalsha", "cmdstat_hmget", "cmdstat_hset",
    "cmdstat_hello", "cmdstat_client|setinfo", "cmdstat_client|setname", "cmdstat_ping",
}  # fmt: skip


async def test_wait_issues_no_commands_while_nothing_happens(
    quiet_server: EmbeddedServer,
) -> None:
    observer = Redis.from_url(quiet_server.url, socket_timeout=None)
    try:
        await load_scripts(observer)
        async with open_app(quiet_server.url) as app:
            t = register(app)
            batch = await app.batch([t.work.call(1)], on_complete=t.collect.call())
            await app.result_waiter.subscribe(app.queue()._keys.done_channel)
            stats = await observer.info("commandstats")
            before = {k: int(v["calls"]) for k, v in stats.items()}
            with pytest.raises(ResultTimeout):
                await batch.wait(timeout=1.0)
            stats = await observer.info("commandstats")
            after = {k: int(v["calls"]) for k, v in stats.items()}
            delta = {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}
            delta.pop("cmdstat_info", None)
            # the first check and one at the deadline (watch.lua: its HMGET and HSET count
            # too); polling, even at 5 per second, would show many more
            assert delta.get("cmdstat_fcall", 0) + delta.get("cmdstat_evalsha", 0) <= 2, delta
            assert set(delta) <= _QUIET_COMMANDS, delta
    finally:
        await observer.aclose()


# ---------------------------------------------------------------------------- retention (I8)
# keys of a queue that live as long as the queue does (bounded by what is queued)
_QUEUE_KEYS = {
    "stats", "seq", "ready", "prio", "scheduled", "active", "dead", "wake", "ring",
    "gactive", "gconf", "gwait", "qconf", "outbox", "completed", "cancelled", "backlog",
}  # fmt: skip


async def keys_without_ttl(redis: Redis, app: App) -> list[str]:
    """Keys of the App that never expire, other than the queues' own structures and the
    tasks' records (``<prefix>:t:*``)."""
    out = []
    async for raw in redis.scan_iter(match=app.prefix + ":*", count=1000):
        key = text(raw)
        rest = key[len(app.prefix) + 1 :]
        if rest.startswith("t:"):
            continue
        name = rest.split("}:", 1)[1] if "}:" in rest else rest
        if name in _QUEUE_KEYS:
            continue
        if await redis.pttl(key) == -1:
            out.append(key)
    return out


async def test_a_finished_batch_expires_with_its_retention(
    bapp: App, tasks: BatchTasks, redis: Redis
) -> None:
    t = tasks
    calls = [t.work.call(1), t.maybe_fail.call(-1), t.work_other.call(2)]
    batch = await bapp.batch(calls, on_complete=t.collect.call(), retention=60)
    async with Worker(bapp, queues=[bapp.default_queue, OTHER], concurrency=4):
        await batch.wait(timeout=30)
        assert batch.callback is not None
        await batch.callback.result(timeout=20)
    bk = bkey(batch)
    for suffix in ("", ":all", ":seen", ":res", ":err"):
        assert await redis.exists(bk + suffix), f"{bk + suffix} exists"
        assert 0 < await redis.pttl(bk + suffix) <= 60_000, f"{bk + suffix} expires"
    assert await keys_without_ttl(redis, bapp) == []


async def test_a_cancelled_batch_expires(bapp: App, tasks: BatchTasks, redis: Redis) -> None:
    t = tasks
    key = f"{bapp.prefix}:t:release"
    batch = await bapp.batch(
        [t.hold.call(0, key), t.work.call(1), t.work.call(2)],
        on_complete=t.collect.call(),
        retention=60,
    )
    async with Worker(bapp, concurrency=1) as worker:
        await wait_until(lambda: _started(redis, t.keys, 0), timeout=20, what="the hold")
        await batch.cancel()
        await redis.set(key, 1)

        async def idle() -> bool:
            q = bapp.queue()
            return worker.running_jobs == 0 and await redis.llen(q._keys.ready) == 0

        await wait_until(idle, timeout=20, what="the worker to finish")
    assert await keys_without_ttl(redis, bapp) == []


async def test_the_cancelled_callback_of_a_failed_batch_expires(
    bapp: App, tasks: BatchTasks, redis: Redis
) -> None:
    t = tasks
    batch = await bapp.batch(
        [t.maybe_fail.call(-1)], on_complete=t.collect.call(), on_failure="fail", retention=60
    )
    assert batch.callback is not None
    async with Worker(bapp, concurrency=2):
        with pytest.raises(BatchFailed):
            await batch.wait(timeout=20)
    assert await batch.callback.state() is JobState.CANCELLED
    assert await redis.pttl(bapp.queue()._keys.job(batch.callback.id)) > 0


# ---------------------------------------------------------------------------- scale
@pytest.mark.no_cover  # a test of scale: coverage paused (tests/conftest.py, "Coverage")
async def test_ten_thousand_sub_jobs(redis_url: str, redis: Redis) -> None:
    # a 30 s lease, not bapp's 1 s: the callback decodes 10,000 results in one go, and on a
    # loaded machine an event loop blocked past a 1 s lease has its job handed out again (at
    # least once: the callback then runs twice), which is not what this test is about
    async with open_app(redis_url, lease=30.0) as app:
        t = register(app, other_queue=OTHER)
        await _ten_thousand_sub_jobs(app, t, redis)
        await drop_keys(redis, app.prefix)


async def _ten_thousand_sub_jobs(bapp: App, t: BatchTasks, redis: Redis) -> None:
    n = 10_000
    batch = await bapp.batch([t.work.call(i) for i in range(n)], on_complete=t.collect.call())
    assert batch.callback is not None
    async with Worker(bapp, concurrency=100):
        info = await batch.wait(timeout=60)
        assert await batch.callback.result(timeout=30) == {"ok": n, "failed": 0}
    assert info.state is BatchState.COMPLETED
    await check_batch(redis, batch, total=n, done=n, failed=0)
    assert await cb_count(redis, t.keys) == 1
    (summary,) = await cb_runs(redis, t.keys)
    assert summary["values"] == [i * 10 for i in range(n)]
    assert set(await runs(redis, t.keys)) == set(range(n))


# ---------------------------------------------------------------------------- found here, fixed
async def test_results_keep_the_add_order_across_queues(
    bapp: App, tasks: BatchTasks, redis: Redis
) -> None:
    t = tasks
    calls = [t.work.call(1), t.work_other.call(2), t.work.call(3), t.work_other.call(4)]
    batch = await bapp.batch(calls, on_complete=t.collect.call())
    async with Worker(bapp, queues=[bapp.default_queue, OTHER], concurrency=4):
        await batch.wait(timeout=30)
    assert [i.result for i in await batch.results()] == [10, 20, 30, 40]


async def test_pull_api_consumers_of_other_queues_finish_a_batch(
    bapp: App, tasks: BatchTasks, redis: Redis
) -> None:
    """No worker anywhere: sub-jobs on another queue consumed through the pull API, with the
    maintenance call meant for pull-API-only setups (Queue.reap), finish their batch."""
    t = tasks
    other = bapp.queue(OTHER)
    batch = await bapp.batch(
        [t.work_other.call(1), t.maybe_fail.options(queue=OTHER).call(-1)],
        on_complete=t.collect.call(),
    )
    bad, good = sorted(await reserve_all(other, 2), key=lambda r: r.args)
    await other.complete(good, 10)
    await other.fail(bad, "no", retry=False)
    await other.reap()
    info = await check_batch(redis, batch, total=2, done=1, failed=1)
    assert info.state is BatchState.COMPLETED
    assert await redis.llen(other._keys.outbox) == 0


async def test_many_foreign_outcomes_are_forwarded_promptly(redis_url: str, redis: Redis) -> None:
    """Outcomes on another queue reach the batch as they happen, not once per maintenance
    period (lease / 2: 15 s here)."""
    n = 1000
    async with open_app(redis_url) as app:  # the default lease of 30 s
        t = register(app, other_queue=OTHER)
        other = app.queue(OTHER)
        batch: Batch[None] = await app.batch([t.work_other.call(i) for i in range(n)])
        async with Worker(app, queues=[app.default_queue, OTHER], concurrency=100):

            async def all_ran() -> bool:
                return int((await other.stats()).get("completed", 0)) == n

            await wait_until(all_ran, timeout=30, what="every sub-job to run")
            # handed over as the acks report them, not one maintenance period at a time
            info = await batch.wait(timeout=5)
    assert info.done == n


# ---------------------------------------------------------------------------- NOSCRIPT
async def test_first_batch_on_a_server_that_does_not_know_the_batch_script(
    quiet_server: EmbeddedServer,
) -> None:
    """A server that lost its scripts after the App loaded them (a restart, SCRIPT FLUSH)
    and has since learnt enqueue.lua but not batch.lua: the batch's pipelined calls meet
    NOSCRIPT, and the batch still opens, takes its sub-job and is sealed, in that order."""
    observer = Redis.from_url(quiet_server.url, socket_timeout=None)
    batch_sha = SCRIPTS["batch"].sha
    try:
        async with open_app(quiet_server.url) as app:
            use_functions(app.redis, False)  # EVALSHA: a server without functions (Redis 6.2)
            await load_scripts(app.redis)
            t = register(app)
            assert await observer.script_exists(batch_sha) == [True]  # the App loaded it
            await observer.script_flush()
            await t.work.enqueue(0)  # meets NOSCRIPT: the server now knows enqueue.lua only
            assert await observer.script_exists(SCRIPTS["enqueue"].sha, batch_sha) == [
                True,
                False,
            ]
            batch = await app.batch([t.work.call(1)], on_complete=t.collect.call())
            assert await observer.script_exists(batch_sha) == [True]  # reloaded by the call
            info = await batch.info()
            assert (info.total, info.sealed, info.state) == (1, True, BatchState.OPEN)
            assert batch.callback is not None
            assert await batch.callback.state() is JobState.WAITING
            await check_invariants(observer, app.queue()._keys)
    finally:
        await observer.aclose()


async def test_a_foreign_sub_job_with_an_existing_id_does_not_hang_its_batch(
    bapp: App, tasks: BatchTasks
) -> None:
    t = tasks
    await t.work_other.options(job_id="taken").enqueue(1)
    try:
        batch = await bapp.batch(
            [t.work_other.options(job_id="taken").call(2), t.work.call(3)],
            on_complete=t.collect.call(),
        )
    except ConfigurationError:
        return  # refusing the call is a fine answer too
    async with Worker(bapp, queues=[bapp.default_queue, OTHER], concurrency=4):
        info = await batch.wait(timeout=5)
    assert info.pending == 0
