"""I13, control characters: what the CLI prints for people (tables, a job's detail, errors,
event lines) and the worker's text log lines carry no raw control character, whatever a job's
error, a task's name or a worker's host holds (``_safetext.escape``)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from redis.asyncio import Redis

from aioqueue import App, JobState, Worker
from aioqueue._model.keys import QueueKeys
from aioqueue._model.safetext import EscapingFormatter, escape
from aioqueue.testing import unique_prefix

from .support.clirun import aioqueue_cli as cli
from .support.waiting import wait_until

HOSTILE_ERROR = "\x1b]0;owned\x07\x1b[2J"
HOSTILE_TASK = "evil\x1b[31m\u202etask\r\nFORGED"
HOSTILE_HOST = "host\x1b[2J\x07\x9b\rX"
# any C0 control but the newline, DEL, C1 controls, bidi overrides and line separators
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def test_escape_shows_every_control_character() -> None:
    assert escape(HOSTILE_ERROR) == "\\e]0;owned\\x07\\e[2J"
    assert escape("a\nb") == "a\\nb"
    assert escape("a\nb\tc", newlines=True) == "a\nb\\tc"
    assert escape("\x7f\x85\u202e\x00") == "\\x7f\\x85\\u202e\\x00"
    assert escape("plain text, ünïcode ✓") == "plain text, ünïcode ✓"
    for code in [*range(0x20), *range(0x7F, 0xA0)]:
        assert not RAW.search(escape(chr(code))), code


def test_the_text_log_formatter_escapes_the_message_and_keeps_a_tracebacks_lines() -> None:
    import logging

    formatter = EscapingFormatter("%(levelname)s %(message)s")
    try:
        raise RuntimeError(HOSTILE_ERROR)
    except RuntimeError:
        record = logging.LogRecord(
            "aioqueue", logging.ERROR, __file__, 1, "job %s failed", (HOSTILE_TASK,), sys.exc_info()
        )
    line = formatter.format(record)
    assert not RAW.search(line), line
    first, *rest = line.split("\n")
    assert first == f"ERROR job {escape(HOSTILE_TASK)} failed"
    assert rest[0] == "Traceback (most recent call last):"  # the traceback's own lines kept


async def _boom() -> None:
    raise RuntimeError(HOSTILE_ERROR)


@pytest.fixture
async def planted(aioqueue_url: str, redis: Redis) -> tuple[str, str]:
    """A queue with a dead letter whose error is hostile, a job of a hostile task name (dead
    lettered: unknown task), and a registered worker whose host is hostile. Returns the
    prefix and the first job's id."""
    prefix = unique_prefix()
    async with App(aioqueue_url, prefix=prefix, max_attempts=1) as app:
        app.task(name="boom")(_boom)
        q = app.queue()
        await q.set_events(1000)
        job = await app.tasks["boom"].enqueue()
        await q.enqueue(HOSTILE_TASK, job_id="evil")
        await Worker(app, burst=True, unknown_task_grace=0).run()
        assert (await job.info()).state is JobState.FAILED
        assert (await q.job_info("evil")).state is JobState.FAILED
    keys = QueueKeys(prefix, "default")
    deadline_ms = int(time.time() * 1000) + 3_600_000
    await redis.zadd(keys.workers, {"w-hostile": deadline_ms})
    await redis.hset(keys.worker("w-hostile"), mapping={"host": HOSTILE_HOST, "pid": 1})
    return prefix, job.id


@pytest.mark.parametrize(
    "command",
    [
        ["jobs", "failed"],
        ["dead"],
        ["job", "{job}"],
        ["job", "evil"],
        ["workers"],
        ["info"],
        ["events", "tail", "default", "--since", "0", "--count", "6"],
    ],
    ids=lambda c: " ".join(c),
)
async def test_no_raw_control_character_reaches_the_terminal(
    command: list[str], planted: tuple[str, str], aioqueue_url: str
) -> None:
    prefix, job_id = planted
    args = [a.replace("{job}", job_id) for a in command]
    proc = await asyncio.to_thread(cli, aioqueue_url, prefix, *args)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert not RAW.search(out), repr(out)
    assert "FORGED" not in "".join(line[:6] for line in out.splitlines())  # no forged line
    # the hostile values are shown, escaped, not dropped
    shown = {
        "jobs": ["evil\\e[31m"],
        "dead": ["\\e]0;owned"],
        "workers": ["host\\e[2J"],
        "events": ["\\e[31m"],
    }.get(command[0], [])
    for text in shown:
        assert text in out, out


async def test_a_cli_error_quoting_planted_text_is_escaped(
    planted: tuple[str, str], aioqueue_url: str
) -> None:
    prefix, _ = planted
    proc = await asyncio.to_thread(cli, aioqueue_url, prefix, "job", HOSTILE_TASK)
    assert proc.returncode != 0
    assert not RAW.search(proc.stdout + proc.stderr), repr(proc.stderr)
    assert proc.stderr.count("\n") == 1  # one line


async def test_the_worker_commands_text_log_escapes_planted_text(
    aioqueue_url: str, tmp_path: Path
) -> None:
    """A worker process (``python -m aioqueue worker``) logging a job that failed with a
    hostile error: its log lines on stderr carry no raw control character."""
    prefix = unique_prefix()
    app_file = tmp_path / "hostileapp.py"
    app_file.write_text(
        "from aioqueue import App\n"
        f"app = App(prefix={prefix!r})\n"
        "@app.task\n"
        "async def boom() -> None:\n"
        f"    raise RuntimeError({HOSTILE_ERROR!r})\n"
    )
    async with App(aioqueue_url, prefix=prefix) as producer:
        job = await producer.queue().enqueue("boom", max_attempts=1)
        await producer.queue().enqueue(HOSTILE_TASK)
    proc = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "aioqueue",
            "worker",
            "hostileapp:app",
            "--burst",
            "--url",
            *[aioqueue_url, "--unknown-task-grace", "0"],
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{Path(__file__).parents[1]}"},
    )
    assert proc.returncode == 0, proc.stderr
    async with App(aioqueue_url, prefix=prefix) as producer:
        await wait_until(
            lambda: _failed(producer, job.id), timeout=30, what="the job is dead-lettered"
        )
    assert "owned" in proc.stderr  # the failure was logged, escaped
    assert not RAW.search(proc.stderr), repr(proc.stderr)


async def _failed(app: App, job_id: str) -> bool:
    return (await app.queue().job_info(job_id)).state is JobState.FAILED
