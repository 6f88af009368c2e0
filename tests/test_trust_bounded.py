"""Inputs nobody trusted (issue 24, points 6, 7 and 9): garbled and oversized listing cursors
are a typed error in the API and a 400 on the dashboard; the dashboard answers only the hosts
it is meant for; names planted in Redis neither hide the real queues nor flood a listing or
the exporter's series; planted unique locks do not block a key; a payload nested too deeply
is a SerializationError; every ``--json`` value is JSON-native (ISO 8601 times); the metrics
exporter started against an unreachable server serves 503 instead of dying.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from aioqueue import App, ConfigurationError, SerializationError, Worker
from aioqueue._cli.format import plain
from aioqueue.dashboard import create_app
from aioqueue.dashboard._security import local_hosts
from aioqueue.metrics import EVENTS, QueueCollector

from .support.apps import drop_keys
from .support.ports import free_port
from .support.prewarmed import run_aioqueue
from .support.server import text
from .support.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent


def cursor_of(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode()


BAD_CURSORS = [
    "!!not base64!!",
    cursor_of([1, 2]),
    cursor_of({"src": "ready", "an": [f"a{i}" for i in range(1400)], "pos": 0}),
    cursor_of({"src": "ready", "an": "abc", "pos": 0}),
    cursor_of({"src": "ready", "an": [], "pos": -5}),
    cursor_of({"src": "ready", "an": [], "pos": 2**60}),
    cursor_of({"src": "scheduled", "sc": "NaN", "id": "x"}),
    cursor_of({"src": "ready", "extra": 1}),
    "A" * 5000,
]


# ----------------------------------------------------------------------- cursors (point 6)
async def test_garbled_or_oversized_cursors_are_a_configuration_error(app: App) -> None:
    q = app.queue()
    for i in range(5):
        await q.enqueue("t", [i])
    first = await q.jobs("queued", limit=2)
    assert first.cursor is not None
    assert len((await q.jobs("queued", limit=2, cursor=first.cursor)).items) == 2
    for bad in BAD_CURSORS:
        with pytest.raises(ConfigurationError, match="invalid cursor"):
            await q.jobs("queued", limit=2, cursor=bad)


async def test_the_dashboard_answers_a_garbled_cursor_with_400(app: App) -> None:
    await app.queue().enqueue("t", [1])
    web = create_app(app, auth=None)
    transport = httpx.ASGITransport(app=web)
    async with httpx.AsyncClient(transport=transport, base_url="http://dash.test") as c:
        assert (await c.get("/queues/default?state=queued")).status_code == 200
        for bad in BAD_CURSORS:
            r = await c.get("/queues/default", params={"state": "queued", "cursor": bad})
            assert r.status_code == 400, (bad[:40], r.status_code)
            assert "invalid cursor" in r.text


# ----------------------------------------------------------------------- Host (point 9)
async def test_a_foreign_host_header_gets_400(app: App) -> None:
    web = create_app(app, auth=None, allowed_hosts=[*local_hosts("127.0.0.1"), "dash.example"])
    transport = httpx.ASGITransport(app=web)
    for base in (
        "http://127.0.0.1:8080",
        "http://localhost",
        "http://[::1]:9",
        "http://dash.example",
    ):
        async with httpx.AsyncClient(transport=transport, base_url=base) as c:
            assert (await c.get("/")).status_code == 200, base
    for base in ("http://evil.example", "http://127.0.0.1.evil.example:8080"):
        async with httpx.AsyncClient(transport=transport, base_url=base) as c:
            r = await c.get("/")
            assert r.status_code == 400, base
            assert "invalid Host header" in r.text
    assert local_hosts("0.0.0.0") == ["localhost", "127.0.0.1", "[::1]"]
    assert "[fe80::1]" in local_hosts("fe80::1")


def test_the_dashboard_command_allows_only_its_address_and_the_given_hosts(
    aioqueue_url: str, tmp_path: Path
) -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "aioqueue", "dashboard", "--url", aioqueue_url, "--no-auth"]
    cmd += ["--port", str(port), "--allowed-host", "queues.internal"]
    log = tmp_path / "dashboard.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        url = f"http://127.0.0.1:{port}/"

        def up() -> bool:
            try:
                httpx.get(url, timeout=2)
            except httpx.TransportError:
                return False
            return True

        asyncio.run(wait_until(up, timeout=60, what="the dashboard listening"))
        assert httpx.get(url, timeout=10).status_code == 200
        for host, status in (
            (f"localhost:{port}", 200),
            ("queues.internal", 200),
            ("attacker.example", 400),
            (f"attacker.example:{port}", 400),
        ):
            assert httpx.get(url, headers={"Host": host}, timeout=10).status_code == status, host
    finally:
        proc.terminate()
        proc.wait(30)


# ------------------------------------------------------------------ real names (point 7)
async def plant_fake_queues(redis: Redis, prefix: str, n: int) -> None:
    pipe = redis.pipeline(transaction=False)
    for i in range(n):
        pipe.hset(f"{prefix}:{{fake{i}}}:stats", "enqueued", 1)
    await pipe.execute()


@pytest.mark.no_cover  # a test of scale: coverage paused (tests/conftest.py, "Coverage")
async def test_planted_queues_never_crowd_out_the_real_ones(app: App, redis: Redis) -> None:
    real = ["zeta", "omega", "yotta"]  # sorted after "fake...": a SCAN would find fakes first
    await plant_fake_queues(redis, app.prefix, 20_000)
    for name in real:
        await app.queue(name).enqueue("t", [1])
    async with Worker(app, queues=real, concurrency=1) as w:
        await asyncio.wait_for(w.ready.wait(), 30)
    # a dashboard and an exporter of another process: no tasks of its own
    async with App(app.url, prefix=app.prefix) as other:
        web = create_app(other, auth=None)
        transport = httpx.ASGITransport(app=web)
        async with httpx.AsyncClient(transport=transport, base_url="http://dash.test") as c:
            page = (await c.get("/")).text
        for name in real:
            assert f"/queues/{name}" in page, name
        collector = QueueCollector(other)
        await collector.refresh()
        names = [s.name for s in collector._snapshot]
        assert names[:3] == sorted(real)
        assert len(names) <= 1000
    await drop_keys(redis, app.prefix)


async def test_a_queue_declared_by_the_app_comes_first(app: App, redis: Redis) -> None:
    await plant_fake_queues(redis, app.prefix, 2_000)

    @app.task(queue="zz-declared")
    async def declared() -> None:
        pass

    collector = QueueCollector(app)
    await collector.refresh()
    assert collector._snapshot[0].name == "zz-declared"


async def test_junk_fields_in_stats_do_not_become_series(app: App, redis: Redis) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    q = app.queue()
    await q.enqueue("t", [1])
    await redis.hset(q._keys.stats, mapping={str(i): i for i in range(5000)})
    collector = QueueCollector(app, ["default"])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    await collector.refresh()
    lines = [
        ln
        for ln in generate_latest(registry).decode().splitlines()
        if ln.startswith("aioqueue_queue_events")
    ]
    assert 1 <= len(lines) <= 2 * len(EVENTS)  # a _total and a _created line at most each
    assert all('event="' in ln for ln in lines)
    assert not any('event="42"' in ln for ln in lines)


# ------------------------------------------------------------------ unique locks (point 9)
def noop_task(app: App) -> Any:
    @app.task
    async def work() -> None:
        pass

    return work


async def test_a_planted_century_lock_is_taken(app: App, redis: Redis) -> None:
    work = noop_task(app)
    q = app.queue()
    holder = await q.enqueue("t", [1])  # a real job, so only the TTL makes the lock stale
    key = q._keys.unique("k")
    await redis.set(key, holder.id, px=100 * 365 * 24 * 3600 * 1000)
    job = await work.options(unique_key="k", unique_for=60).enqueue()
    assert job.id != holder.id
    assert text(await redis.get(key)) == job.id
    assert 0 < await redis.pttl(key) <= 60_000


async def test_a_planted_lock_naming_a_missing_job_is_taken(app: App, redis: Redis) -> None:
    work = noop_task(app)
    q = app.queue()
    key = q._keys.unique("k")
    await redis.set(key, "no-such-job", px=30_000)
    job = await work.options(unique_key="k", unique_for=60).enqueue()
    assert job.id != "no-such-job"
    assert text(await redis.get(key)) == job.id
    # a lock held by a job that exists, within its bound, still holds
    again = await work.options(unique_key="k", unique_for=60).enqueue()
    assert again.id == job.id


async def test_a_ttl_scoped_lock_outlives_its_job(app: App, redis: Redis) -> None:
    work = noop_task(app)
    q = app.queue()
    key = q._keys.unique("k")
    # scope ttl: the lock is meant to outlive its job, so a missing holder is not stale
    await redis.set(key, "finished-long-ago", px=30_000)
    job = await work.options(unique_key="k", unique_scope="ttl", unique_for=60).enqueue()
    assert job.id == "finished-long-ago"


# ------------------------------------------------------------------------ pickle (point 9)
async def test_a_too_deep_value_is_a_serialization_error(redis_url: str) -> None:
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    for serializer in ("pickle", "json"):
        opts: dict[str, Any] = {"allow_unsigned_pickle": True} if serializer == "pickle" else {}
        async with App(redis_url, prefix=f"deep{serializer}", serializer=serializer, **opts) as app:
            with pytest.raises(SerializationError, match="cannot serialise"):
                await app.queue().enqueue("t", [deep])


# ------------------------------------------------------------------------ --json (point 9)
def test_json_output_is_json_native() -> None:
    from datetime import UTC, date, timedelta
    from decimal import Decimal
    from uuid import UUID

    value = {
        "at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        "day": date(2026, 1, 2),
        "took": timedelta(seconds=1.5),
        "n": float("nan"),
        "id": UUID(int=1),
        "d": Decimal("1.10"),
        "s": {2, 1},
    }
    out = json.loads(json.dumps(plain(value), allow_nan=False))
    assert out["at"] == "2026-01-02T03:04:05+00:00"
    assert out["day"] == "2026-01-02"
    assert out["took"] == 1.5
    assert out["n"] is None
    assert out["id"] == str(UUID(int=1))
    assert out["d"] == "1.10"
    assert out["s"] == [1, 2]


async def test_workers_json_prints_iso_8601_times(app: App, aioqueue_url: str) -> None:
    async with Worker(app, concurrency=1) as w:
        await asyncio.wait_for(w.ready.wait(), 30)
        cmd = ["workers", "--json", "--url", aioqueue_url, "--prefix", app.prefix]
        proc = await asyncio.to_thread(functools.partial(run_aioqueue, cmd, cwd=ROOT))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    (worker,) = out["workers"]
    assert "datetime.datetime" not in proc.stdout
    for field in ("started", "last_beat"):
        assert datetime.fromisoformat(worker[field]).tzinfo is not None


# ------------------------------------------------------------------- metrics (point 9)
def test_the_exporter_serves_503_while_its_server_is_unreachable(tmp_path: Path) -> None:
    port, closed = free_port(), free_port()
    cmd = [sys.executable, "-m", "aioqueue", "metrics", "--url", f"redis://127.0.0.1:{closed}/0"]
    cmd += ["--port", str(port), "--host", "127.0.0.1"]
    log = tmp_path / "metrics.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        answers: list[int] = []

        def answered() -> bool:
            assert proc.poll() is None, "the exporter exited"
            try:
                answers.append(httpx.get(url, timeout=10).status_code)
            except httpx.TransportError:
                return False
            return True

        asyncio.run(wait_until(answered, timeout=60, what="the exporter answering"))
        assert answers[-1] == 503
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(30)
    out = log.read_text()
    assert "Traceback" not in out, out
    assert "serving 503" in out
