"""The operator's commands of ``python -m aioqueue``, run as a user runs them (a subprocess)
against the suite's server: their tables, their ``--json`` shapes, their exit codes (0 ok, 1
failure at run time, 2 bad command line) and one-line errors."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from aioqueue import App, JobNotFound, JobState, Worker
from aioqueue._store.embedded import attach_or_start

from .support.apps import unique_prefix
from .support.clirun import aioqueue_cli as cli
from .support.prewarmed import run_aioqueue
from .support.waiting import wait_until


def ok_json(url: str, prefix: str, *args: str) -> Any:
    res = cli(url, prefix, *args, "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def one_line_error(res: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    assert res.returncode == code, (res.stdout, res.stderr)
    assert res.stderr.count("\n") == 1, res.stderr
    assert "Traceback" not in res.stderr
    assert text in res.stderr


@pytest.fixture
async def dead_app(redis_url: str) -> Any:
    """An App on a fresh prefix with 3 dead letters (task ``boom``; one in group ``acme``) and
    one scheduled job, on the queue ``default``."""
    async with App(redis_url, prefix=unique_prefix()) as app:
        q = app.queue()
        for i, group in ((1, None), (2, None), (3, "acme")):
            await q.enqueue("boom", (i,), group=group, max_attempts=1)
        for r in await q.reserve(10):
            await q.fail(r, RuntimeError(f"broken {r.args[0]}"), retry=False)
        await q.enqueue("later", (4,), delay=3600)
        yield app


async def test_info_jobs_dead_and_job_print_tables_and_json(redis_url: str, dead_app: App) -> None:
    p = dead_app.prefix
    info = ok_json(redis_url, p, "info")
    [row] = info["queues"]
    assert row["queue"] == "default"
    assert (row["failed"], row["scheduled"], row["queued"], row["failed_1h"]) == (3, 1, 0, 3)
    table = cli(redis_url, p, "info").stdout.splitlines()
    assert table[0].split()[:6] == ["QUEUE", "SCHEDULED", "QUEUED", "WAIT", "ACTIVE", "FAILED"]
    assert table[1].split()[:6] == ["default", "1", "0", "-", "0", "3"]

    dead = ok_json(redis_url, p, "dead")
    assert set(dead) == {"queue", "items", "cursor"}
    assert dead["cursor"] is None
    messages = {j["error"]["message"] for j in dead["items"]}
    assert messages == {"broken 1", "broken 2", "broken 3"}
    died = [j["finished_ms"] for j in dead["items"]]
    assert died == sorted(died, reverse=True)  # newest first
    oldest = ok_json(redis_url, p, "dead", "--oldest-first")["items"]
    assert [j["id"] for j in oldest] == [j["id"] for j in dead["items"]][::-1]
    [item] = [j for j in dead["items"] if j["group"] == "acme"]
    assert {"id", "task", "state", "group", "attempts", "max_attempts", "error"} <= set(item)
    assert item["state"] == "failed"
    assert item["group"] == "acme"
    text = cli(redis_url, p, "dead").stdout
    assert "RuntimeError: broken 1" in text

    page = ok_json(redis_url, p, "jobs", "failed", "--limit", "2")
    assert len(page["items"]) == 2
    assert page["cursor"]
    rest = ok_json(redis_url, p, "jobs", "failed", "--limit", "2", "--cursor", page["cursor"])
    assert len(rest["items"]) == 1
    assert rest["cursor"] is None
    more = cli(redis_url, p, "jobs", "failed", "--limit", "2").stdout
    assert f"--cursor {page['cursor']}" in more

    detail = ok_json(redis_url, p, "job", item["id"])
    assert detail["info"]["args"] == [3]
    assert detail["info"]["error"]["type"] == "RuntimeError"
    assert detail["group"] == "acme"
    human = cli(redis_url, p, "job", item["id"]).stdout
    assert "state        failed" in human
    assert "error        RuntimeError: broken 3" in human


async def test_retry_promote_cancel_and_purge_change_the_queue(
    redis_url: str, dead_app: App
) -> None:
    p, q = dead_app.prefix, dead_app.queue()
    assert ok_json(redis_url, p, "retry", "--group", "acme")["count"] == 1
    res = ok_json(redis_url, p, "retry", "--all")
    assert res == {"queue": "default", "action": "retry", "count": 2}
    assert (await q.counts())["queued"] == 3
    scheduled = (await q.jobs("scheduled")).items[0].id
    assert ok_json(redis_url, p, "promote", scheduled)["count"] == 1
    assert ok_json(redis_url, p, "cancel", "--task", "later")["count"] == 1
    assert (await q.job_info(scheduled)).state is JobState.CANCELLED
    assert (
        ok_json(redis_url, p, "purge", "--state", "queued", "--task", "boom", "--yes")["count"] == 3
    )
    assert (await q.counts()) == {"scheduled": 0, "queued": 0, "active": 0, "failed": 0}
    assert ok_json(redis_url, p, "purge", scheduled, "--yes")["count"] == 1
    with pytest.raises(JobNotFound):
        await q.job_info(scheduled)


async def test_purge_asks_first_and_does_nothing_unconfirmed(redis_url: str, dead_app: App) -> None:
    p = dead_app.prefix
    res = cli(redis_url, p, "purge", "--all", stdin="")  # not a terminal: it cannot ask
    one_line_error(res, 2, "stdin is not a terminal; pass --yes")
    assert (await dead_app.queue().counts())["failed"] == 3
    out = ok_json(redis_url, p, "purge", "--all", "--yes")
    assert out["count"] == 4
    assert out["by_state"] == {
        "queued": 0,
        "scheduled": 1,
        "failed": 3,
        "completed": 0,
        "cancelled": 0,
    }


async def test_enqueue_pause_resume_limit(redis_url: str) -> None:
    async with App(redis_url, prefix=unique_prefix()) as app:
        p, q = app.prefix, app.queue("mail")
        out = ok_json(
            redis_url,
            p,
            "enqueue",
            "send",
            "-q",
            "mail",
            "--args",
            '["a@b.c"]',
            "--kwargs",
            '{"urgent": true}',
            "--priority",
            "5",
            "--group",
            "acme",
        )
        info = await q.job_info(out["id"])
        assert (info.task, info.args, info.kwargs, info.priority) == (
            "send",
            ("a@b.c",),
            {"urgent": True},
            5,
        )
        assert cli(redis_url, p, "pause", "-q", "mail").returncode == 0
        assert await q.is_paused()
        assert cli(redis_url, p, "resume", "-q", "mail").returncode == 0
        assert not await q.is_paused()
        assert cli(redis_url, p, "pause", "-q", "mail", "--group", "acme").returncode == 0
        res = cli(
            redis_url,
            p,
            "limit",
            "-q",
            "mail",
            "--group",
            "acme",
            "--concurrency",
            "3",
            "--rate",
            "10",
            "--per",
            "2",
        )
        assert res.returncode == 0, res.stderr
        [g] = await q.groups()
        assert (g.name, g.paused, g.limit, g.rate, g.rate_seconds, g.queued) == (
            "acme",
            True,
            3,
            10,
            2.0,
            1,
        )
        groups = ok_json(redis_url, p, "groups", "-q", "mail")["groups"]
        assert groups == [
            {
                "name": "acme",
                "queued": 1,
                "active": 0,
                "limit": 3,
                "rate": 10,
                "rate_seconds": 2.0,
                "paused": True,
            }
        ]
        table = cli(redis_url, p, "groups", "-q", "mail").stdout.splitlines()
        assert table[1].split() == ["acme", "1", "0", "3", "10/2s", "yes"]
        res = cli(redis_url, p, "limit", "-q", "mail", "--group", "acme", "--concurrency", "none")
        assert res.returncode == 0
        assert (await q.groups())[0].limit is None


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (("jobs", "sleeping"), 2, "invalid choice"),
        (("jobs", "failed", "--limit", "0"), 2, "must be >= 1"),
        (("retry",), 2, "give job ids, a filter"),
        (("purge",), 2, "give job ids, --state"),
        (("limit", "--group", "g"), 2, "give --concurrency"),
        (("enqueue", "t", "--args", "{"), 2, "invalid JSON"),
        (("enqueue", "t", "--args", "{}"), 2, "expected a JSON list"),
        (("jobs", "queued", "--cursor", "garbage"), 2, "invalid cursor"),
        (("jobs", "failed", "-q", "bad{name}"), 2, "invalid queue name"),
        (("job", "no-such-job"), 1, "no job 'no-such-job'"),
    ],
)
def test_bad_command_lines_and_failures_exit_with_one_line(
    redis_url: str, args: tuple[str, ...], code: int, text: str
) -> None:
    one_line_error(cli(redis_url, unique_prefix(), *args), code, text)


def test_an_unreachable_server_is_a_failure_not_a_traceback(redis_url: str) -> None:
    res = run_aioqueue(["info", "-q", "x", "--url", "redis://127.0.0.1:1/0"])
    one_line_error(res, 1, "ServerUnavailable")


async def test_workers_lists_the_registry_and_info_counts_the_live_ones(redis_url: str) -> None:
    prefix = unique_prefix()
    async with App(redis_url, prefix=prefix) as app:
        q = app.queue()
        async with Worker(app, concurrency=7) as worker:

            async def registered() -> bool:
                return bool(await q.workers())

            await wait_until(registered, timeout=30, what="the worker's registration")
            # the command runs in a thread: the worker's event loop keeps beating meanwhile
            found = await asyncio.to_thread(ok_json, redis_url, prefix, "workers")
            assert found["queue"] == "default"
            (w,) = found["workers"]
            assert (w["id"], w["concurrency"], w["alive"]) == (worker.id, 7, True)
            assert w["queues"] == ["default"]
            res = await asyncio.to_thread(cli, redis_url, prefix, "workers")
            assert res.returncode == 0, res.stderr
            assert worker.id in res.stdout
            assert "yes" in res.stdout
            info = await asyncio.to_thread(ok_json, redis_url, prefix, "info", "-q", "default")
            assert info["queues"][0]["workers"] == 1
            worker.stop()
        # a worker that stopped leaves the registry
        assert ok_json(redis_url, prefix, "workers")["workers"] == []
        res = cli(redis_url, prefix, "workers")
        assert res.returncode == 0
        assert "no workers registered" in res.stdout


async def test_info_lists_the_queues_schedules_with_their_next_runs(redis_url: str) -> None:
    from datetime import timedelta

    prefix = unique_prefix()
    async with App(redis_url, prefix=prefix) as app:

        @app.task
        async def report(kind: str) -> None:
            pass

        await app.schedules.add(report, every=timedelta(minutes=5), args=["daily"])
        await app.queue().enqueue("report", ["now"])  # the queue has counters: info finds it
    out = await asyncio.to_thread(ok_json, redis_url, prefix, "info")
    [schedule] = out["schedules"]
    assert (schedule["name"], schedule["queue"], schedule["every_seconds"]) == (
        "report",
        "default",
        300.0,
    )
    assert schedule["next_run_ms"] % 300_000 == 0
    res = await asyncio.to_thread(cli, redis_url, prefix, "info")
    assert res.returncode == 0, res.stderr
    assert "every 300 s" in res.stdout


# the development server listens on one fixed port (6399): its tests run on one xdist worker
@pytest.mark.xdist_group("embedded-dev-port")
def test_an_operator_command_keeps_the_server_it_started_for_its_whole_life(
    tmp_path: Path,
) -> None:
    # before, a command dropped its only handle on the server it started, and the server was
    # stopped before the command's first request (ServerUnavailable ... :6399)
    res = embedded_cli(tmp_path, "info", "-q", "default", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["queues"][0]["queue"] == "default"


@pytest.mark.xdist_group("embedded-dev-port")
def test_every_operator_command_takes_embedded(tmp_path: Path) -> None:
    # health, events, schedules and metrics refused --embedded; each now uses the development
    # server a `worker --embedded` keeps running (here: one this test keeps running)
    dev = attach_or_start(tmp_path / "dev")
    try:
        for argv, code in [
            (("info", "-q", "default", "--json"), 0),
            (("jobs", "queued", "-q", "default", "--json"), 0),
            (("schedules", "--json"), 0),
            (("events", "status", "default"), 0),
            (("health", "-q", "default", "--timeout", "1"), 1),  # the server answers; no worker
        ]:
            res = embedded_cli(tmp_path, *argv)
            assert res.returncode == code, (argv, res.stdout, res.stderr)
            assert "ServerUnavailable" not in res.stderr
            assert "Traceback" not in res.stderr
        helped = run_aioqueue(["metrics", "--help"])  # metrics serves: --help shows the option
        assert helped.returncode == 0, helped.stderr
        assert helped.stdout.count("--embedded")
    finally:
        dev.detach()


def embedded_cli(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AIOQUEUE_REDIS_URL"}
    return run_aioqueue([*argv, "--embedded"], cwd=cwd, env=env)


def test_a_reader_that_goes_away_ends_the_command_quietly(redis_url: str) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # like `| head -1` that has already exited: every write fails (EPIPE)
    argv = ["jobs", "queued", "-q", "x", "--json", "--url", redis_url, "--prefix", unique_prefix()]
    try:
        res = subprocess.run(
            [sys.executable, "-m", "aioqueue", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
