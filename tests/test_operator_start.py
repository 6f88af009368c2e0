"""The operator's first steps (issue 29, points 1 and 2): a worker is registered and serving when
``async with Worker`` returns, ``info`` lists it before any job, a burst worker stores every
declared schedule before it exits; workers declare the tasks they serve with their defaults,
and enqueue by name (API, sync client, CLI) uses those defaults and catches a name no live
worker knows, with a suggestion; a worker warns about jobs of tasks it does not know.

Real worker processes (``python -m aioqueue worker``) run a small app module written to a
temporary directory; the CLI runs as a subprocess.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from aioqueue import App, StartupFailed, UnknownTask, UsageError, Worker
from aioqueue._queue.tasktable import REFRESH, lookup, register

from .support.apps import unique_prefix
from .support.prewarmed import run_aioqueue
from .support.processes import WorkerProcess
from .support.waiting import wait_until

APP_MODULE = textwrap.dedent(
    """
    import os

    from aioqueue import App

    app = App(
        prefix=os.environ["OP_PREFIX"],
        max_attempts=3,
        heartbeat=float(os.environ.get("OP_HEARTBEAT", "2")),
    )


    @app.task(max_attempts=1, priority=7)
    async def send_invoice(n: int) -> int:
        return n


    @app.task
    async def add(a: int, b: int) -> int:
        return a + b


    for i in range(4):
        app.schedule("add", every=3600, args=(i, i), name=f"sum-{i}")
    """
)
OTHER_MODULE = textwrap.dedent(
    """
    import os

    from aioqueue import App

    app = App(prefix=os.environ["OP_PREFIX"], heartbeat=float(os.environ["OP_HEARTBEAT"]))


    @app.task
    async def unrelated() -> None: ...
    """
)
SCHEDULES = {f"sum-{i}" for i in range(4)}


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "opapp.py").write_text(APP_MODULE)
    (tmp_path / "otherapp.py").write_text(OTHER_MODULE)
    return tmp_path


def _env(prefix: str, heartbeat: float = 2.0) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "AIOQUEUE_REDIS_URL"}
    env["OP_PREFIX"] = prefix
    env["OP_HEARTBEAT"] = str(heartbeat)
    return env


def cli(cwd: Path, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m aioqueue ARGS`` with the app module's prefix (``--prefix`` too, but for
    ``worker``, whose App gives it), to its end."""
    where = () if args[0] == "worker" else ("--prefix", prefix)
    return run_aioqueue([*args, *where], cwd=cwd, env=_env(prefix), timeout=90)


class Workers:
    """Worker processes of ``opapp:app`` on one prefix; killed at the end of the test."""

    def __init__(self, cwd: Path, url: str, prefix: str) -> None:
        self.cwd, self.url, self.prefix = cwd, url, prefix
        self.procs: list[WorkerProcess] = []

    def start(self, *extra: str, app: str = "opapp:app", heartbeat: float = 2.0) -> WorkerProcess:
        log = self.cwd / f"worker{len(self.procs) + 1}.log"
        args = [sys.executable, "-m", "aioqueue", "worker", app, "--url", self.url]
        args += ["--log-level", "INFO", *extra]
        with log.open("wb") as out:
            env = _env(self.prefix, heartbeat)
            popen = subprocess.Popen(
                args, cwd=self.cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )
        proc = WorkerProcess(popen, f"w{len(self.procs) + 1}", log)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for p in self.procs:
            if p.popen.poll() is None:
                p.popen.kill()
            p.popen.wait(10)


@pytest.fixture
def op_prefix() -> str:
    return unique_prefix()


@pytest.fixture
def op_workers(app_dir: Path, redis_url: str, op_prefix: str) -> Iterator[Workers]:
    procs = Workers(app_dir, redis_url, op_prefix)
    try:
        yield procs
    finally:
        procs.close()
        for p in procs.procs:
            print(f"--- {p.name}:\n{p.log_text()}")  # shown when the test failed


