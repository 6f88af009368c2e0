"""``python -m aioqueue worker --processes N``: a supervisor of real worker processes.

A worker killed with SIGKILL is restarted and its job comes back; SIGTERM stops every worker
after its running jobs finished; workers that cannot start make the supervisor exit 1 at
once, without a restart loop; a worker that fails at startup after a restart is retried a
bounded number of times.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from aioqueue import App, JobState, WorkerInfo
from aioqueue._cli.supervisor import (
    _OWN,
    MAX_START_FAILURES,
    SUPERVISOR_FD,
    Supervisor,
    worker_argv,
)

from .support.prewarmed import run_aioqueue
from .support.processes import REPO_ROOT, WorkerProcesses, run_records
from .support.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def workers(tmp_path: Path, redis_url: str, prefix: str) -> Iterator[WorkerProcesses]:
    procs = WorkerProcesses(tmp_path, redis_url, prefix)
    try:
        yield procs
    finally:
        for proc in procs.procs:  # the supervisor's workers stop with it
            if proc.popen.poll() is None:
                proc.signal(signal.SIGTERM)
                try:
                    proc.popen.wait(30)
                except subprocess.TimeoutExpired:
                    proc.popen.kill()
        procs.close()
        print(procs.logs())  # shown when the test failed


async def live_workers(app: App, n: int, timeout: float = 30.0) -> list[WorkerInfo]:
    """Wait until ``n`` live workers are registered on the default queue; them."""
    found: list[WorkerInfo] = []

    async def enough() -> bool:
        nonlocal found
        found = [w for w in await app.queue().workers() if w.alive]
        return len(found) == n

    await wait_until(enough, timeout=timeout, what=f"{n} live workers")
    return found


def alive(pid: int) -> bool:
    """The process runs (a zombie nobody reaped yet does not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return "\nState:\tZ" not in status


async def test_a_worker_killed_with_sigkill_is_restarted_and_its_job_comes_back(
    workers: WorkerProcesses, producer: App, redis: Redis, prefix: str, tmp_path: Path
) -> None:
    sup = workers.start(lease=2.0, extra=("--processes", "2"))
    first = {w.pid for w in await live_workers(producer, 2)}
    assert sup.pid not in first
    assert len(first) == 2
    release = tmp_path / "release"
    job = await producer.queue().enqueue("wait_for_file", kwargs={"path": str(release)})
    await wait_until(lambda: _runs(redis, prefix, 1), timeout=15, what="the job to start")
    victim = (await run_records(redis, prefix))[0].pid
    os.kill(victim, signal.SIGKILL)
    await sup.wait_log("died unexpectedly (killed by SIGKILL); restarting it in", timeout=15)

    async def replaced() -> bool:
        pids = {w.pid for w in await producer.queue().workers() if w.alive}
        return len(pids) == 2 and victim not in pids and len(pids - first) == 1

    await wait_until(replaced, timeout=30, what="a new worker in place of the killed one")
    await wait_until(lambda: _runs(redis, prefix, 2), timeout=30, what="the job to run again")
    release.touch()
    ran_by = await job.result(timeout=30)
    runs = await run_records(redis, prefix)
    assert [(r.pid, r.attempt) for r in runs] == [(victim, 1), (ran_by, 2)]
    assert sup.popen.poll() is None, "the supervisor keeps running"
    sup.signal(signal.SIGTERM)
    assert await sup.wait_exit(30) == 0


async def _runs(redis: Redis, prefix: str, n: int) -> bool:
    return len(await run_records(redis, prefix)) >= n


async def test_sigterm_stops_every_worker_after_its_running_job_finished(
    workers: WorkerProcesses, producer: App, redis: Redis, prefix: str, tmp_path: Path
) -> None:
    sup = workers.start(lease=2.0, grace=60.0, extra=("--processes", "2", "--concurrency", "1"))
    pids = {w.pid for w in await live_workers(producer, 2)}
    release = tmp_path / "release"
    jobs = [
        await producer.queue().enqueue("wait_for_file", kwargs={"path": str(release), "tag": t})
        for t in "ab"
    ]
    await wait_until(lambda: _runs(redis, prefix, 2), timeout=15, what="both jobs to start")
    assert {r.pid for r in await run_records(redis, prefix)} == pids  # one on each
    sup.signal(signal.SIGTERM)
    await wait_until(
        lambda: sup.log_text().count("SIGTERM: stopping (again to force)") == 2,
        timeout=15,
        what="both workers to get the signal once",
    )
    assert sup.popen.poll() is None, "the jobs still run: the workers wait for them"
    release.touch()
    assert await sup.wait_exit(60) == 0
    assert {await j.result(timeout=5) for j in jobs} == pids
    assert sup.log_text().count("exited with 0") == 2
    runs = await run_records(redis, prefix)
    assert sorted((r.tag, r.attempt) for r in runs) == [("a", 1), ("b", 1)]  # none ran twice
    await wait_until(lambda: not any(alive(p) for p in pids), what="the workers to be gone")
    assert await producer.queue().workers() == []  # they left the registry


async def test_a_second_sigterm_stops_the_workers_at_once(
    workers: WorkerProcesses, producer: App, redis: Redis, prefix: str, tmp_path: Path
) -> None:
    sup = workers.start(lease=2.0, grace=600.0, extra=("--processes", "2"))
    await live_workers(producer, 2)
    job = await producer.queue().enqueue("wait_for_file", kwargs={"path": str(tmp_path / "x")})
    await wait_until(lambda: _runs(redis, prefix, 1), timeout=15, what="the job to start")
    sup.signal(signal.SIGTERM)
    await wait_until(
        lambda: sup.log_text().count("SIGTERM: stopping (again to force)") == 2,
        timeout=15,
        what="both workers to get the signal once",
    )
    sup.signal(signal.SIGTERM)
    assert await sup.wait_exit(30) == 0  # not the 600 s of grace
    assert "SIGTERM again: stopping now" in sup.log_text()
    assert await job.state() == JobState.QUEUED  # handed back, for the next worker


async def test_workers_stop_by_themselves_when_the_supervisor_is_killed(
    workers: WorkerProcesses, producer: App
) -> None:
    sup = workers.start(extra=("--processes", "2"))
    pids = {w.pid for w in await live_workers(producer, 2)}
    workers.kill(sup)
    await wait_until(
        lambda: not any(alive(p) for p in pids), timeout=30, what="the orphans to stop"
    )
    assert sup.log_text().count("is gone; stopping") == 2
    assert await producer.queue().workers() == []  # they stopped cleanly: left the registry


async def test_burst_workers_that_finish_are_not_restarted(
    workers: WorkerProcesses, producer: App, redis: Redis, prefix: str
) -> None:
    jobs = [await producer.queue().enqueue("record", kwargs={"tag": str(i)}) for i in range(6)]
    sup = workers.start(extra=("--processes", "2", "--burst"))
    assert await sup.wait_exit(60) == 0
    assert sup.log_text().count("finished") >= 2
    assert sup.log_text().count("started (pid") == 2
    assert [await j.state() for j in jobs] == [JobState.COMPLETED] * len(jobs)


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run_aioqueue(["worker", *args], cwd=REPO_ROOT, timeout=timeout)


def test_an_app_that_cannot_be_imported_exits_1_with_one_line() -> None:
    result = run_cli("nosuch_module:app", "--processes", "3")
    assert result.returncode == 1
    assert result.stderr == (
        "aioqueue: error: cannot import module 'nosuch_module': No module named 'nosuch_module'\n"
    )


def test_workers_that_cannot_start_stop_the_supervisor_without_a_restart_loop() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    result = run_cli(
        "tests.workerapp:app",
        "--processes",
        "2",
        "--url",
        f"redis://127.0.0.1:{closed}/0",
        "--connect-timeout",
        "0",
    )
    assert result.returncode == 1
    assert result.stderr.count("started (pid") == 2, result.stderr  # and none restarted
    assert "aioqueue: error: " in result.stderr
    assert "restarting" not in result.stderr


def test_the_command_line_is_checked_before_anything_starts() -> None:
    for bad in (("--processes", "0"), ("--health-port", "-1"), ("--health-port", "65535")):
        result = run_cli("tests.workerapp:app", "--processes", "2", *bad)
        assert result.returncode == 2, bad
        assert result.stderr.count("\n") == 1, result.stderr


def test_a_restarted_worker_that_keeps_failing_at_startup_is_given_up(tmp_path: Path) -> None:
    """The first worker of the slot starts (it reports ready), then dies; every later one
    fails before it is ready: after MAX_START_FAILURES of those, the supervisor exits 1."""
    counter = tmp_path / "starts"
    script = (
        "import os, pathlib, sys\n"
        f"p = pathlib.Path({str(counter)!r})\n"
        "n = int(p.read_text()) if p.exists() else 0\n"
        "p.write_text(str(n + 1))\n"
        "if n == 0:\n"
        f"    os.write(int(os.environ[{SUPERVISOR_FD!r}]), b'1')\n"
        "sys.exit(3)\n"
    )
    supervisor = Supervisor(lambda slot: [sys.executable, "-c", script], 1)
    assert supervisor.run() == 1
    assert int(counter.read_text()) == 1 + MAX_START_FAILURES
    assert len(supervisor.slots[0].pids) == 1 + MAX_START_FAILURES


def test_a_worker_command_that_cannot_run_is_one_line_and_exit_1(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "no-such-python")
    supervisor = Supervisor(lambda slot: [missing], 2)
    assert supervisor.run() == 1
    err = capfd.readouterr().err
    assert err.startswith("aioqueue: error: cannot start a worker process: ")
    assert err.count("\n") == 1
    assert [s.pids for s in supervisor.slots] == [[], []]


def test_the_workers_get_every_option_of_the_worker_command_but_the_supervisors() -> None:
    # pure logic: the command line each worker is started with, rebuilt from the parsed one;
    # the isolation options live in an argument group, which the parser keeps too
    from aioqueue._cli.main import _parser

    parser = _parser()
    argv = ["worker", "jobs:app", "--processes", "3", "--concurrency", "7", "-q", "a", "-q", "b"]
    argv += ["--isolation", "process", "--children", "2", "--burst"]
    args = parser.parse_args(argv)
    assert parser.worker is not None
    line = worker_argv(parser.worker, args, _OWN)
    assert line[-2:] == ["--", "jobs:app"]
    options = line[:-2]
    for expected in (["--concurrency", "7"], ["--queue", "a"], ["--queue", "b"]):
        assert any(options[i : i + 2] == expected for i in range(len(options))), (expected, line)
    assert options[options.index("--isolation") + 1] == "process"
    assert options[options.index("--children") + 1] == "2"
    assert "--burst" in options
    assert "--processes" not in options  # the supervisor's own
    assert "--help" not in options
    assert "--version" not in options
