"""I11, one endpoint: every connection the package opens goes to the server its configuration
resolves to, never to a default address.

A **decoy** server listens on the default address (127.0.0.1:6379; if something else holds that
port, on another port named by ``AIOQUEUE_REDIS_URL``, the package's own default: redis-py's
built-in default, localhost:6379, then goes unwatched). For each kind of App (one row of
``BACKENDS``) every public operation (one row of ``OPERATIONS``) runs, and the decoy must have
received no command and no connection at all (``INFO commandstats``, ``INFO stats
total_connections_received``).

A decoy on the port of the URL's first host would make sense only for Sentinel, whose first
host is a sentinel: a sentinel refuses every data command, so an operation sent there fails
the test anyway.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.sentinel import Sentinel

from aioqueue import App, Batch, EmbeddedServerError, Worker
from aioqueue._store.connect import URL_ENV
from aioqueue._store.embedded import EmbeddedServer
from aioqueue.testing import unique_prefix

from .support.cluster import LocalCluster
from .support.sentinel import SERVICE, SentinelGroup
from .test_security import TlsEndpoint, tls  # noqa: F401 - stunnel in front of a server

DEFAULT_PORT = 6379


# ------------------------------------------------------------------ the decoy
@dataclass
class Decoy:
    """A server on the default address; ``traffic()`` is what it received from others."""

    server: EmbeddedServer
    probe: redis.Redis  # one connection of ours, held: it adds no connection to the count

    def traffic(self) -> tuple[int, dict[str, int]]:
        """Connections received, and calls per command, not counting our own INFO calls."""
        stats = self.probe.info("stats")
        commands = self.probe.info("commandstats")
        calls = {
            name.removeprefix("cmdstat_"): int(v["calls"])
            for name, v in commands.items()
            if name != "cmdstat_info"
        }
        return int(stats["total_connections_received"]), calls


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@pytest.fixture(scope="module")
def decoy() -> Iterator[Decoy]:
    """The decoy, on 6379 when that port is free (else on a port of its own, which
    ``AIOQUEUE_REDIS_URL`` then names: the package's default address in this process)."""
    port = DEFAULT_PORT if _port_free(DEFAULT_PORT) else None
    server = EmbeddedServer(port=port, appendonly=False)
    try:
        server.start()
    except EmbeddedServerError:  # taken between the look and the bind (another xdist worker)
        port = None
        server = EmbeddedServer(appendonly=False)
        server.start()
    try:
        saved = os.environ.get(URL_ENV)
        if port is None:  # 6379 is another process's: point the package's default here
            os.environ[URL_ENV] = server.url
        probe = redis.Redis(port=server.port, socket_timeout=10)
        try:
            yield Decoy(server, probe)
        finally:
            probe.close()
            if saved is None:
                os.environ.pop(URL_ENV, None)
            else:
                os.environ[URL_ENV] = saved
    finally:
        server.stop()


# ------------------------------------------------------------------ the kinds of App
@dataclass
class Target:
    """An App kind: how to make the App, and the URL the CLI gets for it (None: no CLI)."""

    make: Callable[[str], Awaitable[App]]
    cli_url: str | None


async def _url_app(url: str, prefix: str) -> App:
    return App(url, prefix=prefix)


@asynccontextmanager
async def _plain(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    url = request.getfixturevalue("aioqueue_url")
    yield Target(lambda p: _url_app(url, p), url)


@asynccontextmanager
async def _unix(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    if sys.platform == "win32":
        pytest.skip("unix sockets")
    server: EmbeddedServer = request.getfixturevalue("unix_server")
    yield Target(lambda p: _url_app(server.url, p), server.url)


@asynccontextmanager
async def _tls(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    endpoint: TlsEndpoint = request.getfixturevalue("tls")
    options = {"ssl_ca_certs": str(endpoint.ca)}

    async def make(prefix: str) -> App:
        return App(endpoint.url, prefix=prefix, redis_options=options)

    # the CLI takes no TLS options: a CA file from the URL's query
    yield Target(make, f"{endpoint.url}?ssl_ca_certs={endpoint.ca}")


@asynccontextmanager
async def _sentinel(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    group: SentinelGroup = request.getfixturevalue("sentinels")
    yield Target(lambda p: _url_app(group.url, p), group.url)


@asynccontextmanager
async def _cluster(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    cluster: LocalCluster = request.getfixturevalue("local_cluster")
    yield Target(lambda p: _url_app(cluster.url, p), cluster.url)


@asynccontextmanager
async def _given_client(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    url = request.getfixturevalue("aioqueue_url")
    clients: list[Redis] = []

    async def make(prefix: str) -> App:
        client = Redis.from_url(url)
        clients.append(client)
        return App(client=client, prefix=prefix)

    try:
        yield Target(make, None)  # the CLI takes a URL, not a client
    finally:
        for client in clients:
            await client.aclose()


@asynccontextmanager
async def _given_cluster_client(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    cluster: LocalCluster = request.getfixturevalue("local_cluster")
    seed = cluster.url.partition("://")[2].split(",")[0]
    clients: list[RedisCluster] = []

    async def make(prefix: str) -> App:
        client = RedisCluster.from_url(f"redis://{seed}")
        clients.append(client)
        return App(client=client, prefix=prefix)

    try:
        yield Target(make, None)
    finally:
        for client in clients:
            await client.aclose()


@asynccontextmanager
async def _given_sentinel_client(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    group: SentinelGroup = request.getfixturevalue("sentinels")
    made: list[tuple[Sentinel, Redis]] = []

    async def make(prefix: str) -> App:
        manager = Sentinel([("127.0.0.1", s.port) for s in group.sentinels])  # type: ignore[no-untyped-call]
        made.append((manager, manager.master_for(SERVICE)))
        return App(client=made[-1][1], prefix=prefix)

    try:
        yield Target(make, None)
    finally:
        for manager, client in made:
            await client.aclose()
            await manager.aclose()


BACKENDS: dict[str, Callable[[pytest.FixtureRequest], Any]] = {
    "plain": _plain,
    "tls": _tls,
    "unix": _unix,
    "sentinel": _sentinel,
    "cluster": _cluster,
    "client": _given_client,
    "cluster client": _given_cluster_client,
    "sentinel client": _given_sentinel_client,
}


@pytest.fixture(scope="module")
def unix_server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer(unix_socket=True, appendonly=False) as server:
        yield server


# ------------------------------------------------------------------ the operations
@dataclass
class Env:
    app: App
    cli_url: str | None


async def _double(x: int) -> int:
    return 2 * x


async def op_enqueue_and_worker(env: Env) -> None:
    job = await env.app.tasks["double"].enqueue(21)
    await Worker(env.app, burst=True).run()
    assert await job.result(timeout=20) == 42


async def op_busy_worker(env: Env) -> None:
    # more jobs than a claim asks for: the worker keeps two claims in flight, over the
    # connection its fetch loop holds for them (OrderedLine; not on a cluster client)
    task = env.app.tasks["double"]
    jobs = await task.enqueue_many([{"x": i} for i in range(20)])
    await Worker(env.app, concurrency=4, prefetch=0, max_batch=2, burst=True).run()
    assert [await j.result(timeout=20) for j in jobs] == [2 * i for i in range(20)]


async def op_enqueue_many(env: Env) -> None:
    task = env.app.tasks["double"]
    jobs = await task.enqueue_many([{"x": 1}, ((2,), {})])
    assert len(jobs) == 2


async def op_options_delay_cancel(env: Env) -> None:
    job = await env.app.tasks["double"].options(delay=timedelta(hours=1)).enqueue(1)
    assert await job.cancel()


async def op_pull_api(env: Env) -> None:
    q = env.app.queue("pull")
    await q.enqueue("double", [4], job_id="p1")
    [r] = await q.reserve(1)
    await q.complete(r, 8)
    assert (await q.job_info("p1")).state == "completed"


async def op_batch(env: Env) -> None:
    task = env.app.tasks["double"]
    batch: Batch[None] = await env.app.batch([task.call(1), task.call(2)])
    await Worker(env.app, burst=True).run()
    assert len(await batch.results()) == 2


async def op_schedules(env: Env) -> None:
    await env.app.schedules.add("double", every=timedelta(minutes=5), args=[1])
    assert [s.task for s in await env.app.schedules.list()] == ["double"]


async def op_registry_info_counts(env: Env) -> None:
    q = env.app.queue()
    assert isinstance(await q.workers(), list)
    assert isinstance(await q.counts(), dict)
    assert isinstance(await q.stats(), dict)


async def op_events(env: Env) -> None:
    q = env.app.queue("ev")
    await q.set_events(1000)
    await q.enqueue("double", [1], job_id="e1")
    events = env.app.events("ev", since="0", block=1.0)
    try:
        event = await asyncio.wait_for(anext(events), 20)
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    assert event.job_id == "e1"


async def op_sync_producer(env: Env) -> None:
    with env.app.sync() as sync:
        job = sync.enqueue(env.app.tasks["double"], 5)
        assert job.info().state.value == "queued"


async def op_dashboard_reads(env: Env) -> None:
    from aioqueue.dashboard._data import overview, workers_page

    names = [env.app.default_queue]
    assert (await overview(env.app, names))["queues"]
    assert isinstance(await workers_page(env.app, names), list)


async def op_metrics_collect(env: Env) -> None:
    pytest.importorskip("prometheus_client")
    from aioqueue.metrics import QueueCollector

    collector = QueueCollector(env.app, [env.app.default_queue])
    await collector.refresh()
    assert list(collector.collect())


async def op_cli(env: Env) -> None:
    if env.cli_url is None:
        return  # the CLI is given a URL; an App(client=...) has none to give it
    args = ["info", "--url", env.cli_url, "--prefix", env.app.prefix]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "aioqueue",
        *args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    assert env.app.default_queue in out.decode()


OPERATIONS: dict[str, Callable[[Env], Awaitable[None]]] = {
    "enqueue, a worker, result()": op_enqueue_and_worker,
    "a busy worker (two claims in flight)": op_busy_worker,
    "enqueue_many": op_enqueue_many,
    "options(delay), cancel": op_options_delay_cancel,
    "reserve/complete (pull API)": op_pull_api,
    "batch": op_batch,
    "schedules add/list": op_schedules,
    "workers(), counts, stats": op_registry_info_counts,
    "events()": op_events,
    "sync producer": op_sync_producer,
    "dashboard data": op_dashboard_reads,
    "metrics collect": op_metrics_collect,
    "CLI info": op_cli,
}


@pytest.mark.parametrize("kind", list(BACKENDS))
async def test_no_connection_reaches_the_default_address(
    kind: str, decoy: Decoy, request: pytest.FixtureRequest
) -> None:
    reached: dict[str, tuple[int, dict[str, int]]] = {}

    def step(name: str, before: tuple[int, dict[str, int]]) -> None:
        after = decoy.traffic()
        if after != before:
            reached[name] = (after[0] - before[0], _diff(before[1], after[1]))

    async with AsyncExitStack() as stack:
        target = await stack.enter_async_context(BACKENDS[kind](request))
        before = decoy.traffic()
        app = await target.make(unique_prefix())
        app.task(name="double")(_double)
        await stack.enter_async_context(app)
        step("open", before)
        env = Env(app, target.cli_url)
        for name, operation in OPERATIONS.items():
            before = decoy.traffic()
            await operation(env)
            step(name, before)
        before = decoy.traffic()
        await app.aclose()
        step("close", before)
    assert not reached, f"the decoy on the default address received: {reached}"


def _diff(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