@pytest.fixture
async def op_app(redis_url: str, op_prefix: str) -> AsyncIterator[App]:
    """A producer on the workers' prefix that does not import their code."""
    async with App(redis_url, prefix=op_prefix, max_attempts=3) as app:
        yield app


async def live_worker(app: App, proc: WorkerProcess) -> None:
    """Wait until the worker is registered and has declared its tasks (just after)."""

    async def listed() -> bool:
        assert proc.popen.poll() is None, proc.log_text()
        q = app.queue()
        if not any(w.pid == proc.pid and w.alive for w in await q.workers()):
            return False
        return (await lookup(q._scripts, q.name, "send_invoice")).declared is not None

    await wait_until(listed, timeout=60, what=f"worker pid {proc.pid} registered and declared")


# ---------------------------------------------------------------------- point 1
async def test_async_with_returns_once_the_worker_is_registered_and_serving(app: App) -> None:
    @app.task
    async def double(n: int) -> int:
        return 2 * n

    async with Worker(app, concurrency=2) as worker:
        assert worker.ready.is_set()
        listed = await app.queue().workers()  # at once: no wait, no retry
        assert [w.id for w in listed] == [worker.id]
        assert listed[0].alive
        assert await (await double.enqueue(21)).result(timeout=30) == 42
    assert await app.queue().workers() == []


async def test_started_waits_for_a_worker_run_as_a_task(app: App) -> None:
    worker = Worker(app)
    main = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(worker.started(), timeout=30)
        assert [w.id for w in await app.queue().workers()] == [worker.id]
    finally:
        worker.stop()
        await main


async def test_async_with_raises_what_stopped_the_worker_before_it_served(app: App) -> None:
    @app.on_startup
    async def broken(state: object) -> None:
        raise RuntimeError("no database")

    with pytest.raises(StartupFailed, match="broken"):
        async with Worker(app):
            pytest.fail("the block ran without a worker")
    assert await app.queue().workers() == []


async def test_info_lists_a_registered_worker_before_any_job(
    app_dir: Path, op_workers: Workers, op_app: App, redis_url: str, op_prefix: str
) -> None:
    proc = op_workers.start()
    await live_worker(op_app, proc)
    res = cli(app_dir, op_prefix, "info", "--url", redis_url, "--json")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)["queues"]
    assert [(r["queue"], r["workers"], r["completed_1h"]) for r in rows] == [("default", 1, 0)]
    table = cli(app_dir, op_prefix, "info", "--url", redis_url)
    assert table.returncode == 0, table.stderr
    assert "default" in table.stdout, table.stdout


async def test_a_burst_worker_stores_every_declared_schedule_before_it_exits(
    app_dir: Path, redis_url: str
) -> None:
    for run in range(5):  # each run on a prefix of its own: an empty queue, nothing stored
        prefix = unique_prefix()
        res = cli(app_dir, prefix, "worker", "opapp:app", "--url", redis_url, "--burst")
        assert res.returncode == 0, f"run {run}: {res.stderr}"
        async with App(redis_url, prefix=prefix) as app:
            stored = {s.name for s in await app.schedules.list()}
        assert stored == SCHEDULES, f"run {run} stored {sorted(stored)}"


# ---------------------------------------------------------------------- point 2
async def test_enqueue_by_name_uses_the_defaults_live_workers_declared(
    app_dir: Path, op_workers: Workers, op_app: App, redis_url: str, op_prefix: str
) -> None:
    q = op_app.queue()
    proc = op_workers.start()
    await live_worker(op_app, proc)
    job = await q.enqueue("send_invoice", [5])
    info = await job.info()
    assert (info.max_attempts, info.priority) == (1, 7)  # not the producer's 3 and 0
    assert await job.result(timeout=60) == 5
    given = await q.enqueue("send_invoice", [6], max_attempts=4, priority=-2)
    assert ((await given.info()).max_attempts, (await given.info()).priority) == (4, -2)
    # the blocking client, and the CLI
    sync_job = await asyncio.to_thread(
        op_app.sync().enqueue_by_name, "default", "send_invoice", [8]
    )
    assert (await q.job(sync_job.id).info()).max_attempts == 1
    res = cli(app_dir, op_prefix, "enqueue", "send_invoice", "--args", "[7]", "--url", redis_url)
    assert res.returncode == 0, res.stderr
    assert "warning" not in res.stderr
    assert (await q.job(res.stdout.strip()).info()).max_attempts == 1


