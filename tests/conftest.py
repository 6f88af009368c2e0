"""Fixtures for a suite that talks to a real Valkey/Redis server, never a fake.

The server comes from the ``aioqueue.testing`` pytest plugin (registered by the installed
package): one embedded server serves the whole session, or the server named by
``AIOQUEUE_TEST_REDIS_URL``. Each test is isolated by a unique key prefix, so the suite runs in
parallel (pytest-xdist, ``python3 dev.py test`` passes ``-n 4 --dist loadgroup``): each worker
process is a session of its own, with its own embedded server and, once a test needs it, its
own local cluster, shared by that worker's tests. A test that changes a server's configuration,
flushes it or kills its clients uses a server of its own (``fresh_server``). The names below
are the suite's own for the plugin's fixtures.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import cast
from uuid import uuid4

import pytest
from redis.asyncio import Redis, RedisCluster

from aioqueue import App
from aioqueue._store.embedded import EmbeddedServer
from aioqueue.testing import unique_prefix

from .support.cluster import LocalCluster
from .support.processes import WorkerProcesses, worker_processes
from .support.sentinel import SentinelGroup

pytest_plugins = ["pytester", "tests.support.groups"]


@pytest.fixture(scope="session")
def valkey_server(aioqueue_server: EmbeddedServer | None) -> EmbeddedServer | None:
    """The session's embedded server; ``None`` when ``AIOQUEUE_TEST_REDIS_URL`` names an
    external server (the plugin's ``aioqueue_server``)."""
    return aioqueue_server


# ---------------------------------------------------------------- parallel runs
# Modules whose module-scoped fixture starts servers of their own (a cluster of 6 nodes, a
# Sentinel set of 5 processes): under pytest-xdist their tests stay on one worker, which starts
# those servers once rather than once per worker (``--dist loadgroup``). A test file of other
# needs can mark its tests ``pytest.mark.xdist_group("name")`` itself.
ONE_WORKER_MODULES = ("test_cluster.py", "test_sentinel.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in ONE_WORKER_MODULES:
            item.add_marker(pytest.mark.xdist_group(item.path.stem))


# ---------------------------------------------------------------- coverage
# Coverage: the tests of scale and chaos (10,000 jobs and more, the model-based test, the
# soak) are marked ``no_cover`` (pytest-cov pauses its tracer while they run). They repeat the
# paths that the suite's other tests cover one by one, and the tracer's cost grows with their
# size: the paging of 100,000 jobs took 16.7 s of CPU traced, 11.7 s paused and 8.6 s without
# coverage at all (`-n 0`, the 3.1 s of an empty run included in each). The total stays 87 %.


# ---------------------------------------------------------------- backends
# A test marked ``cluster`` runs twice: on the session's server (``[standalone]``) and on a
# local Valkey Cluster (``[cluster]``: 3 primaries, 3 replicas, started once, on first use).
# It gets the backend through ``redis_url`` (and so ``app``, ``redis``, ``workers``,
# ``producer``); a test that uses none of them runs once.
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.get_closest_marker("cluster") and "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", ["standalone", "cluster"], indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """``"standalone"``, or ``"cluster"`` for the cluster run of a test marked ``cluster``."""
    return str(getattr(request, "param", "standalone"))


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster]:
    """The session's local Valkey Cluster (tests that kill its nodes start their own)."""
    with LocalCluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def sentinels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelGroup]:
    """A Sentinel deployment (one primary, one replica) for the tests of a module that kill
    nothing (each works under its own prefix)."""
    group = SentinelGroup(tmp_path_factory.mktemp("sentinels"))
    try:
        group.wait_ready()
        yield group
    finally:
        group.close()


@pytest.fixture
def redis_url(request: pytest.FixtureRequest, backend: str, aioqueue_url: str) -> str:
    """The URL of the server the tests share (the plugin's ``aioqueue_url``), or of the
    session's local cluster in a test's cluster run."""
    if backend == "cluster":
        return cast(LocalCluster, request.getfixturevalue("local_cluster")).url
    return aioqueue_url


@pytest.fixture
async def app(redis_url: str) -> AsyncIterator[App]:
    """An open ``App`` on ``redis_url`` whose keys live under a prefix unique to this test
    (what the plugin's ``aioqueue_app`` is on the session's server)."""
    async with App(redis_url, prefix=unique_prefix()) as app:
        yield app


@pytest.fixture
async def redis(redis_url: str, backend: str) -> AsyncIterator[Redis]:
    """A raw redis-py client (bytes responses) on the shared server, for inspecting keys (a
    ``RedisCluster`` in a cluster run)."""
    if backend == "cluster":
        seed = redis_url.partition("://")[2].split(",")[0]
        cluster = RedisCluster.from_url(f"redis://{seed}", socket_timeout=None)
        client = cast(Redis, cluster)  # the commands the tests use, routed by key
    else:
        client = Redis.from_url(redis_url, socket_timeout=None)  # see App(socket_timeout=)
    try:
        # connected now, before the test loads the server (a busy server, or a busy machine,
        # can make a first connection made mid-test time out)
        await client.ping()
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def fresh_server() -> Iterator[EmbeddedServer]:
    """A private server with an AOF, for tests that kill or restart it."""
    with EmbeddedServer(appendonly=True) as server:
        yield server


# ---------------------------------------------------------------- real worker processes
# (a test file with other needs, e.g. workers on a private server, defines its own)
@pytest.fixture
def prefix() -> str:
    """A key prefix of its own for a test with worker processes."""
    return f"t{uuid4().hex[:12]}"


@pytest.fixture
def workers(tmp_path: Path, redis_url: str, prefix: str) -> Iterator[WorkerProcesses]:
    """Real worker processes of the suite's server on ``prefix`` (their logs printed after)."""
    with worker_processes(tmp_path, redis_url, prefix) as procs:
        yield procs


@pytest.fixture
async def producer(redis_url: str, prefix: str) -> AsyncIterator[App]:
    """An open App on ``prefix``, to enqueue for the worker processes."""
    async with App(redis_url, prefix=prefix) as app:
        yield app
