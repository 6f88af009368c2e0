"""``python -m aioqueue``, run as a user runs it: a subprocess, its exit code and its stderr.

Every failure is one line on stderr, never a traceback: exit 2 for a bad command line, 1 for a
failure at run time. A worker started before its server waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from uuid import uuid4

import pytest
from redis.asyncio import Redis

from aioqueue import App, ConfigurationError, EmbeddedServer, EmbeddedServerError, __version__
from aioqueue._store.embedded import _free_port

from .support.ports import PortTaken, on_a_free_port_async
from .support.prewarmed import run_aioqueue
from .support.waiting import wait_until

APP_MODULE = textwrap.dedent(
    """
    import os

    from aioqueue import App

    app = App(prefix=os.environ.get("CLI_TEST_PREFIX", "cli"))


    @app.task()
    async def add(a: int, b: int) -> int:
        return a + b


    @app.task(queue="images")
    async def resize(name: str) -> str:
        return name


    @app.task(queue="images")
    async def thumbnail(name: str) -> str:
        return name
    """
)


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    """A directory holding ``cliapp.py`` (tasks on the queues ``default`` and ``images``),
    the working directory of the CLI runs."""
    (tmp_path / "cliapp.py").write_text(APP_MODULE)
    return tmp_path


def _env(prefix: str = "cli") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "AIOQUEUE_REDIS_URL"}
    env["CLI_TEST_PREFIX"] = prefix
    return env


def cli(
    cwd: Path, *args: str, prefix: str = "cli", timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m aioqueue ARGS`` to its end."""
    return run_aioqueue(args, cwd=cwd, env=_env(prefix), timeout=timeout)


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The single line a failed run printed on stderr (asserting there is just one)."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--prefetch", "-1"], "--prefetch"),
        (["--grace", "nan"], "--grace"),
        (["--grace", "-5"], "--grace"),
        (["--connect-timeout", "inf"], "--connect-timeout"),
        (["--log-level", "LOUD"], "--log-level"),
        (["--concurrency", "0"], "--concurrency"),
        (["--concurrency", "lots"], "--concurrency"),
        (["-q", "bad{q"], "invalid queue name"),
        (["-q", "a", "-q", "a"], "listed twice"),
        (["--url", "http://localhost"], "invalid Redis URL"),
    ],
)
def test_a_bad_command_line_is_one_line_and_exit_2(
    app_dir: Path, args: list[str], says: str
) -> None:
    # no server at this URL: the command line alone must be refused
    url = f"redis://127.0.0.1:{_free_port()}/0"
    proc = cli(app_dir, "worker", "cliapp:app", "--url", url, "--connect-timeout", "0", *args)
    assert proc.returncode == 2, proc.stderr
    assert says in one_line_error(proc)


def test_a_missing_app_is_one_line_and_exit_1(app_dir: Path) -> None:
    proc = cli(app_dir, "worker", "nosuchmodule:app")
    assert proc.returncode == 1
    assert "cannot import module 'nosuchmodule'" in one_line_error(proc)


def test_an_error_in_the_app_module_is_one_line_and_the_users_own_frames(app_dir: Path) -> None:
    (app_dir / "brokenapp.py").write_text(
        "import os\n\n\ndef helper():\n    return undefined_name\n\n\nhelper()\n"
    )
    proc = cli(app_dir, "worker", "brokenapp:app")
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert lines[0] == (
        "aioqueue: error: cannot import module 'brokenapp': "
        "NameError: name 'undefined_name' is not defined"
    )
    assert lines[-1] == "NameError: name 'undefined_name' is not defined"
    files = [line.split('"')[1] for line in lines if line.startswith('  File "')]
    assert files == [str(app_dir / "brokenapp.py")] * 2  # line 8, then helper: no importlib
    assert "Traceback" not in proc.stderr


def test_every_error_message_names_one_program(app_dir: Path) -> None:
    for args in (["worker"], ["info", "--bogus"], ["jobs", "nosuchstate"]):
        proc = cli(app_dir, *args)
        assert proc.returncode == 2
        assert proc.stderr.startswith("aioqueue: error: "), proc.stderr