async def test_a_name_no_live_worker_knows_is_refused_with_a_suggestion(
    app_dir: Path, op_workers: Workers, op_app: App, redis_url: str, op_prefix: str, redis: Redis
) -> None:
    q = op_app.queue()
    proc = op_workers.start()
    await live_worker(op_app, proc)
    before = await q.counts()
    with pytest.raises(UnknownTask, match="did you mean 'send_invoice'\\?") as caught:
        await q.enqueue("send_invoce", [1])
    assert isinstance(caught.value, UsageError)
    with pytest.raises(UnknownTask, match="did you mean 'send_invoice'"):
        await asyncio.to_thread(op_app.sync().enqueue_by_name, "default", "send_invoce")
    assert await q.counts() == before  # nothing was stored
    res = cli(app_dir, op_prefix, "enqueue", "send_invoce", "--url", redis_url)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "did you mean 'send_invoice'?" in lines[0]
    assert "--force" in lines[0]
    # on purpose: allowed, then the worker hands it back (it does not know it)
    job = await q.enqueue("send_invoce", [1], allow_unknown=True)
    assert (await job.info()).max_attempts == 3
    forced = cli(app_dir, op_prefix, "enqueue", "send_invoce", "--force", "--url", redis_url)
    assert forced.returncode == 0, forced.stderr
    # once the worker stopped (it leaves the registry) nobody can tell: enqueue proceeds,
    # the CLI warns
    proc.signal(signal.SIGTERM)
    assert await proc.wait_exit(60) == 0
    assert await q.workers() == []
    assert (await lookup(q._scripts, q.name, "send_invoice")).declared is None
    await q.enqueue("send_invoce", [2])
    res = cli(app_dir, op_prefix, "enqueue", "send_invoce", "--url", redis_url)
    assert res.returncode == 0, res.stderr
    assert "aioqueue: warning: no live worker serves queue 'default'" in res.stderr


async def test_a_worker_warns_about_jobs_of_tasks_it_does_not_know(
    op_workers: Workers, op_app: App
) -> None:
    q = op_app.queue()
    # another project on the same prefix enqueued these
    for _ in range(3):
        await q.enqueue("billing.charge", [1])
    await q.enqueue("billing.refund", [1], priority=5)
    await q.enqueue("send_invoice", [1])
    proc = op_workers.start("--unknown-task-grace", "600")
    await live_worker(op_app, proc)
    await wait_until(lambda: "does not know" in proc.log_text(), timeout=60, what="the warning")
    warnings = [line for line in proc.log_text().splitlines() if "does not know" in line]
    assert len(warnings) == 1, warnings
    assert "'billing.charge' (3 jobs)" in warnings[0]
    assert "'billing.refund' (1 jobs)" in warnings[0]
    assert "send_invoice" not in warnings[0]
    assert "same prefix" in warnings[0]


