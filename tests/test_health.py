"""Health checks: the worker's ``GET /healthz`` endpoint (in process, behind a server that
stops answering, and in a real worker process) and ``python -m aioqueue health``."""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest
from redis.asyncio import Redis

from aioqueue import Worker
from aioqueue._worker.health import start_health_server

from .support.apps import open_app
from .support.ports import PortTaken, free_port, on_a_free_port_async
from .support.prewarmed import run_aioqueue
from .support.processes import REPO_ROOT, WorkerProcess, WorkerProcesses
from .support.proxy import ReplyDropProxy
from .support.server import blocked_in
from .support.waiting import wait_until


async def get(port: int, path: str = "/healthz", method: str = "GET") -> tuple[int, str]:
    """One HTTP/1.1 request to 127.0.0.1:port; (status, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: probe\r\n\r\n".encode())
        await writer.drain()
        async with asyncio.timeout(10):
            raw = await reader.read()  # the server closes the connection after its answer
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if method != "HEAD":  # HEAD: the length of the body a GET would get, and no body
        assert b"Content-Length: %d" % len(body) in head
    return status, body.decode()


async def status_of(port: int) -> int:
    return (await get(port))[0]


def port_of(server: asyncio.Server) -> int:
    return int(server.sockets[0].getsockname()[1])


# ---------------------------------------------------------------------- the endpoint
async def test_healthz_follows_the_worker_from_start_to_stop(redis_url: str) -> None:
    async with open_app(redis_url, lease=1.0) as app:
        worker = Worker(app, concurrency=2)
        server = await start_health_server(lambda: worker.alive, "127.0.0.1", 0)
        port = port_of(server)
        try:
            assert await get(port) == (503, "unhealthy: no recent heartbeat\n")  # not started
            async with worker:
                await asyncio.wait_for(worker.ready.wait(), 10)
                assert await get(port) == (200, "ok\n")
                assert await get(port, "/healthz?probe=1", "HEAD") == (200, "")
                assert (await get(port, "/metrics"))[0] == 404
                assert (await get(port, method="POST"))[0] == 405
            assert await status_of(port) == 503  # stopped
        finally:
            server.close()
            await server.wait_closed()


async def test_healthz_answers_503_once_heartbeats_stop_reaching_the_server(
    redis_url: str,
) -> None:
    """A worker whose server silently stops answering is still running, but its heartbeats
    fail: after three heartbeat periods the probe gets 503 (and Kubernetes restarts it)."""
    async with (
        ReplyDropProxy(redis_url) as proxy,
        open_app(proxy.url, lease=1.0, socket_timeout=1) as app,
    ):
        worker = Worker(app, concurrency=2, idle_block=0.2)
        server = await start_health_server(lambda: worker.alive, "127.0.0.1", 0)
        port = port_of(server)
        task = asyncio.create_task(worker.run())
        try:
            await asyncio.wait_for(worker.ready.wait(), 10)
            await wait_until(lambda: _equals(port, 200), what="200 from a working worker")
            proxy.mute()
            await wait_until(lambda: _equals(port, 503), timeout=15, what="503 after the mute")
            assert not task.done(), "the worker itself keeps running"
        finally:
            worker.stop(force=True)
            await asyncio.wait({task}, timeout=30)
            server.close()
            await server.wait_closed()


async def _equals(port: int, expected: int) -> bool:
    return await status_of(port) == expected


async def test_a_garbled_request_gets_400_and_the_endpoint_keeps_serving() -> None:
    server = await start_health_server(lambda: True, "127.0.0.1", 0)
    port = port_of(server)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"\x00\xff garbage\r\n\r\n")
        await writer.drain()
        async with asyncio.timeout(10):
            assert (await reader.read()).startswith(b"HTTP/1.1 400 ")
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"G" * 20_000)  # a head past the limit, never ended
        await writer.drain()
        async with asyncio.timeout(10):
            assert (await reader.read()).startswith(b"HTTP/1.1 400 ")
        writer.close()
        assert await get(port) == (200, "ok\n")
    finally:
        server.close()
        await server.wait_closed()


# ---------------------------------------------------------------------- worker processes
def health_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_aioqueue(["health", *args], cwd=REPO_ROOT)


async def worker_serving_health(
    workers: WorkerProcesses, redis: Redis
) -> tuple[WorkerProcess, int]:
    """A worker process blocked idle and serving ``/healthz`` on a free port, and that port;
    on a new port when the one picked was taken before the worker bound it (it exits,
    saying so)."""

    async def start(port: int) -> tuple[WorkerProcess, int]:
        proc = workers.start(
            lease=2.0, extra=("--health-port", str(port), "--health-host", "127.0.0.1")
        )

        async def settled() -> bool:
            # (its health server is bound before it runs: idle means it serves)
            return proc.popen.poll() is not None or await blocked_in(redis, proc.name)

        await wait_until(settled, timeout=15, what=f"worker {proc.name} to block idle or exit")
        if proc.popen.poll() is None:
            return proc, port
        assert "cannot serve --health-port" in proc.log_text(), proc.log_text()
        raise PortTaken(port)

    return await on_a_free_port_async(start)


@pytest.mark.slow
async def test_health_command_and_endpoint_of_a_worker_process(
    workers: WorkerProcesses, redis_url: str, redis: Redis, prefix: str
) -> None:
    options = ("--url", redis_url, "--prefix", prefix)
    before = health_cli(*options)
    assert (before.returncode, before.stdout, before.stderr) == (
        1,
        "unhealthy: no live worker on queue 'default' (0 registered)\n",
        "",
    )
    proc, port = await worker_serving_health(workers, redis)
    assert await get(port) == (200, "ok\n")
    up = health_cli(*options)
    assert (up.returncode, up.stdout) == (
        0,
        "ok: 1 live worker(s) on queue 'default' (1 registered)\n",
    )
    as_json = health_cli(*options, "--json")
    assert as_json.returncode == 0
    assert json.loads(as_json.stdout) == {
        "healthy": True,
        "queue": "default",
        "server": True,
        "live_workers": 1,
        "registered_workers": 1,
        "error": None,
    }
    other = health_cli(*options, "-q", "other")
    assert other.returncode == 1  # nobody consumes that queue
    proc.signal()
    assert await proc.wait_exit(30) == 0
    after = health_cli(*options)
    assert after.returncode == 1, after.stdout  # it left the registry on its way out


def test_health_command_without_a_server_exits_1_with_one_line() -> None:
    result = health_cli("--url", f"redis://127.0.0.1:{free_port()}/0", "--timeout", "3", "--json")
    assert result.returncode == 1
    status = json.loads(result.stdout)
    assert status["healthy"] is False
    assert status["server"] is False
    assert status["error"]
    plain = health_cli("--url", f"redis://127.0.0.1:{free_port()}/0", "--timeout", "3")
    assert plain.returncode == 1
    assert plain.stdout.startswith("unhealthy: ")
    assert plain.stdout.count("\n") == 1


def test_health_command_refuses_a_bad_command_line() -> None:
    assert health_cli("--timeout", "0").returncode == 2
    bad_url = health_cli("--url", "http://nope")
    assert bad_url.returncode == 2
    assert bad_url.stderr.startswith("aioqueue: error: ")
