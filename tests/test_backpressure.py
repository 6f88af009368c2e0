"""Backpressure (issue 28, point 4): ``Queue.set_max_queued(N, wait=...)`` is stored on the
server and enforced by enqueue.lua in the same atomic call that stores the jobs: a call that
would take the waiting jobs past N stores nothing and raises ``QueueFull`` (all or nothing),
after the producer waited up to ``wait`` seconds for room, backing off. A real server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest
from redis.asyncio import Redis

from aioqueue import App, QueueFull, ServerError

from .support.waiting import wait_until


async def test_a_full_queue_refuses_an_enqueue_and_stores_nothing(app: App) -> None:
    q = app.queue()
    await q.set_max_queued(3)
    assert await q.max_queued() == (3, 0.0)
    for _ in range(3):
        await q.enqueue("t")
    with pytest.raises(QueueFull) as caught:
        await q.enqueue("t", job_id="fourth")
    assert isinstance(caught.value, ServerError)
    assert (caught.value.waiting, caught.value.limit, caught.value.wait) == (3, 3, 0.0)
    assert "3 jobs waiting, at most 3" in str(caught.value)
    assert (await q.counts())["queued"] == 3
    assert await q.stats() == {"enqueued": 3, "refused": 1}  # the refusal, counted
    # a job taken frees room
    assert len(await q.reserve()) == 1
    await q.enqueue("t", job_id="fourth")
    # cleared: no limit
    await q.set_max_queued(None)
    assert await q.max_queued() is None
    for _ in range(5):
        await q.enqueue("t")


async def test_bulk_enqueue_is_all_or_nothing(app: App) -> None:
    q = app.queue()

    @app.task
    async def t(i: int) -> None:
        pass

    await q.set_max_queued(10)
    await t.enqueue_many([{"i": i} for i in range(8)])
    with pytest.raises(QueueFull):
        await t.enqueue_many([{"i": i} for i in range(3)])
    assert (await q.counts())["queued"] == 8
    await t.enqueue_many([{"i": i} for i in range(2)])
    assert (await q.counts())["queued"] == 10


async def test_every_lane_and_the_schedule_count(app: App) -> None:
    q = app.queue()
    await q.set_max_queued(3)
    await q.enqueue("t", delay=3600)
    await q.enqueue("t", group="g")
    await q.enqueue("t", priority=5)
    # the backlog in total: the scheduled one, group g's and the priority lane's, whatever
    # lane (or group) the refused job would go to
    for kwargs in ({"group": "h"}, {"group": "g"}, {}, {"delay": 60}):
        with pytest.raises(QueueFull) as caught:
            await q.enqueue("t", **kwargs)
        assert caught.value.waiting == 3


async def test_a_retried_enqueue_of_a_stored_job_is_never_refused(app: App) -> None:
    q = app.queue()
    await q.set_max_queued(1)
    job = await q.enqueue("t", job_id="same")
    again = await q.enqueue("t", job_id="same")  # idempotent: stores nothing new
    assert again.id == job.id


async def test_a_producer_waits_for_room_then_enqueues(app: App) -> None:
    q = app.queue()
    await q.set_max_queued(1, wait=60)
    await q.enqueue("t")
    started = time.monotonic()
    waiting = asyncio.create_task(q.enqueue("t", job_id="later"))
    # it backs off, the queue full: nothing stored yet
    await wait_until(lambda: time.monotonic() - started > 0.3, timeout=5, what="a while")
    assert not waiting.done()
    assert (await q.counts())["queued"] == 1
    assert len(await q.reserve()) == 1  # room
    job = await asyncio.wait_for(waiting, 30)
    assert job.id == "later"


async def test_a_producer_gives_up_after_the_wait(app: App) -> None:
    q = app.queue()
    await q.set_max_queued(1, wait=0.3)
    await q.enqueue("t")
    started = time.monotonic()
    with pytest.raises(QueueFull) as caught:
        await q.enqueue("t")
    assert time.monotonic() - started >= 0.3
    assert caught.value.wait == 0.3


async def test_garbage_in_the_setting_is_no_limit(app: App, redis: Redis) -> None:
    q = app.queue()
    for value in ("abc", "-1", "1e400", str(2**63)):
        await redis.hset(q._keys.qconf, mapping={"maxq": value, "maxq_wait": "x"})
        assert await q.max_queued() is None
        await q.enqueue("t")
    assert (await q.counts())["queued"] == 4


async def test_the_setting_and_the_refusals_show_in_info_and_metrics(
    app: App, redis_url: str
) -> None:
    pytest.importorskip("prometheus_client")
    from aioqueue.metrics import QueueCollector

    q = app.queue()
    await q.set_max_queued(1)
    await q.enqueue("t")
    with pytest.raises(QueueFull):
        await q.enqueue("t")
    collector = QueueCollector(app, ["default"])
    await collector.refresh()
    families = {m.name: m for m in collector.collect()}
    assert [s.value for s in families["aioqueue_queue_max_queued"].samples] == [1]
    backlog = families["aioqueue_queue_backlog"].samples
    assert [(s.labels["task"], s.value) for s in backlog] == [("t", 1)]
    refused = [
        s for s in families["aioqueue_queue_events"].samples if s.labels["event"] == "refused"
    ]
    assert [s.value for s in refused] == [1]
    command = [sys.executable, "-m", "aioqueue", "info", "--json", "--url", redis_url]
    res = await asyncio.to_thread(
        subprocess.run,
        [*command, "--prefix", app.prefix],
        capture_output=True,
        text=True,
        timeout=60,
    )
    [row] = json.loads(res.stdout)["queues"]
    assert (row["max_queued"], row["stats"]["refused"]) == (1, 1)
    assert (row["backlog"], row["backlog_tasks"]) == (1, {"t": 1})
