"""Lifecycle hooks, middleware and enqueue hooks (``_hooks.py``), on a real server with real
workers: their order, the state tasks reach, and what each failure does."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from aioqueue import (
    App,
    Backoff,
    CallNext,
    EnqueueEvent,
    JobContext,
    JobFailed,
    JobState,
    StartupFailed,
    State,
    Worker,
    current_job,
)

from .support.apps import open_app


@dataclass
class Pool:
    """Stands for a database pool a startup hook opens."""

    name: str
    closed: bool = False


# ---------------------------------------------------------------------- State
def test_state_is_keyed_by_type_and_says_what_is_missing() -> None:
    state = State()
    pool = state.set(Pool("main"))
    assert state.get(Pool) is pool
    assert Pool in state
    assert int not in state
    with pytest.raises(LookupError, match=r"no int in the worker's state: set it in an @app"):
        state.get(int)
    state.set(True, as_type=int)  # under a base class
    assert state.get(int) is True
    with pytest.raises(TypeError, match="is not a str"):
        state.set(1, as_type=str)


# ---------------------------------------------------------------------- startup / shutdown
async def test_startup_hooks_share_state_with_tasks_and_shutdown_runs_in_reverse(
    redis_url: str,
) -> None:
    calls: list[str] = []
    async with open_app(redis_url) as app:

        @app.on_startup
        async def open_pool(state: State) -> None:
            calls.append("open_pool")
            state.set(Pool("main"))

        @app.on_startup
        async def warm_cache(state: State) -> None:
            calls.append(f"warm_cache sees {state.get(Pool).name}")  # after open_pool

        @app.on_shutdown
        async def close_pool(state: State) -> None:
            calls.append(f"close_pool after {len(done)} jobs")
            state.get(Pool).closed = True

        @app.on_shutdown
        async def flush(state: State) -> None:
            calls.append("flush")

        done: list[str] = []

        @app.task
        async def query(n: int) -> str:
            pool = current_job().state.get(Pool)  # typed: a Pool
            done.append(pool.name)
            return f"{pool.name}:{n}"

        @app.task
        def blocking_query() -> bool:  # a sync task sees the same state in its thread
            return current_job().state.get(Pool).closed

        jobs = [await query.enqueue(i) for i in range(3)]
        sync_job = await blocking_query.enqueue()
        worker = Worker(app, burst=True)
        await worker.run()
        assert [await j.result(timeout=10) for j in jobs] == ["main:0", "main:1", "main:2"]
        assert await sync_job.result(timeout=10) is False
        assert calls == ["open_pool", "warm_cache sees main", "flush", "close_pool after 3 jobs"]
        assert worker.state.get(Pool).closed


async def test_a_failing_startup_hook_stops_the_worker_before_it_fetches(redis_url: str) -> None:
    ran: list[str] = []
    async with open_app(redis_url) as app:

        @app.on_startup
        async def open_pool(state: State) -> None:
            raise ConnectionRefusedError("database at db:5432 refused\nthe connection")

        @app.on_shutdown
        async def close_pool(state: State) -> None:
            ran.append("close_pool")

        @app.task
        async def work() -> None:
            ran.append("work")

        job = await work.enqueue()
        with pytest.raises(StartupFailed) as info:
            await Worker(app).run()  # not burst: only the failure can end it
        assert str(info.value) == (
            "startup hook test_a_failing_startup_hook_stops_the_worker_before_it_fetches."
            "<locals>.open_pool failed: ConnectionRefusedError: database at db:5432 refused "
            "the connection"
        )
        assert isinstance(info.value.__cause__, ConnectionRefusedError)
        assert ran == []  # no job ran, no shutdown hook ran
        assert await job.state() is JobState.QUEUED


async def test_a_failing_shutdown_hook_is_logged_and_the_others_still_run(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[str] = []
    async with open_app(redis_url) as app:

        @app.on_shutdown
        async def first(state: State) -> None:
            ran.append("first")

        @app.on_shutdown
        async def broken(state: State) -> None:
            raise RuntimeError("cannot flush")

        with caplog.at_level(logging.ERROR, logger="aioqueue.hooks"):
            await Worker(app, burst=True).run()  # returns normally
        assert ran == ["first"]
        assert "shutdown hook" in caplog.text
        assert "broken failed" in caplog.text
        assert "RuntimeError: cannot flush" in caplog.text


HOOKS_APP = textwrap.dedent(
    """
    import os

    from aioqueue import App, State

    app = App(prefix=os.environ["HOOKS_TEST_PREFIX"])


    @app.on_startup
    async def open_db(state: State) -> None:
        raise ConnectionRefusedError("database refused the connection")
    """
)


@pytest.mark.slow
def test_the_cli_reports_a_failing_startup_hook_in_one_line_and_exits_1(
    tmp_path: Path, redis_url: str
) -> None:
    (tmp_path / "hooksapp.py").write_text(HOOKS_APP)
    env = {k: v for k, v in os.environ.items() if k != "AIOQUEUE_REDIS_URL"}
    env["HOOKS_TEST_PREFIX"] = "hooks-cli"
    proc = subprocess.run(
        [sys.executable, "-m", "aioqueue", "worker", "hooksapp:app", "--url", redis_url],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0] == (
        "aioqueue: error: StartupFailed: startup hook open_db failed: "
        "ConnectionRefusedError: database refused the connection"
    )


# ---------------------------------------------------------------------- middleware
async def test_middleware_wraps_each_run_outermost_first(redis_url: str) -> None:
    trace: list[str] = []
    async with open_app(redis_url) as app:

        @app.middleware
        async def outer(job: JobContext, call_next: CallNext) -> Any:
            trace.append(f"outer> {job.task}#{job.attempt}")
            try:
                return await call_next()
            finally:
                trace.append("outer<")

        @app.middleware
        async def inner(job: JobContext, call_next: CallNext) -> Any:
            trace.append(f"inner> {current_job().id == job.id}")
            result = await call_next()
            trace.append("inner<")
            return f"[{result}]"  # a middleware may replace the result

        @app.task
        async def hello(name: str) -> str:
            trace.append("task")
            return f"hello {name}"

        @app.task
        def blocking(name: str) -> str:
            return name.upper()

        job = await hello.enqueue("ann")
        await Worker(app, burst=True).run()
        assert await job.result(timeout=10) == "[hello ann]"
        assert trace == ["outer> hello#1", "inner> True", "task", "inner<", "outer<"]
        sync_job = await blocking.enqueue("bob")
        await Worker(app, burst=True).run()
        assert await sync_job.result(timeout=10) == "[BOB]"


async def test_a_failing_middleware_fails_the_attempt_not_the_worker(redis_url: str) -> None:
    async with open_app(redis_url, backoff=Backoff(base=0.01, max=0.01)) as app:

        @app.middleware
        async def flaky_session(job: JobContext, call_next: CallNext) -> Any:
            if job.attempt == 1:  # e.g. the database session cannot open this time
                raise ConnectionError("no database session")
            return await call_next()

        @app.task(max_attempts=3)
        async def save(n: int) -> int:
            return n * 2

        @app.task(max_attempts=2)
        async def never(n: int) -> int:
            return n

        @app.middleware
        async def refuse_never(job: JobContext, call_next: CallNext) -> Any:
            if job.task == "never":
                raise PermissionError(f"job {job.id} refused by middleware")
            return await call_next()

        jobs = [await save.enqueue(i) for i in range(5)]
        dead = await never.enqueue(1)
        async with Worker(app) as worker:  # it survives every failure
            assert [await j.result(timeout=30) for j in jobs] == [0, 2, 4, 6, 8]
            with pytest.raises(JobFailed) as info:
                await dead.result(timeout=30)
            assert worker.failed >= 1
        for j in jobs:
            assert (await j.info()).attempts == 2  # retried by the task's policy
        assert info.value.error_type == "PermissionError"
        assert "refused by middleware" in info.value.error_message
        assert (await dead.info()).attempts == 2


async def test_middleware_runs_within_the_jobs_timeout(redis_url: str) -> None:
    async with open_app(redis_url) as app:

        @app.middleware
        async def slow(job: JobContext, call_next: CallNext) -> Any:
            import asyncio

            await asyncio.sleep(30)  # the timeout below cancels it
            return await call_next()

        @app.task(timeout=0.2, max_attempts=1)
        async def quick() -> None:
            return None

        job = await quick.enqueue()
        await Worker(app, burst=True).run()
        with pytest.raises(JobFailed) as info:
            await job.result(timeout=10)
        assert info.value.error_type == "JobTimeout"


# ---------------------------------------------------------------------- enqueue hooks
async def test_enqueue_hooks_see_queue_task_and_ids(redis_url: str) -> None:
    seen: list[tuple[str, EnqueueEvent, bool]] = []
    async with open_app(redis_url) as app:
        stored: set[str] = set()

        @app.before_enqueue
        def before(event: EnqueueEvent) -> None:
            seen.append(("before", event, bool(set(event.job_ids) & stored)))

        @app.after_enqueue
        def after(event: EnqueueEvent) -> None:
            seen.append(("after", event, True))
            stored.update(event.job_ids)

        @app.task(queue="mail")
        async def send(to: str) -> None:
            return None

        one = await send.enqueue("ann")
        many = await send.enqueue_many([{"to": "bob"}, {"to": "cy"}])
        by_name = await app.queue("other").enqueue("remote.task", ["x"])
        assert seen == [
            ("before", EnqueueEvent("mail", "send", (one.id,)), False),
            ("after", EnqueueEvent("mail", "send", (one.id,)), True),
            ("before", EnqueueEvent("mail", "send", (many[0].id, many[1].id)), False),
            ("after", EnqueueEvent("mail", "send", (many[0].id, many[1].id)), True),
            ("before", EnqueueEvent("other", "remote.task", (by_name.id,)), False),
            ("after", EnqueueEvent("other", "remote.task", (by_name.id,)), True),
        ]
        for job in (one, *many, by_name):
            assert await job.state() is JobState.QUEUED


async def test_a_before_enqueue_hook_refuses_and_an_after_enqueue_failure_is_logged(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with open_app(redis_url) as app:

        @app.before_enqueue
        def only_mail(event: EnqueueEvent) -> None:
            if event.queue != "mail":
                raise PermissionError(f"this service may not enqueue to {event.queue!r}")

        @app.after_enqueue
        def broken_metrics(event: EnqueueEvent) -> None:
            raise RuntimeError("metrics backend down")

        @app.task(queue="mail")
        async def send(to: str) -> None:
            return None

        with pytest.raises(PermissionError, match="may not enqueue to 'billing'"):
            await send.options(queue="billing").enqueue("ann")
        with pytest.raises(PermissionError):
            await send.options(queue="billing").enqueue_many([{"to": "bob"}])
        counts = await app.queue("billing").counts()
        assert counts == {"scheduled": 0, "queued": 0, "active": 0, "failed": 0}

        with caplog.at_level(logging.ERROR, logger="aioqueue.hooks"):
            job = await send.enqueue("ann")  # stored, and returned despite the hook
        assert await job.state() is JobState.QUEUED
        assert "after-enqueue hook" in caplog.text
        assert "metrics backend down" in caplog.text


def test_hooks_of_the_wrong_kind_are_refused_when_registered() -> None:
    app = App(prefix="unused")

    async def async_fn(*args: Any) -> None:
        return None

    def plain_fn(*args: Any) -> None:
        return None

    class AsyncCallable:
        async def __call__(self, state: State) -> None:
            return None

    with pytest.raises(TypeError, match="must be a plain"):
        app.before_enqueue("not a function")  # type: ignore[type-var]
    with pytest.raises(TypeError, match="must be a plain"):
        app.after_enqueue(async_fn)  # type: ignore[type-var]
    for register in (app.on_startup, app.on_shutdown, app.middleware):
        with pytest.raises(TypeError, match="must be an async function"):
            register(plain_fn)  # type: ignore[type-var]
    app.on_startup(AsyncCallable())
    assert len(app.hooks.startup) == 1
    assert not app.hooks.on_enqueue  # nothing was registered


async def test_run_until_empty_runs_the_hooks_around_each_round(redis_url: str) -> None:
    from aioqueue.testing import run_until_empty

    events: list[str] = []
    async with open_app(redis_url) as app:

        @app.on_startup
        async def start(state: State) -> None:
            events.append("start")
            state.set(Pool("test"))

        @app.on_shutdown
        async def stop(state: State) -> None:
            events.append("stop")

        @app.task
        async def step(n: int) -> str:
            if n:
                await step.enqueue(n - 1)  # runs in this round or the next
            return current_job().state.get(Pool).name

        job = await step.enqueue(1)
        await run_until_empty(app)
        assert await job.result(timeout=10) == "test"
        # one burst worker per round (one or more): each starts and stops with the hooks
        assert events
        assert events == ["start", "stop"] * (len(events) // 2)


async def test_each_worker_has_its_own_state(redis_url: str) -> None:
    async with open_app(redis_url) as app:
        made = 0

        @app.on_startup
        async def open_pool(state: State) -> None:
            nonlocal made
            made += 1
            state.set(Pool(f"pool-{made}"))

        @app.task
        async def which() -> str:
            await asyncio.sleep(0.01)
            return current_job().state.get(Pool).name

        jobs = [await which.enqueue() for _ in range(40)]
        async with Worker(app, concurrency=5) as w1, Worker(app, concurrency=5) as w2:
            names = {await j.result(timeout=30) for j in jobs}
        assert {w1.state.get(Pool).name, w2.state.get(Pool).name} == {"pool-1", "pool-2"}
        assert names <= {"pool-1", "pool-2"}