# ---------------------------------------------------------------------- the table itself
async def test_the_table_keeps_a_bounded_list_of_live_workers_per_task(
    app: App, redis: Redis
) -> None:
    q = app.queue()
    scripts = q._scripts
    defaults = json.dumps(
        {"queue": "default", "max_attempts": 2, "priority": 0, "timeout": None, "result_ttl": None}
    )
    info = ("h", 1, "0", "default", 1, 0, 0, 0, 0)  # ..., done, failed, signs
    for i in range(10):
        await scripts.beat(f"w{i}", 60_000, 60_000, 0, info, [], 0)
        await register(scripts, f"w{i}", ["a", defaults])
    raw = await redis.hget(q._keys.base + "tasks", "a")
    assert isinstance(raw, bytes)
    ids = raw.split(b"\n", 1)[0].split()
    assert ids == [f"w{i}".encode() for i in range(2, 10)]  # the last 8
    found = await lookup(scripts, q.name, "a")
    assert found.declared is not None
    assert found.declared.max_attempts == 2
    # a task only a worker that is gone declared is dropped by the next worker's write
    await scripts.beat("gone", 60_000, 60_000, 0, info, [], 0)
    await register(scripts, "gone", ["b", defaults])
    await scripts.beat("gone", 0, 60_000, 0, info, [], 0)  # it leaves the registry
    assert (await lookup(scripts, q.name, "b")).unknown
    assert (await lookup(scripts, q.name, "b")).names == ("a",)
    await register(scripts, "w9", ["a", defaults])
    assert await redis.hkeys(q._keys.base + "tasks") == [b"a"]


async def test_heartbeats_do_not_rewrite_the_task_table(redis_url: str, redis: Redis) -> None:
    # a beat late by 3 intervals re-registers the worker (and writes the table): 0.5 s
    # leaves 1.5 s of a stalled loop on a loaded machine before that
    async with App(redis_url, prefix=unique_prefix(), heartbeat=0.5) as app:

        @app.task(max_attempts=1)
        async def once() -> None: ...

        q = app.queue()
        key = q._keys.base + "tasks"
        async with Worker(app, scheduler=False) as worker:
            entry = await redis.hget(key, "once")
            assert isinstance(entry, bytes)
            assert entry.startswith(worker.id.encode() + b"\n")
            # an entry the worker would put back if it wrote the table with every beat
            changed = entry.replace(b'"max_attempts": 1', b'"max_attempts": 9')
            assert changed != entry
            await redis.hset(key, "once", changed)
            beats: set[object] = set()

            async def five_beats() -> bool:
                beats.update(w.last_beat for w in await q.workers())
                return len(beats) >= 6

            await wait_until(five_beats, timeout=30, what="five more heartbeats")
            assert await redis.hget(key, "once") == changed
            found = await lookup(q._scripts, q.name, "once")
            assert found.declared is not None
            assert found.declared.max_attempts == 9


async def test_a_worker_back_after_its_burial_declares_its_tasks_again(
    op_workers: Workers, op_app: App
) -> None:
    q = op_app.queue()
    stalled = op_workers.start(heartbeat=0.2)
    await live_worker(op_app, stalled)
    stalled.signal(signal.SIGSTOP)  # a stall (a long GC pause, a frozen VM): no heartbeat
    try:

        async def dead() -> bool:
            return all(not w.alive for w in await q.workers())

        await wait_until(dead, timeout=30, what="the stalled worker past its deadline")
        # a worker of another project starts: its write drops what only the dead one declared,
        # and its heartbeat buries it
        other = op_workers.start(app="otherapp:app", heartbeat=0.2)

        async def dropped() -> bool:
            assert other.popen.poll() is None, other.log_text()
            found = await lookup(q._scripts, q.name, "send_invoice")
            return found.unknown and [w.pid for w in await q.workers()] == [other.pid]

        await wait_until(dropped, timeout=60, what="send_invoice dropped, the stalled one buried")
        with pytest.raises(UnknownTask, match="'send_invoice'"):
            await q.enqueue("send_invoice", [1])
    finally:
        stalled.signal(signal.SIGCONT)

    async def declared_again() -> bool:
        found = await lookup(q._scripts, q.name, "send_invoice")
        return found.declared is not None and found.declared.max_attempts == 1

    # with its next heartbeat, well before the table's refresh (REFRESH, a minute)
    assert REFRESH >= 60
    await wait_until(declared_again, timeout=30, what="the worker declaring its tasks again")
    job = await q.enqueue("send_invoice", [3])
    assert (await job.info()).max_attempts == 1
    assert await job.result(timeout=60) == 3