@pytest.mark.parametrize("args", [["--version"], ["worker", "--version"]])
def test_version_works_on_the_command_and_its_subcommands(app_dir: Path, args: list[str]) -> None:
    proc = cli(app_dir, *args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"aioqueue {__version__}"


async def test_a_db_index_out_of_range_is_a_configuration_error(
    app_dir: Path, redis_url: str
) -> None:
    url = redis_url.rpartition("/")[0] + "/4096"
    with pytest.raises(ConfigurationError, match="DB index is out of range"):
        await App(url).open()
    # the CLI: one line, exit 1, and no retrying (a refusal is not an outage)
    proc = await asyncio.to_thread(cli, app_dir, "worker", "cliapp:app", "--url", url)
    assert proc.returncode == 1
    line = one_line_error(proc)
    assert line.startswith("aioqueue: error: Redis at ")
    assert "DB index is out of range" in line


@pytest.fixture
async def limited_user(redis: Redis, redis_url: str) -> AsyncIterator[str]:
    """The URL of an ACL user that may PING but not load scripts."""
    user = f"cli-{uuid4().hex[:8]}"
    rules = ["reset", "on", f">{user}-pw", "~*", "-@all", "+ping", "+client|setinfo"]
    await redis.execute_command("ACL", "SETUSER", user, *rules)  # type: ignore[no-untyped-call]
    host = redis_url.split("//", 1)[1]
    yield f"redis://{user}:{user}-pw@{host}"
    await redis.execute_command("ACL", "DELUSER", user)  # type: ignore[no-untyped-call]


async def test_an_acl_user_without_a_needed_command_fails_clearly(
    app_dir: Path, limited_user: str
) -> None:
    with pytest.raises(ConfigurationError, match=r"no permissions to run the 'script\|load'"):
        await App(limited_user).open()
    proc = await asyncio.to_thread(cli, app_dir, "worker", "cliapp:app", "--url", limited_user)
    assert proc.returncode == 1
    line = one_line_error(proc)
    assert "no permissions to run the 'script|load' command" in line
    assert "-pw" not in line  # the password is redacted


async def test_an_acl_user_that_may_not_run_scripts_fails_clearly(
    app_dir: Path, redis: Redis, redis_url: str
) -> None:
    # issue 19: a user that could load scripts but not run them (no EVALSHA; now that the
    # scripts are a function library, no FCALL) got a worker that logged NOPERM and retried
    # forever
    user = f"cli-{uuid4().hex[:8]}"
    rules = ["reset", "on", f">{user}-pw", "~*", "&*", "+@all", "-fcall"]
    await redis.execute_command("ACL", "SETUSER", user, *rules)  # type: ignore[no-untyped-call]
    url = f"redis://{user}:{user}-pw@{redis_url.split('//', 1)[1]}"
    try:
        proc = await asyncio.to_thread(cli, app_dir, "worker", "cliapp:app", "--url", url)
    finally:
        await redis.execute_command("ACL", "DELUSER", user)  # type: ignore[no-untyped-call]
    assert proc.returncode == 1
    assert "no permissions to run the 'fcall' command" in one_line_error(proc)


async def test_bad_credentials_fail_at_once(app_dir: Path, limited_user: str) -> None:
    url = limited_user.replace("-pw@", "-wrong@")
    with pytest.raises(ConfigurationError, match="invalid username-password pair"):
        await App(url).open()
    proc = await asyncio.to_thread(cli, app_dir, "worker", "cliapp:app", "--url", url)
    assert proc.returncode == 1
    assert "invalid username-password pair" in one_line_error(proc)


def test_a_worker_gives_up_on_an_absent_server_after_connect_timeout(app_dir: Path) -> None:
    url = f"redis://127.0.0.1:{_free_port()}/0"
    args = ("worker", "cliapp:app", "--url", url, "--connect-timeout", "1")
    proc = cli(app_dir, *args)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert "retrying in" in lines[0]  # each retry is logged
    assert lines[-1].startswith("aioqueue: error: cannot reach Redis at")
    assert "gave up after 1 s" in lines[-1]


class WorkerProcess:
    """``python -m aioqueue worker cliapp:app --url URL`` in the background, logging to a
    file; killed on leaving ``with`` if still running."""

    def __init__(self, app_dir: Path, url: str) -> None:
        self.app_dir = app_dir
        self.url = url
        self.prefix = f"cli{uuid4().hex[:8]}"
        self.log = app_dir / "worker.log"
        self.popen: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> WorkerProcess:
        with self.log.open("w") as out:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "aioqueue", "worker", "cliapp:app", "--url", self.url],
                cwd=self.app_dir,
                env=_env(self.prefix),
                stdout=out,
                stderr=out,
            )
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()

    async def runs_a_job(self) -> None:
        """Enqueue ``add(2, 3)`` and wait for the worker to complete it."""
        async with App(self.url, prefix=self.prefix) as app:
            job = await app.queue().enqueue("add", [2, 3])
            assert await job.result(timeout=30) == 5

    async def stop(self) -> str:
        """SIGTERM the worker, check it exits 0; its log (with no traceback)."""
        assert self.popen is not None
        self.popen.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(self.popen.wait, 30) == 0
        text = self.log.read_text()
        assert "Traceback" not in text
        return text


