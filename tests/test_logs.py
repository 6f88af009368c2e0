"""Job context on log lines (issue 14, point 5): every line logged while a job runs, by the
task's own logger or by aioqueue, carries the job's id, task, queue and attempt, in text or
JSON lines; lines outside a job carry none."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from aioqueue import App, Backoff, JobContextFilter, JobFailed, JsonLogFormatter, Worker

from .support.processes import WorkerProcesses
from .support.waiting import wait_until


class Capture(logging.Handler):
    """A handler that keeps what it is given, with the job filter on it."""

    def __init__(self, formatter: logging.Formatter | None = None) -> None:
        super().__init__(logging.DEBUG)
        self.addFilter(JobContextFilter())
        self.records: list[logging.LogRecord] = []
        self.lines: list[str] = []
        if formatter is not None:
            self.setFormatter(formatter)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.lines.append(self.format(record))


@pytest.fixture
def capture() -> Any:
    handler = Capture()
    root = logging.getLogger()
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(old)


def fields(r: logging.LogRecord) -> tuple[Any, ...]:
    return (r.job_id, r.job_task, r.job_queue, r.job_attempt)  # type: ignore[attr-defined]


async def test_task_and_aioqueue_lines_carry_the_job(app: App, capture: Capture) -> None:
    own = logging.getLogger("tasks.mine")

    @app.task
    async def hello(n: int) -> int:
        own.info("async %d", n)
        return n

    @app.task
    def hello_sync(n: int) -> int:  # in a thread: the context is copied there
        own.info("sync %d", n)
        return n

    @app.task(max_attempts=2, backoff=Backoff(base=0.01, jitter=0.0))
    async def bad() -> None:
        own.warning("failing")
        raise ValueError("nope")

    j1 = await hello.enqueue(1)
    j2 = await hello_sync.enqueue(2)
    j3 = await bad.enqueue()
    async with Worker(app, concurrency=4):
        assert await j1.result(timeout=30) == 1
        assert await j2.result(timeout=30) == 2
        with pytest.raises(JobFailed):
            await j3.result(timeout=30)
    q = app.default_queue
    mine = {r.getMessage(): fields(r) for r in capture.records if r.name == "tasks.mine"}
    assert mine["async 1"] == (j1.id, "hello", q, 1)
    assert mine["sync 2"] == (j2.id, "hello_sync", q, 1)
    failing = [fields(r) for r in capture.records if r.getMessage() == "failing"]
    assert failing == [(j3.id, "bad", q, 1), (j3.id, "bad", q, 2)]
    # aioqueue's own lines about the run: the retry, then the dead letter
    pool = [
        r
        for r in capture.records
        if r.name == "aioqueue._worker.worker" and j3.id in r.getMessage()
    ]
    assert [fields(r) for r in pool] == [(j3.id, "bad", q, 1), (j3.id, "bad", q, 2)]
    assert all(f" [job {j3.id} task=bad queue={q} attempt=" in r.job_context for r in pool)  # type: ignore[attr-defined]
    # the worker's own lines, outside any job, carry none
    started = next(r for r in capture.records if "consuming" in r.getMessage())
    assert fields(started) == (None, None, None, None)
    assert started.job_context == ""  # type: ignore[attr-defined]


def test_json_lines_hold_the_message_the_job_and_the_traceback() -> None:
    handler = Capture(JsonLogFormatter())
    log = logging.getLogger("test_logs.json")
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)
    try:
        try:
            raise RuntimeError("x")
        except RuntimeError:
            log.exception("with %s", "traceback", extra={"job_id": "j1", "job_task": "t"})
        log.info("plain \u00e9 %r", object)
    finally:
        log.removeHandler(handler)
        log.propagate = True
    first, second = (json.loads(line) for line in handler.lines)
    assert first["message"] == "with traceback"
    assert first["level"] == "ERROR"
    assert first["logger"] == "test_logs.json"
    assert (first["job_id"], first["job_task"]) == ("j1", "t")
    assert "RuntimeError: x" in first["exception"]
    assert first["time"].endswith("+00:00")
    assert second["message"] == "plain \u00e9 <class 'object'>"
    assert "job_id" not in second
    assert "exception" not in second


@pytest.mark.slow
async def test_a_worker_process_writes_json_lines_with_the_job(
    tmp_path: Path, redis_url: str, prefix: str, producer: App
) -> None:
    procs = WorkerProcesses(tmp_path, redis_url, prefix, app="tests.obsapp:app")
    try:
        w = procs.start(extra=("--log-format", "json"))
        q = producer.queue()

        async def declared() -> bool:  # the worker's task table is written
            return bool(await producer.redis.hexists(f"{q._keys.base}tasks", "boom"))

        await wait_until(declared, timeout=60, what=f"the worker's task table:\n{procs.logs()}")
        ok = await q.enqueue("ok", [7])
        boom = await q.enqueue("boom", ["bad input"])
        assert await ok.result(timeout=60) == 7
        with pytest.raises(JobFailed):
            await boom.result(timeout=60)

        def lines() -> list[dict[str, Any]]:
            return [json.loads(s) for s in w.log_text().splitlines() if s.startswith("{")]

        def dead_lettered() -> bool:
            return any("dead-lettered" in line["message"] for line in lines())

        await wait_until(dead_lettered, timeout=30, what=f"the dead letter line:\n{procs.logs()}")
        out = lines()
        assert len(out) == len(w.log_text().splitlines())  # every line is a JSON object
        running = next(line for line in out if line["message"] == "ok task running with n=7")
        assert running["logger"] == "obsapp.tasks"
        assert (running["job_id"], running["job_task"], running["job_attempt"]) == (ok.id, "ok", 1)
        assert running["job_queue"] == q.name
        about_boom = [line for line in out if line.get("job_id") == boom.id]
        # by name, the job takes the defaults its live worker declared: 2 attempts (before
        # the worker had written its task table, the producer's own 3: the test waits for it)
        assert {(line["logger"], line["job_attempt"]) for line in about_boom} == {
            (logger, attempt)
            for logger in ("obsapp.tasks", "aioqueue._worker.worker")
            for attempt in (1, 2)
        }
        assert not any("job_id" in line for line in out if "consuming" in line["message"])
    finally:
        procs.close()
        print(procs.logs())


async def test_text_lines_end_with_the_job(app: App) -> None:
    from aioqueue._app.logs import TEXT_FORMAT

    handler = Capture(logging.Formatter(TEXT_FORMAT))
    own = logging.getLogger("tasks.text")
    own.addHandler(handler)
    own.setLevel(logging.INFO)
    try:

        @app.task
        async def say() -> None:
            own.info("hello")

        job = await say.enqueue()
        own.info("before")
        async with Worker(app):
            await job.result(timeout=30)
    finally:
        own.removeHandler(handler)
        own.setLevel(logging.NOTSET)
    before, hello = handler.lines
    assert before.endswith(" INFO tasks.text: before")
    assert hello.endswith(
        f" INFO tasks.text: hello [job {job.id} task=say queue=default attempt=1]"
    )


def test_the_json_formatter_keeps_a_cached_traceback_and_a_stack() -> None:
    # a record whose exc_info was already formatted (and dropped) by another handler, and
    # one logged with stack_info=True
    fmt = JsonLogFormatter()
    cached = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, None)
    cached.exc_text = "Traceback (most recent call last):\nValueError: boom"
    out = json.loads(fmt.format(cached))
    assert out["exception"] == cached.exc_text
    assert "stack" not in out
    stacked = logging.LogRecord("x", logging.INFO, __file__, 1, "here", None, None)
    stacked.stack_info = "Stack (most recent call last):\n  File 'a.py', line 1"
    out = json.loads(fmt.format(stacked))
    assert out["stack"] == stacked.stack_info
    assert "exception" not in out


@pytest.mark.parametrize(("fmt", "kind"), [("json", JsonLogFormatter), ("text", logging.Formatter)])
def test_the_worker_command_configures_one_root_handler_with_the_job_filter(
    fmt: str, kind: type[logging.Formatter]
) -> None:
    from aioqueue._app.logs import configure

    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    root.handlers.clear()
    try:
        configure("WARNING", fmt)
        (handler,) = root.handlers
        assert root.level == logging.WARNING
        assert any(isinstance(f, JobContextFilter) for f in handler.filters)
        assert isinstance(handler.formatter, kind)
        if fmt == "text":  # control characters escaped, the job's context appended
            assert not isinstance(handler.formatter, JsonLogFormatter)
            assert handler.formatter._fmt is not None
            assert handler.formatter._fmt.endswith("%(job_context)s")
    finally:
        root.handlers[:] = saved
        root.setLevel(level)
