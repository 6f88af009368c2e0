"""The testing kit, round 2: a module-level App lent to many tests (``aioqueue.testing.bind``),
fixtures that work in pytest-asyncio's strict mode, and the kit's frames hidden from a failing
assertion's traceback. The user-project tests run pytest in a subprocess, as a user would."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from aioqueue import App, ConfigurationError
from aioqueue.testing import VirtualClock, bind, run_until_empty

from .support.clirun import user_pytest

#: the user's module: the README's shape, an App made at import time
JOBS = """
from aioqueue import App

app = App(prefix="myproject")
ran = []


@app.task
async def send_mail(to: str) -> str:
    ran.append(to)
    return f"sent to {to}"


@app.task(max_attempts=2)
async def nightly() -> None: ...
"""

CONFTEST = """
import pytest_asyncio
from aioqueue.testing import bind

import jobs


@pytest_asyncio.fixture
async def app(aioqueue_url):
    async with bind(jobs.app, aioqueue_url) as app:
        yield app
"""

TESTS = """
import pytest
from datetime import timedelta

from aioqueue.testing import VirtualClock, assert_enqueued, enqueued, run_until_empty

import jobs

SEEN_PREFIXES = set()


@pytest.mark.asyncio
@pytest.mark.parametrize("n", range(3))
async def test_each_test_has_the_app_to_itself(app, n):
    assert app is jobs.app
    assert app.prefix not in SEEN_PREFIXES  # a prefix of its own: no job of another test
    SEEN_PREFIXES.add(app.prefix)
    assert await enqueued(app) == []
    await jobs.send_mail.enqueue(f"user{n}@example.com")
    await assert_enqueued(app, jobs.send_mail, [f"user{n}@example.com"])
    assert (await run_until_empty(app)).completed == 1


@pytest.mark.asyncio
async def test_the_bound_app_has_a_virtual_clock(app):
    clock = VirtualClock(app)
    job = await jobs.send_mail.options(delay=86400).enqueue("later@example.com")
    assert (await run_until_empty(app, delayed="skip")).scheduled == 1
    await clock.advance(timedelta(days=1))
    assert (await run_until_empty(app, delayed="skip")).completed == 1
    assert await job.result(timeout=5) == "sent to later@example.com"


def test_the_app_is_given_back_unopened_with_its_own_settings():
    assert jobs.app.prefix == "myproject"
    assert not jobs.app.testing
    assert "unopened" in repr(jobs.app)
"""


def run_pytest(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOQUEUE_")}
    env.update(AIOQUEUE_TEST_REDIS_URL=url, PYTHONPATH=str(tmp_path))
    return subprocess.run(
        user_pytest(*args),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_a_module_level_app_is_lent_to_many_tests_in_strict_mode(
    tmp_path: Path, redis_url: str
) -> None:
    (tmp_path / "jobs.py").write_text(JOBS)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_jobs.py").write_text(TESTS)
    proc = run_pytest(tmp_path, redis_url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "5 passed" in proc.stdout, proc.stdout


def test_a_failing_assert_enqueued_shows_the_users_line_and_no_kit_frame(
    tmp_path: Path, redis_url: str
) -> None:
    (tmp_path / "test_fails.py").write_text(
        textwrap.dedent(
            """
            import pytest
            from aioqueue.testing import assert_enqueued, assert_not_enqueued


            @pytest.mark.asyncio
            async def test_expects_a_mail(aioqueue_app):
                @aioqueue_app.task
                async def send_mail(to: str) -> None: ...

                await send_mail.enqueue("bob@example.com")
                await assert_not_enqueued(aioqueue_app, "charge_card")
                await assert_enqueued(aioqueue_app, send_mail, ["ann@example.com"])  # USER LINE
            """
        )
    )
    proc = run_pytest(tmp_path, redis_url, "--tb=long")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 failed" in out
    assert "# USER LINE" in out  # the failing line of the user's test
    assert "expected at least one waiting job(s) send_mail" in out
    assert "bob@example.com" in out  # what does wait
    assert "aioqueue/testing" not in out  # no frame of the kit
    assert "_queue/" not in out


async def test_bind_gives_the_app_back_as_it_was_and_refuses_an_open_app(redis_url: str) -> None:
    app = App("redis://example.invalid:1/0", prefix="mine")

    @app.task
    async def echo(x: int) -> int:
        return x

    sharded = app.queue("wide", shards=2)
    prefixes = []
    for n in range(2):
        async with bind(app, redis_url) as bound:
            assert bound is app
            assert app.testing
            prefixes.append(app.prefix)
            assert app.queue("wide", shards=2).queues[0]._keys.prefix == app.prefix
            job = await echo.enqueue(n)
            assert (await run_until_empty(app)).completed == 1
            assert await job.result(timeout=5) == n
            VirtualClock(app)  # test mode: accepted
            with pytest.raises(ConfigurationError, match="is open"):
                async with bind(app, redis_url):
                    pass
        assert (app.url, app.prefix, app.testing) == ("redis://example.invalid:1/0", "mine", False)
        assert "unopened" in repr(app)
    assert prefixes[0] != prefixes[1]
    assert app.queue("wide", shards=2) is not sharded  # made again on each prefix
    assert app.queue("wide", shards=2).queues[0]._keys.prefix == "mine"


async def test_bind_takes_a_prefix_and_production_mode(redis_url: str) -> None:
    app = App(redis_url)
    async with bind(app, redis_url, prefix="kitbind", testing=False):
        assert app.prefix == "kitbind"
        with pytest.raises(ConfigurationError, match="testing=True"):
            VirtualClock(app)
    assert app.prefix == "aq"
