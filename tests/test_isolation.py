"""Process isolation (issue 28, point 3): a task declared ``isolation="process"`` (or every task
of a worker with ``ProcessIsolation(every_task=True)``) runs in a child process. A task that
spins forever, one that segfaults, one that calls ``os._exit`` and one that leaks memory each
fail (or finish) their job with a clear error while the worker goes on; children are killed at
a timeout and recycled by job count and by memory. Real child processes, a real server."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from aioqueue import (
    App,
    ConfigurationError,
    JobFailed,
    ProcessIsolation,
    SyncTimeoutWarning,
    Task,
    Worker,
)

from . import isoapp
from .support.waiting import wait_until

RESULT_WAIT = 120.0  # a child's start (fork and import) on a loaded machine
#: where ``tests.isoapp`` imports from, for the command line's workers
ROOT = Path(__file__).resolve().parent.parent


def isolated(app: App, fn: Any, **options: Any) -> Task[Any, Any]:
    return app.task(isolation="process", **options)(fn)


async def failure(job: Any) -> JobFailed:
    with pytest.raises(JobFailed) as caught:
        await job.result(timeout=RESULT_WAIT)
    return caught.value


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
async def worker(app: App) -> AsyncIterator[Worker]:
    """A started worker of ``app`` (tasks registered before the test asks for it)."""
    async with Worker(app, concurrency=4, grace=1) as w:
        yield w


async def test_a_task_that_spins_forever_is_killed_at_its_timeout(app: App, tmp_path: Path) -> None:
    spin = isolated(app, isoapp.spin, timeout=3, max_attempts=1)
    pid = isolated(app, isoapp.pid)
    async with Worker(app, concurrency=2, grace=1) as w:
        path = tmp_path / "pid"
        err = await failure(await spin.enqueue(str(path)))
        assert err.error_type == "JobTimeout"
        assert "its child process was killed" in err.error_message
        child = int(path.read_text())
        await wait_until(lambda: gone(child), timeout=30, what="the spinning child to be gone")
        # the worker goes on, in a fresh child
        other = await (await pid.enqueue()).result(timeout=RESULT_WAIT)
        assert other not in (child, os.getpid())
        assert w._runner.children.started == 2


async def test_a_segfault_fails_the_job_not_the_worker(app: App) -> None:
    crash = isolated(app, isoapp.segfault, max_attempts=1)
    area = isolated(app, isoapp.area)
    async with Worker(app, concurrency=2, grace=1):
        err = await failure(await crash.enqueue())
        assert err.error_type == "ChildCrashed"
        assert "signal 11 (SIGSEGV)" in err.error_message
        assert await (await area.enqueue(isoapp.Box(3, 4))).result(timeout=RESULT_WAIT) == 12


async def test_os_exit_fails_the_job_with_its_exit_code_and_is_retried(app: App) -> None:
    exit_now = isolated(app, isoapp.exit_now, max_attempts=2)
    async with Worker(app, concurrency=2, grace=1):
        job = await exit_now.enqueue(7)
        err = await failure(job)
        assert (err.error_type, err.error_message) == (
            "ChildCrashed",
            "the child process running the job died: exit code 7",
        )
        assert (await job.info()).attempts == 2


async def test_children_are_recycled_after_max_jobs_per_child(app: App) -> None:
    pid = isolated(app, isoapp.pid)
    options = ProcessIsolation(processes=1, max_jobs_per_child=2)
    async with Worker(app, concurrency=1, isolation=options) as w:
        pids = [await (await pid.enqueue()).result(timeout=RESULT_WAIT) for _ in range(5)]
        assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4]
        assert len(set(pids)) == 3
        await wait_until(lambda: gone(pids[0]), timeout=30, what="the retired child to exit")
        assert w._runner.children.started == 3


async def test_a_leaking_child_is_recycled_by_memory(app: App) -> None:
    leak = isolated(app, isoapp.leak)
    async with Worker(app, concurrency=1, isolation=ProcessIsolation(processes=1)):
        _, baseline = await (await leak.enqueue(0)).result(timeout=RESULT_WAIT)
    limit = baseline + (100 << 20)
    options = ProcessIsolation(processes=1, max_memory_per_child=limit)
    async with Worker(app, concurrency=1, isolation=options):
        runs = [await (await leak.enqueue(40)).result(timeout=RESULT_WAIT) for _ in range(4)]
    # 40 MB a job: the third crosses the limit, so its child retires and the fourth has a new one
    pids = [p for p, _ in runs]
    assert pids[0] == pids[1] == pids[2] != pids[3]
    assert runs[2][1] > limit
    assert runs[3][1] < limit


async def test_what_a_task_raises_crosses_with_its_traceback(app: App, tmp_path: Path) -> None:
    boom = isolated(app, isoapp.boom, max_attempts=1)
    again = isolated(app, isoapp.retry_once, max_attempts=2)
    async with Worker(app, concurrency=2, grace=1):
        err = await failure(await boom.enqueue())
        assert (err.error_type, err.error_message) == ("ValueError", "boom in a child")
        assert err.traceback is not None
        assert "in the child process" in err.traceback
        assert "isoapp.py" in err.traceback
        job = await again.enqueue(str(tmp_path / "marker"))
        assert await job.result(timeout=RESULT_WAIT) == "second time"
        assert (await job.info()).attempts == 2


async def test_every_task_runs_in_a_child_with_the_worker_option(app: App) -> None:
    apid = app.task(isoapp.apid)  # not declared isolated: async, in a child all the same
    options = ProcessIsolation(every_task=True)
    async with Worker(app, concurrency=2, isolation=options):
        child = await (await apid.enqueue()).result(timeout=RESULT_WAIT)
    assert child != os.getpid()
    async with Worker(app, concurrency=2):
        assert await (await apid.enqueue()).result(timeout=RESULT_WAIT) == os.getpid()


async def test_shutdown_kills_a_running_child(app: App, tmp_path: Path) -> None:
    hang = isolated(app, isoapp.sleep_sync, max_attempts=3)
    path = tmp_path / "pid"
    async with Worker(app, concurrency=1, grace=0.1):
        job = await hang.enqueue(str(path))
        await wait_until(path.exists, timeout=RESULT_WAIT, what="the child to start the job")
    child = int(path.read_text())
    await wait_until(lambda: gone(child), timeout=30, what="the hanging child to be killed")
    # the job went back to the queue without spending an attempt
    assert (await job.info()).state.value == "queued"


# ---------------------------------------------------------------------- declaration
def test_a_sync_task_with_a_timeout_and_no_isolation_warns(app: App) -> None:
    with pytest.warns(SyncTimeoutWarning, match="thread runs on") as caught:
        app.task(timeout=5)(isoapp.pid)
    assert caught[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        app.task(timeout=5, name="a")(isoapp.apid)  # async: its timeout cancels it
        app.task(timeout=5, name="b", isolation="process")(isoapp.area)  # killed
        app.task(name="c")(isoapp.boom)  # no timeout


def test_isolation_is_checked_at_declaration(app: App) -> None:
    with pytest.raises(ConfigurationError, match="top level of a module"):
        app.task(isolation="process", name="l")(lambda: 1)

    def local() -> None:
        pass

    with pytest.raises(ConfigurationError, match="top level of a module"):
        app.task(isolation="process")(local)
    with pytest.raises(ConfigurationError, match='None or "process"'):
        app.task(isolation="thread")(isoapp.pid)  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match="max_jobs_per_child"):
        ProcessIsolation(max_jobs_per_child=0)


async def test_a_pool_of_two_runs_two_isolated_jobs_at_once(app: App, tmp_path: Path) -> None:
    hang = isolated(app, isoapp.sleep_sync, timeout=60, max_attempts=1)
    paths = [tmp_path / "a", tmp_path / "b"]
    async with Worker(app, concurrency=4, isolation=ProcessIsolation(processes=2)) as w:
        jobs = [await hang.enqueue(str(p)) for p in paths]
        await wait_until(
            lambda: all(p.exists() for p in paths), timeout=RESULT_WAIT, what="both children"
        )
        assert w._runner.children.started == 2
        for job in jobs:
            await job.cancel()
        await asyncio.gather(*(failure_or_cancel(j) for j in jobs))


async def failure_or_cancel(job: Any) -> None:
    async def ended() -> bool:
        return (await job.info()).state.finished  # type: ignore[no-any-return]

    await wait_until(ended, timeout=RESULT_WAIT, what="the cancelled job to end")


def test_the_cli_runs_every_task_in_children_it_recycles(redis_url: str, prefix: str) -> None:
    async def enqueue() -> list[str]:
        async with App(redis_url, prefix=prefix) as producer:
            return [(await producer.queue().enqueue("pid")).id for _ in range(3)]

    async def results(ids: list[str]) -> list[int]:
        async with App(redis_url, prefix=prefix) as producer:
            return [await producer.queue().job(i).result(timeout=5) for i in ids]

    ids = asyncio.run(enqueue())
    command = [sys.executable, "-m", "aioqueue", "worker", "tests.isoapp:app", "--url", redis_url]
    command += ["--burst", "--isolation", "process", "--max-jobs-per-child", "1", "-c", "1"]
    env = {**os.environ, "ISOAPP_PREFIX": prefix}
    res = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RESULT_WAIT
    )
    assert res.returncode == 0, res.stderr
    pids = asyncio.run(results(ids))
    assert len(set(pids)) == 3  # a child each: retired after one job
    assert os.getpid() not in pids
    bad = subprocess.run(
        [*command, "--max-jobs-per-child", "0"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert "max_jobs_per_child" in bad.stderr


async def test_a_child_busy_in_a_job_dies_with_its_killed_worker(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    async with App(redis_url, prefix=prefix) as producer:
        path = tmp_path / "pid"
        await producer.queue().enqueue("spin", [str(path)])
        command = [sys.executable, "-m", "aioqueue", "worker", "tests.isoapp:app"]
        command += ["--url", redis_url, "--log-level", "WARNING"]
        env = {**os.environ, "ISOAPP_PREFIX": prefix}
        worker = await asyncio.to_thread(subprocess.Popen, command, cwd=ROOT, env=env)
        try:
            await wait_until(path.exists, timeout=RESULT_WAIT, what="the child to start spinning")
            child = int(path.read_text())
            worker.kill()  # SIGKILL: no shutdown, no cleanup in the worker
        finally:
            worker.kill()
            await asyncio.to_thread(worker.wait, 30)
        await wait_until(lambda: gone(child), timeout=30, what="the orphaned child to die")
