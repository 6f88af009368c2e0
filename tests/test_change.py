"""Changing a job that has not started (issue 27, point 7): ``Job.change(priority=, delay= |
at=)`` in one atomic script; a started or finished job refuses with ``JobNotChangeable``; the
CLI's ``aioqueue change`` and the dashboard's job-page form do the same; and the CLI's
``aioqueue signal`` wakes waiters (point 5)."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest
from redis.asyncio import Redis

from aioqueue import App, ConfigurationError, JobNotChangeable, JobNotFound, JobState, Worker
from aioqueue.dashboard import basic_auth, create_app

from .stepapp import register
from .support.clirun import aioqueue_cli
from .support.waiting import wait_until


@pytest.mark.cluster
async def test_change_moves_a_waiting_job_and_refuses_a_started_one(app: App) -> None:
    @app.task
    async def t(n: int) -> int:
        return n

    q = app.queue()
    late = await t.options(delay=3600).enqueue(1)
    assert await late.change(delay=0) is JobState.QUEUED
    assert await late.change(priority=50, delay=600) is JobState.SCHEDULED
    info = await late.info()
    assert info.priority == 50
    assert info.due_ms is not None
    assert info.due_ms > time.time() * 1000 + 500_000
    assert await late.change(at=time.time() + 3600) is JobState.SCHEDULED
    assert await late.change(priority=-3) is JobState.SCHEDULED  # keeps its due time
    assert (await late.info()).due_ms == pytest.approx(time.time() * 1000 + 3_600_000, abs=60_000)
    # priority decides the order of queued jobs
    low = await t.enqueue(2)
    high = await t.enqueue(3)
    assert await high.change(priority=10) is JobState.QUEUED
    (first,) = await q.reserve()
    assert first.id == high.id
    with pytest.raises(JobNotChangeable) as refused:
        await high.change(priority=1)
    assert refused.value.state == "active"
    await q.complete(first, 3)
    with pytest.raises(JobNotChangeable):
        await high.change(delay=5)
    with pytest.raises(JobNotFound):
        await q.job("nope").change(priority=1)
    for bad in ({}, {"delay": 1, "at": time.time()}, {"priority": 101}, {"delay": -1}):
        with pytest.raises(ConfigurationError):
            await low.change(**bad)


async def test_the_cli_changes_a_job_and_signals_waiters(
    app: App, redis: Redis, redis_url: str
) -> None:
    register(app)

    @app.task
    async def later() -> None:
        return None

    job = await later.options(delay=3600).enqueue()
    out = await asyncio.to_thread(
        aioqueue_cli, redis_url, app.prefix, "change", job.id, "--priority", "7", "--delay", "0"
    )
    assert out.returncode == 0, out.stderr
    assert "queued" in out.stdout
    assert (await job.info()).priority == 7
    async with Worker(app, concurrency=2, grace=2):
        await job.result(timeout=30)
        out = await asyncio.to_thread(
            aioqueue_cli, redis_url, app.prefix, "change", job.id, "--priority", "1"
        )
        assert out.returncode != 0
        assert "JobNotChangeable" in out.stderr or "completed" in out.stderr
        waiter = await app.tasks["waiter"].enqueue("cli-key", 600)
        await wait_until(lambda: _scheduled(waiter), timeout=30, what="the waiter parked")
        out = await asyncio.to_thread(
            aioqueue_cli, redis_url, app.prefix, "signal", "cli-key", "--payload", '{"a": [1]}'
        )
        assert out.returncode == 0, out.stderr
        assert "1 jobs woken" in out.stdout
        assert await waiter.result(timeout=30) == {"a": [1]}


async def _scheduled(job: object) -> bool:
    return await job.state() is JobState.SCHEDULED  # type: ignore[attr-defined]


async def test_the_dashboard_job_page_changes_a_waiting_job(app: App) -> None:
    @app.task
    async def later() -> None:
        return None

    job = await later.options(delay=3600).enqueue()
    web = create_app(app, auth=basic_auth("ops", "pw-123"))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=web), base_url="http://dash.test", auth=("ops", "pw-123")
    ) as c:
        page = (await c.get(f"/queues/default/jobs/{job.id}")).text
        assert 'value="change"' in page
        token = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page)
        assert token is not None
        form = {"csrf_token": token.group(1), "action": "change", "ids": job.id}
        r = await c.post("/queues/default/actions", data={**form, "priority": "9", "delay": "0"})
        assert r.status_code in (200, 303), r.text
        assert (await job.info()).priority == 9
        assert await job.state() is JobState.QUEUED
        r = await c.post("/queues/default/actions", data={**form, "priority": "lots"})
        assert (await job.info()).priority == 9  # refused, unchanged
