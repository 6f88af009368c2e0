"""Per-job logs (issue 27, point 8): ``ctx.log`` and, with ``@app.task(capture_logs=level)``,
the task's own logging records are kept with the job, capped (lines and bytes, the oldest
dropped), written only by the lease holder, shown by ``aioqueue job ID`` (escaped) and the
dashboard's job page, and removed with the job (tests/test_steps.py)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from redis.asyncio import Redis

from aioqueue import App, Worker, current_job
from aioqueue._model.keys import QueueKeys
from aioqueue._model.limits import JOB_LOG_BYTES, JOB_LOG_LINES

from .support.clirun import aioqueue_cli
from .support.server import text

log = logging.getLogger("tests.joblogs")


async def test_ctx_log_and_captured_records_are_kept_with_the_job(app: App) -> None:
    @app.task(capture_logs=logging.INFO)
    async def chatty(n: int) -> int:
        ctx = current_job()
        ctx.log("starting")
        log.info("fetched %d rows", n)
        log.debug("not kept: below the level")
        await ctx.step("s", lambda: 1)  # the lines so far are written here
        ctx.log("careful", logging.WARNING)
        return n

    @app.task
    async def quiet() -> None:
        log.info("not this task's to keep")

    log.setLevel(logging.DEBUG)
    try:
        async with Worker(app, concurrency=2, grace=2):
            job = await chatty.enqueue(3)
            other = await quiet.enqueue()
            assert await job.result(timeout=30) == 3
            await other.result(timeout=30)
    finally:
        log.setLevel(logging.NOTSET)
    d = await app.queue().job_detail(job.id)
    assert [(lv, m) for _, lv, m in d.logs] == [
        ("INFO", "starting"),
        ("INFO", "fetched 3 rows"),
        ("WARNING", "careful"),
    ]
    assert all(t > 1e9 for t, _, _ in d.logs)
    assert (await app.queue().job_detail(other.id)).logs == ()


async def test_the_log_is_capped_by_lines_and_bytes_oldest_first(app: App, redis: Redis) -> None:
    @app.task
    async def flood(n: int, size: int) -> None:
        ctx = current_job()
        for i in range(n):
            ctx.log(f"{i:05d} " + "x" * size)

    async with Worker(app, concurrency=1, grace=2):
        many = await flood.enqueue(JOB_LOG_LINES + 100, 10)
        big = await flood.enqueue(100, 1500)
        await many.result(timeout=30)
        await big.result(timeout=30)
    lines = (await app.queue().job_detail(many.id)).logs
    assert len(lines) == JOB_LOG_LINES
    assert lines[0][2].startswith("00100 ")
    assert lines[-1][2].startswith(f"{JOB_LOG_LINES + 99:05d}")
    k = QueueKeys(app.prefix, "default")
    stored = await redis.lrange(k.job_log(big.id), 0, -1)
    assert sum(len(x) for x in stored) <= JOB_LOG_BYTES
    assert "00099 " in text(stored[-1])  # the newest kept
    assert 30 < len(stored) < 100  # the oldest dropped


async def test_a_stale_holders_log_lines_are_refused(app: App, redis: Redis) -> None:
    @app.task
    async def held() -> None:
        return None

    job = await held.enqueue()
    q = app.queue()
    (r,) = await q.reserve(lease=30)
    scripts = q._scripts
    assert await scripts.append_log(job.id, "not-the-token", ["x"]) == -2
    assert await scripts.append_log("no-such-job", r.token, ["x"]) == -1
    assert not await redis.exists(QueueKeys(app.prefix, "default").job_log(job.id))
    assert await scripts.append_log(job.id, r.token, ['{"t": 1, "l": "INFO", "m": "ok"}']) == 1
    await q.complete(r, None)
    assert [m for _, _, m in (await q.job_detail(job.id)).logs] == ["ok"]


async def test_the_cli_shows_the_log_escaped(app: App, redis_url: str) -> None:
    @app.task
    async def noisy() -> None:
        current_job().log("line one\x1b[31m red\r\nforged: line")

    async with Worker(app, concurrency=1, grace=2):
        job = await noisy.enqueue()
        await job.result(timeout=30)
    out = await asyncio.to_thread(aioqueue_cli, redis_url, app.prefix, "job", job.id)
    assert out.returncode == 0, out.stderr
    assert "log:" in out.stdout
    assert "\x1b" not in out.stdout
    logged = [line for line in out.stdout.splitlines() if "line one" in line]
    assert len(logged) == 1
    assert "INFO" in logged[0]


async def test_the_dashboard_job_page_shows_the_log_escaped(app: App) -> None:
    httpx = pytest.importorskip("httpx")
    from aioqueue.dashboard import basic_auth, create_app

    @app.task
    async def marked() -> None:
        current_job().log("<script>alert(1)</script> done")

    async with Worker(app, concurrency=1, grace=2):
        job = await marked.enqueue()
        await job.result(timeout=30)
    web = create_app(app, auth=basic_auth("ops", "pw-123"))
    transport = httpx.ASGITransport(app=web)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://dash.test", auth=("ops", "pw-123")
    ) as c:
        page = (await c.get(f"/queues/default/jobs/{job.id}")).text
    assert "<h2>Log</h2>" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt; done" in page
    assert "<script>alert(1)" not in page