@pytest.mark.slow
async def test_a_worker_started_before_its_server_waits_for_it(app_dir: Path) -> None:
    async def start(port: int) -> tuple[contextlib.ExitStack, WorkerProcess]:
        # the worker, then its server on the same port (again on a new one, worker too, when
        # another test's server took the port meanwhile)
        stack = contextlib.ExitStack()
        worker = stack.enter_context(WorkerProcess(app_dir, f"redis://127.0.0.1:{port}/0"))
        try:
            await wait_until(lambda: "retrying in" in worker.log.read_text(), what="a retry")
            server = EmbeddedServer(port=port, appendonly=False)
            try:
                server.start()
            except EmbeddedServerError as exc:
                if "could not bind" in str(exc):
                    raise PortTaken(port) from exc
                raise
            stack.callback(server.stop)
        except BaseException:
            stack.close()
            raise
        return stack, worker

    stack, worker = await on_a_free_port_async(start, pick=_free_port)
    with stack:
        await worker.runs_a_job()
        assert "connected on attempt" in await worker.stop()


def _loading(port: int) -> bool:
    """Whether the server on ``port`` answers PING with ``-LOADING``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(64).startswith(b"-LOADING")
    except OSError:
        return False


async def _start_loading(
    data: Path, extra: list[str]
) -> tuple[EmbeddedServer, asyncio.Future[None], int]:
    """A server started (in a thread) on ``data`` on a free port and seen answering LOADING,
    its start, and that port; on a new port when the one picked was taken before it bound
    it."""

    async def start(port: int) -> tuple[EmbeddedServer, asyncio.Future[None], int]:
        server = EmbeddedServer(
            data, port=port, appendonly=False, extra_args=extra, startup_timeout=120
        )
        starting = asyncio.ensure_future(asyncio.to_thread(server.start))
        seen: list[int] = []

        async def loading_or_over() -> bool:
            if await asyncio.to_thread(_loading, port):
                seen.append(port)
                return True
            return starting.done()

        await wait_until(loading_or_over, timeout=30, what="LOADING")
        if seen:
            return server, starting, port
        exc = starting.exception()
        if exc is None:
            server.stop()
            pytest.fail("the server loaded its data before it was seen LOADING")
        if "could not bind" in str(exc):
            raise PortTaken(port) from exc
        raise exc

    return await on_a_free_port_async(start, pick=_free_port)


@pytest.mark.slow
async def test_a_worker_waits_while_its_server_loads_its_data(
    app_dir: Path, tmp_path: Path
) -> None:
    data = tmp_path / "valkey"
    with EmbeddedServer(data, appendonly=False) as server:  # an RDB of 5,000 keys
        client = Redis.from_url(server.url)
        async with client.pipeline(transaction=False) as pipe:
            for i in range(5000):
                pipe.set(f"filler:{i}", "x" * 100)
            await pipe.execute()
        await client.save()
        await client.aclose()
    # loaded at 1 ms a key (debug settings), answering clients every KiB: ~5 s of LOADING
    slow_load = ["--key-load-delay", "1000", "--loading-process-events-interval-bytes", "1024"]
    server, starting, port = await _start_loading(data, slow_load)
    try:
        with WorkerProcess(app_dir, f"redis://127.0.0.1:{port}/0") as worker:
            await starting
            await worker.runs_a_job()
            log = await worker.stop()
        assert "loading the dataset in memory; retrying in" in log, log
    finally:
        await starting
        server.stop()


@pytest.mark.parametrize(
    ("queues", "warned"),
    [([], True), (["-q", "images"], True), (["-q", "default", "-q", "images"], False)],
)
def test_the_worker_warns_about_task_queues_it_does_not_consume(
    app_dir: Path, redis_url: str, queues: list[str], warned: bool
) -> None:
    args = ("worker", "cliapp:app", "--url", redis_url, "--burst", *queues)
    proc = cli(app_dir, *args, prefix=f"cli{uuid4().hex[:8]}")
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if " WARNING " in line]
    if not warned:
        assert warnings == []
    elif queues:  # consuming images only: add's queue is left out
        assert len(warnings) == 1
        assert "queue 'default'" in warnings[0]
        assert "tasks add wait for a worker started with -q default" in warnings[0]
    else:
        assert len(warnings) == 1
        assert "queue 'images'" in warnings[0]
        assert "tasks resize, thumbnail wait" in warnings[0]


@pytest.mark.xdist_group("embedded-dev-port")  # one fixed port (6399): one xdist worker
def test_worker_embedded_starts_its_own_server(tmp_path: Path, app_dir: Path) -> None:
    # it attaches instead when a server already answers on 127.0.0.1:6399; either way it runs
    proc = cli(
        app_dir, "worker", "cliapp:app", "--embedded", "--burst", "-q", "default", "-q", "images"
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "stopped (0 completed, 0 failed)" in proc.stderr
