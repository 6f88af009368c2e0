"""Prometheus metrics (issue 14, point 3): a worker's own metrics and the queue exporter,
scraped over HTTP with httpx from real workers processing real jobs; their numbers move and
agree with ``Queue.counts()`` and ``aioqueue info``."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from aioqueue import App, Backoff, Retry, Worker, current_job
from aioqueue.metrics import OTHER_GROUPS, QueueCollector, WorkerMetrics, serve

from .support.apps import open_app
from .support.prewarmed import run_aioqueue
from .support.processes import REPO_ROOT, WorkerProcesses
from .support.waiting import wait_until

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name, frozenset(s.labels.items())] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 if none)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


async def scrape(url: str) -> Samples:
    async with httpx.AsyncClient(timeout=30) as client:
        r = await client.get(url)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=")
    return parse(r.text)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def lapp(redis_url: str) -> AsyncIterator[App]:
    """An App with a short lease, so that heartbeats renew leases often."""
    async with open_app(redis_url, lease=1.5) as app:
        yield app


async def test_a_worker_counts_its_jobs_leases_and_claims(lapp: App) -> None:
    app = lapp
    gate = asyncio.Event()

    @app.task
    async def ok(n: int) -> int:
        return n

    @app.task(max_attempts=2, backoff=Backoff(base=0.01, jitter=0.0))
    async def bad() -> None:
        raise ValueError("no")

    @app.task(max_attempts=3)
    async def again() -> str:
        if current_job().attempt == 1:
            raise Retry(delay=0.01)
        return "ok"

    @app.task
    async def held() -> None:
        await gate.wait()

    metrics = WorkerMetrics()
    server = await serve(metrics.registry, 0, "127.0.0.1")
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/metrics"
    q = app.default_queue
    try:
        jobs = [await ok.enqueue(i) for i in range(10)]
        await bad.enqueue()
        again_job = await again.enqueue()
        held_job = await held.enqueue()
        async with Worker(app, concurrency=8, metrics=metrics) as w:
            for j in jobs:
                await j.result(timeout=30)
            assert await again_job.result(timeout=30) == "ok"
            await wait_until(lambda: w.failed >= 3, timeout=30, what="bad's two failures")

            async def renewed() -> bool:
                s = await scrape(url)
                return value(s, "aioqueue_lease_renewals_total", queue=q) > 0

            await wait_until(renewed, timeout=30, what="a heartbeat renewing the held lease")
            s = await scrape(url)
            assert value(s, "aioqueue_jobs_running") == 1  # held, waiting on the gate
            gate.set()
            await held_job.result(timeout=30)
        s = await scrape(url)
    finally:
        server.close()
    assert value(s, "aioqueue_jobs_started_total", queue=q, task="ok") == 10
    assert value(s, "aioqueue_jobs_completed_total", queue=q, task="ok") == 10
    assert value(s, "aioqueue_jobs_started_total", task="bad") == 2
    assert value(s, "aioqueue_jobs_retried_total", task="bad") == 1
    assert value(s, "aioqueue_jobs_failed_total", task="bad") == 1
    assert value(s, "aioqueue_jobs_retried_total", task="again") == 1
    assert value(s, "aioqueue_jobs_completed_total", task="again") == 1
    assert value(s, "aioqueue_jobs_completed_total", task="held") == 1
    assert value(s, "aioqueue_job_duration_seconds_count", task="ok", outcome="completed") == 10
    assert value(s, "aioqueue_job_duration_seconds_count", task="bad", outcome="failed") == 1
    assert value(s, "aioqueue_jobs_running") == 0
    assert value(s, "aioqueue_worker_concurrency") == 8
    claims = value(s, "aioqueue_claims_total", queue=q)
    leased = value(s, "aioqueue_claimed_jobs_total", queue=q)
    handed = value(s, "aioqueue_handed_jobs_total", queue=q)
    assert claims >= 1
    assert leased + handed == 10 + 2 + 2 + 1  # every run was leased once
    assert value(s, "aioqueue_leases_lost_total") == 0
    stats = await app.queue().stats()
    assert stats["completed"] == 12  # what the server counted agrees
    assert value(s, "aioqueue_jobs_completed_total") == stats["completed"]


async def test_unknown_task_names_do_not_grow_the_series(app: App) -> None:
    metrics = WorkerMetrics()
    q = app.queue()
    for i in range(5):
        await q.enqueue(f"no_such_task_{i}", [])
    async with Worker(app, metrics=metrics, unknown_task_grace=0) as w:
        await wait_until(lambda: w.failed >= 5, timeout=30, what="five dead letters")
    s = parse(_text(metrics.registry))
    tasks = {dict(ls).get("task") for (n, ls) in s if n == "aioqueue_jobs_failed_total"}
    assert tasks == {"unknown"}
    assert value(s, "aioqueue_jobs_failed_total", task="unknown") == 5


def _text(registry: CollectorRegistry) -> str:
    from prometheus_client import generate_latest

    return generate_latest(registry).decode()


async def test_the_queue_exporter_agrees_with_counts_and_bounds_groups(app: App) -> None:
    @app.task
    async def noop() -> None:
        pass

    q = app.queue()
    for g in range(5):  # group g holds g+1 jobs
        for _ in range(g + 1):
            await noop.options(group=f"g{g}").enqueue()
    for _ in range(3):
        await noop.enqueue()
    await noop.options(delay=3600).enqueue()
    await q.pause()
    other = app.queue("other")
    await other.enqueue("noop", [])
    collector = QueueCollector(app, max_groups=2)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    await collector.refresh()
    s = parse(_text(registry))
    counts = await q.counts()
    for state, n in counts.items():
        assert value(s, "aioqueue_queue_jobs", queue=q.name, state=state) == n
    assert counts == {"scheduled": 1, "queued": 18, "active": 0, "failed": 0}
    assert value(s, "aioqueue_queue_jobs", queue="other", state="queued") == 1
    groups = {
        dict(ls)["group"]: v
        for (n, ls), v in s.items()
        if n == "aioqueue_queue_group_jobs" and dict(ls)["queue"] == q.name
    }
    assert groups == {"g4": 5, "g3": 4, OTHER_GROUPS: 1 + 2 + 3}
    assert value(s, "aioqueue_queue_groups", queue=q.name) == 5
    assert value(s, "aioqueue_queue_paused", queue=q.name) == 1
    assert value(s, "aioqueue_queue_paused", queue="other") == 0
    assert value(s, "aioqueue_queue_oldest_job_age_seconds", queue=q.name) >= 0
    assert value(s, "aioqueue_queue_events_total", queue=q.name, event="enqueued") == 19


def start_exporter(url: str, prefix: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    """``python -m aioqueue metrics`` in a process of its own, logging to ``log``."""
    args = [sys.executable, "-m", "aioqueue", "metrics", "--url", url, "--prefix", prefix]
    args += ["--port", str(port), "--host", "127.0.0.1"]
    with log.open("wb") as out:
        return subprocess.Popen(args, cwd=REPO_ROOT, stdout=out, stderr=out)


def info_row(url: str, prefix: str, queue: str) -> dict[str, Any]:
    """The queue's row of ``python -m aioqueue info --json``."""
    args = ["info", "--url", url, "--prefix", prefix, "-q", queue, "--json"]
    done = run_aioqueue(args, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    row: dict[str, Any] = json.loads(done.stdout)["queues"][0]
    return row


@pytest.mark.slow
async def test_both_endpoints_move_and_agree_with_info(
    tmp_path: Path, redis_url: str, prefix: str, producer: App
) -> None:
    wport, eport = free_port(), free_port()
    procs = WorkerProcesses(tmp_path, redis_url, prefix, app="tests.obsapp:app")
    exporter_log = tmp_path / "exporter.log"
    exporter = start_exporter(redis_url, prefix, eport, exporter_log)
    worker_url = f"http://127.0.0.1:{wport}/metrics"
    queue_url = f"http://127.0.0.1:{eport}/metrics"
    try:
        procs.start(concurrency=4, extra=("--metrics-port", str(wport)))
        q = producer.queue()

        async def up(url: str) -> bool:
            try:
                await scrape(url)
                return True
            except httpx.HTTPError:
                return False

        await wait_until(lambda: up(worker_url), timeout=60, what=f"{worker_url}:{procs.logs()}")
        await wait_until(lambda: up(queue_url), timeout=60, what=queue_url)
        first = [await q.enqueue("slow", [0.05]) for _ in range(40)]
        await q.enqueue("boom", ["bad"])

        async def moving() -> bool:  # scraped while the jobs run
            s = await scrape(worker_url)
            return 0 < value(s, "aioqueue_jobs_completed_total", task="slow") < 40

        await wait_until(moving, timeout=60, what="the worker's counter moving")
        for j in first:
            await j.result(timeout=60)

        async def dead() -> bool:
            return (await q.counts())["failed"] == 1

        await wait_until(dead, timeout=60, what="boom dead-lettered")
        ws, qs = await scrape(worker_url), await scrape(queue_url)
        row = await asyncio.to_thread(info_row, redis_url, prefix, q.name)
    finally:
        exporter.terminate()
        exporter.wait(30)
        procs.close()
        print(procs.logs(), exporter_log.read_text())
    assert value(ws, "aioqueue_jobs_completed_total", task="slow") == 40
    assert value(ws, "aioqueue_jobs_failed_total", task="boom") == 1
    # by name too, the task's declared max_attempts=2 (its workers declared it): one retry
    assert value(ws, "aioqueue_jobs_retried_total", task="boom") == 1
    for state in ("scheduled", "queued", "active", "failed"):
        assert value(qs, "aioqueue_queue_jobs", queue=q.name, state=state) == row[state]
    assert value(qs, "aioqueue_queue_dead_letters", queue=q.name) == row["failed"] == 1
    assert value(qs, "aioqueue_queue_workers", queue=q.name, alive="true") == row["workers"] == 1
    for event, n in row["stats"].items():
        assert value(qs, "aioqueue_queue_events_total", queue=q.name, event=event) == n
    assert row["stats"]["completed"] == value(ws, "aioqueue_jobs_completed_total")


async def raw_request(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
        await writer.wait_closed()


async def test_the_endpoint_answers_only_get_metrics_and_503_when_the_read_fails() -> None:
    registry = CollectorRegistry()
    failing = False

    async def before() -> None:
        if failing:
            raise ConnectionError("server away")

    server = await serve(registry, 0, "127.0.0.1", before=before)
    port = int(server.sockets[0].getsockname()[1])
    try:
        ok = await raw_request(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert ok.startswith(b"HTTP/1.1 200 OK\r\n")
        head = await raw_request(port, b"HEAD /metrics HTTP/1.1\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert head.endswith(b"\r\n\r\n")  # no body
        assert (await raw_request(port, b"GET / HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 404")
        post = await raw_request(port, b"POST /metrics HTTP/1.1\r\n\r\n")
        assert post.startswith(b"HTTP/1.1 405")
        garbage = await raw_request(port, b"\x00\x01 nonsense\r\n\r\n")
        assert garbage.startswith(b"HTTP/1.1 400")
        too_long = await raw_request(port, b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n")
        assert too_long.startswith(b"HTTP/1.1 400")
        failing = True
        down = await raw_request(port, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert down.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
        assert down.endswith(b"scrape failed: ConnectionError\n")
    finally:
        server.close()


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_aioqueue(args, cwd=REPO_ROOT)


def test_bad_ports_are_refused_before_anything_starts() -> None:
    for bad in (("--metrics-port", "-1"), ("--metrics-port", "65535", "--processes", "2")):
        result = run_cli("worker", "tests.obsapp:app", *bad)
        assert result.returncode == 2, bad
        assert "--metrics-port must be" in result.stderr
    result = run_cli("metrics", "--port", "70000")
    assert result.returncode == 2
    assert "--port must be 0-65535" in result.stdout + result.stderr


@pytest.mark.slow
async def test_supervised_workers_serve_a_port_each(
    tmp_path: Path, redis_url: str, prefix: str, producer: App
) -> None:
    port = free_port()
    while True:  # two free ports in a row
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
                break
            except OSError:
                port = free_port()
    procs = WorkerProcesses(tmp_path, redis_url, prefix, app="tests.obsapp:app")
    sup = procs.start(extra=("--processes", "2", "--metrics-port", str(port)))
    try:
        jobs = [await producer.queue().enqueue("ok", [i]) for i in range(20)]
        for j in jobs:
            await j.result(timeout=60)

        async def both_serve() -> bool:
            try:
                a, b = (
                    await scrape(f"http://127.0.0.1:{port}/metrics"),
                    await scrape(f"http://127.0.0.1:{port + 1}/metrics"),
                )
            except httpx.HTTPError:
                return False
            done = value(a, "aioqueue_jobs_completed_total") + value(
                b, "aioqueue_jobs_completed_total"
            )
            return done == 20

        await wait_until(both_serve, timeout=60, what=f"both workers' metrics:\n{procs.logs()}")
    finally:
        sup.signal()
        await sup.wait_exit(60)
        procs.close()


class Broken(WorkerMetrics):
    """A metrics observer with a bug in every call."""

    def _of(self, queue: str, name: str) -> Any:
        raise RuntimeError("metrics bug")


async def test_a_bug_in_the_metrics_never_stops_a_job_or_the_worker(
    lapp: App, caplog: pytest.LogCaptureFixture
) -> None:
    app = lapp

    @app.task
    async def ok(n: int) -> int:
        return n

    broken = Broken()
    broken.claims = None  # type: ignore[assignment]  # claimed() raises too
    jobs = [await ok.enqueue(i) for i in range(5)]
    async with Worker(app, metrics=broken):
        for i, j in enumerate(jobs):
            assert await j.result(timeout=30) == i
    failures = {r.getMessage() for r in caplog.records if r.getMessage().startswith("metrics:")}
    assert "metrics: job_started failed; going on" in failures
    assert "metrics: job_done failed; going on" in failures
    assert "metrics: claimed failed; going on" in failures


async def test_a_parked_run_counts_as_returned_not_failed(lapp: App) -> None:
    app = lapp

    @app.task
    async def napper() -> str:
        await current_job().sleep(0.2)
        return "rested"

    metrics = WorkerMetrics()
    server = await serve(metrics.registry, 0, "127.0.0.1")
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/metrics"
    try:
        async with Worker(app, concurrency=2, metrics=metrics):
            assert await (await napper.enqueue()).result(timeout=30) == "rested"
        s = await scrape(url)
    finally:
        server.close()
    assert value(s, "aioqueue_jobs_returned_total", task="napper", reason="parked") == 1
    assert value(s, "aioqueue_jobs_failed_total", task="napper") == 0
    assert value(s, "aioqueue_jobs_retried_total", task="napper") == 0
    assert value(s, "aioqueue_jobs_completed_total", task="napper") == 1
