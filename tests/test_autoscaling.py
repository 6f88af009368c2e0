"""The autoscaling signals (issue 29, point 7): a queue's backlog and how long the head of it
has waited, in the API (``Queue.wait_time``), ``aioqueue info --json`` and the exporter."""

from __future__ import annotations

import json

from aioqueue import App

from .support.prewarmed import run_aioqueue
from .support.waiting import wait_until


def server(app: App) -> list[str]:
    return ["--url", app.url, "--prefix", app.prefix]


async def server_ms(app: App) -> int:
    sec, usec = await app.redis.time()
    return int(sec) * 1000 + int(usec) // 1000


async def test_wait_time_is_how_long_the_head_of_the_backlog_has_waited(app: App) -> None:
    @app.task
    async def work(n: int) -> int:
        return n

    q = app.queue()
    assert await q.wait_time() is None  # nothing queued
    later = await work.options(delay=3600).enqueue(0)  # scheduled: not in the backlog
    assert await q.wait_time() is None
    before = await server_ms(app)
    await work.enqueue(1)
    await work.enqueue(2)

    async def waited_half_a_second() -> bool:
        return (await q.wait_time() or 0.0) >= 0.5

    await wait_until(waited_half_a_second, timeout=30, what="the head to wait 0.5 s")
    waited = await q.wait_time()
    assert waited is not None
    assert waited <= (await server_ms(app) - before) / 1000  # counted from the first enqueue
    assert await later.state() == "scheduled"


def test_info_json_gives_the_backlog_and_its_wait(app: App) -> None:
    res = run_aioqueue(["info", "-q", "default", "--json", *server(app)])
    assert res.returncode == 0, res.stderr
    (row,) = json.loads(res.stdout)["queues"]
    assert row["queued"] == 0
    assert row["wait_s"] is None
