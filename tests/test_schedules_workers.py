"""Issue 15's acceptance test: three worker processes fire a one-second schedule for 20 s, one
of them is killed (SIGKILL) and the server restarted (AOF) on the way, and every tick runs
exactly once: no duplicates, and no tick missed (they are all reached within the grace)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from aioqueue import EmbeddedServer

from .cronapp import beats_key
from .support.apps import unique_prefix
from .support.processes import WorkerProcesses
from .support.server import retrying, server_ms
from .support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


@pytest.fixture
def prefix() -> str:
    return unique_prefix()


@pytest.fixture
async def admin(fresh_server: EmbeddedServer) -> AsyncIterator[Redis]:
    client = Redis.from_url(fresh_server.url, **retrying())
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def workers(tmp_path: Path, fresh_server: EmbeddedServer, prefix: str) -> Iterator[WorkerProcesses]:
    procs = WorkerProcesses(tmp_path, fresh_server.url, prefix, lease=2.0, app="tests.cronapp:app")
    try:
        yield procs
    finally:
        procs.close()


async def beats(redis: Redis, prefix: str) -> list[tuple[int, int]]:
    """(tick ms, attempt) of every recorded run of a beat job."""
    out = []
    for raw in await redis.lrange(beats_key(prefix), 0, -1):
        rec = json.loads(raw)
        out.append((int(rec["id"].rsplit(":", 1)[1]), int(rec["attempt"])))
    return out


async def enough(redis: Redis, prefix: str, since_ms: int, n: int) -> bool:
    """At least ``n`` distinct ticks later than ``since_ms`` ran."""
    return len({t for t, _ in await beats(redis, prefix) if t > since_ms}) >= n


def gaps(ticks: set[int], upto: int) -> list[int]:
    """The one-second ticks between the first run and ``upto`` that did not run."""
    first = min(ticks)
    return [t for t in range(first, upto, 1000) if t not in ticks]


async def test_three_workers_a_kill_and_a_server_restart_run_each_tick_exactly_once(
    fresh_server: EmbeddedServer, admin: Redis, workers: WorkerProcesses, prefix: str
) -> None:
    procs = [workers.start(concurrency=4) for _ in range(3)]
    start = await server_ms(admin)
    await wait_until(lambda: enough(admin, prefix, start, 4), timeout=90, what="4 ticks")
    workers.kill(procs[0])  # kill -9: no shutdown at all
    killed = await server_ms(admin)
    await wait_until(
        lambda: enough(admin, prefix, killed, 4),
        timeout=60,
        what="4 ticks after the kill",
    )
    await asyncio.to_thread(fresh_server.restart)
    restarted = await server_ms(admin)
    await wait_until(
        lambda: enough(admin, prefix, restarted, 4),
        timeout=90,
        what=f"4 ticks after the server restart; logs:\n{workers.logs()[-4000:]}",
    )
    first = min(t for t, _ in await beats(admin, prefix))

    async def covered() -> bool:
        # 20 s of ticks since the first one, every one of them run (a job held by the killed
        # worker comes back when its 2 s lease runs out)
        ticks = {t for t, _ in await beats(admin, prefix)}
        return max(ticks) - first >= 20_000 and not gaps(ticks, max(ticks) - 5_000)

    await wait_until(covered, timeout=120, interval=0.2, what="20 s of ticks, none missing")
    for proc in procs[1:]:
        proc.signal()
    for proc in procs[1:]:
        assert await proc.wait_exit(30) == 0
    runs = await beats(admin, prefix)
    first_runs = Counter(t for t, attempt in runs if attempt == 1)
    duplicates = {t: n for t, n in first_runs.items() if n > 1}
    assert not duplicates, f"ticks fired more than once: {duplicates}"
    ticks = {t for t, _ in runs}
    assert all(t % 1000 == 0 for t in ticks)
    assert max(ticks) - min(ticks) >= 20_000
    assert not gaps(ticks, max(ticks) - 5_000)
    print(
        f"\n{len(ticks)} ticks over {(max(ticks) - min(ticks)) / 1000:.0f} s, "
        f"{len(runs)} runs ({len(runs) - sum(first_runs.values())} retries of runs cut short)"
    )
