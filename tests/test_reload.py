"""``python -m aioqueue worker --reload``: a change to the App's code restarts the worker,
which then runs the new code; code that fails to import waits for the next change."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from aioqueue import App

from .support.waiting import wait_until

pytestmark = pytest.mark.slow

APP = """\
import os

from aioqueue import App

app = App(os.environ["AIOQUEUE_REDIS_URL"], prefix=os.environ["AIOQUEUE_TEST_PREFIX"], lease=2.0)


@app.task
async def version() -> str:
    return {version!r}
"""


@pytest.fixture
def supervisor(tmp_path: Path, redis_url: str, prefix: str) -> Iterator[subprocess.Popen[bytes]]:
    code = tmp_path / "code"
    code.mkdir()
    (code / "reloadapp.py").write_text(APP.format(version="first"))
    env = dict(os.environ, AIOQUEUE_REDIS_URL=redis_url, AIOQUEUE_TEST_PREFIX=prefix)
    log = tmp_path / "supervisor.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [sys.executable, "-m", "aioqueue", "worker", "reloadapp:app", "--reload"],
            cwd=code,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    try:
        yield popen
    finally:
        if popen.poll() is None:
            popen.send_signal(signal.SIGTERM)
            try:
                popen.wait(30)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait(10)
        print(log.read_text(errors="replace"))  # shown when the test failed


async def live_pids(app: App) -> set[int]:
    return {w.pid for w in await app.queue().workers() if w.alive}


async def test_a_changed_file_restarts_the_worker_on_the_new_code(
    supervisor: subprocess.Popen[bytes], producer: App, tmp_path: Path
) -> None:
    source = tmp_path / "code" / "reloadapp.py"
    job = await producer.queue().enqueue("version")
    assert await job.result(timeout=60) == "first"
    (old,) = await live_pids(producer)

    source.write_text("this is not python\n")  # an edit half done: the worker cannot start
    log = tmp_path / "supervisor.log"
    await wait_until(
        lambda: "failed to start (exit code 1); waiting for a change" in log.read_text(),
        timeout=60,
        what="the broken worker to wait for a change",
    )
    assert supervisor.poll() is None, "the supervisor waits, it does not exit"
    assert await live_pids(producer) == set()

    source.write_text(APP.format(version="the second version"))
    job = await producer.queue().enqueue("version")
    assert await job.result(timeout=60) == "the second version"
    new = await live_pids(producer)
    assert len(new) == 1
    assert old not in new
    supervisor.send_signal(signal.SIGTERM)
    await wait_until(lambda: supervisor.poll() is not None, timeout=30, what="the exit")
    assert supervisor.returncode == 0
