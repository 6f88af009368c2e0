"""OpenTelemetry traces (issue 14, point 4): enqueue is a PRODUCER span whose W3C
traceparent travels in the job (signed with it), the run a CONSUMER child span with the job's
attributes and outcome, admin calls are spans; one trace from enqueue to run, in one process
(the SDK's in-memory exporter) and across two (a worker process exporting to a file)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Span, SpanKind, StatusCode

from aioqueue import App, Backoff, BadSignature, JobFailed, Retry, Worker, current_job
from aioqueue._model.codec import carried_trace
from aioqueue.otel import instrument

from .support.apps import open_app, unique_prefix
from .support.processes import WorkerProcesses
from .support.spans import read_spans
from .support.waiting import wait_until


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    p = TracerProvider()
    p.add_span_processor(SimpleSpanProcessor(exporter))
    yield p
    p.shutdown()


@pytest.fixture
async def traced(redis_url: str, provider: TracerProvider) -> AsyncIterator[App]:
    async with open_app(redis_url) as app:
        instrument(app, provider)
        yield app


def named(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def attr(s: ReadableSpan | Event, key: str) -> Any:
    return dict(s.attributes or {}).get(key)


def ids(s: ReadableSpan | Span) -> tuple[int, int]:
    ctx = s.get_span_context()
    assert ctx is not None
    return ctx.trace_id, ctx.span_id


async def test_one_trace_from_enqueue_to_run(
    traced: App, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    app = traced

    @app.task
    async def add(a: int, b: int) -> int:
        return a + b

    @app.task(max_attempts=2, backoff=Backoff(base=0.01, jitter=0.0))
    async def bad() -> None:
        raise ValueError("broken")

    @app.task(max_attempts=3)
    async def later() -> str:
        if current_job().attempt == 1:
            raise Retry(delay=0.01)
        return "ok"

    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("request") as request:
        job = await add.enqueue(1, 2)
        failing = await bad.enqueue()
    others = await later.enqueue()
    async with Worker(app):
        assert await job.result(timeout=30) == 3
        assert await others.result(timeout=30) == "ok"
        with pytest.raises(JobFailed):
            await failing.result(timeout=30)
    spans = exporter.get_finished_spans()
    trace_id = request.get_span_context().trace_id
    q = app.default_queue

    (create,) = [s for s in named(spans, "create") if attr(s, "messaging.message.id") == job.id]
    assert create.kind is SpanKind.PRODUCER
    assert create.name == f"create {q}"
    assert create.parent is not None
    assert create.parent.span_id == ids(request)[1]
    assert ids(create)[0] == trace_id
    (send,) = [s for s in named(spans, "send") if attr(s, "messaging.message.id") == job.id]
    assert send.kind is SpanKind.CLIENT
    assert attr(send, "messaging.batch.message_count") == 1

    (run,) = [s for s in named(spans, "process") if attr(s, "messaging.message.id") == job.id]
    assert run.kind is SpanKind.CONSUMER
    assert ids(run)[0] == trace_id  # one trace from enqueue to run
    assert run.parent is not None
    assert run.parent.span_id == ids(create)[1]
    assert dict(run.attributes or {}) == {
        "messaging.system": "aioqueue",
        "messaging.operation.type": "process",
        "messaging.destination.name": q,
        "messaging.message.id": job.id,
        "aioqueue.task": "add",
        "aioqueue.attempt": 1,
        "aioqueue.outcome": "completed",
    }

    runs = [s for s in named(spans, "process") if attr(s, "messaging.message.id") == failing.id]
    assert [(attr(s, "aioqueue.attempt"), attr(s, "aioqueue.outcome")) for s in runs] == [
        (1, "retried"),
        (2, "failed"),
    ]
    for s in runs:
        assert ids(s)[0] == trace_id
        assert s.status.status_code is StatusCode.ERROR
        (event,) = s.events
        assert event.name == "exception"
        assert attr(event, "exception.type") == "ValueError"
        assert attr(event, "exception.message") == "broken"

    runs = [s for s in named(spans, "process") if attr(s, "messaging.message.id") == others.id]
    assert [attr(s, "aioqueue.outcome") for s in runs] == ["retried", "completed"]
    assert ids(runs[0])[0] != trace_id  # enqueued outside the request: a trace of its own
    assert len({ids(s)[0] for s in runs}) == 1


async def test_enqueue_many_and_by_name_carry_the_context(
    traced: App, exporter: InMemorySpanExporter
) -> None:
    app = traced

    @app.task
    async def echo(n: int) -> int:
        return n

    jobs = await echo.enqueue_many([((i,), {}) for i in range(3)])
    by_name = await app.queue().enqueue("echo", [9])
    async with Worker(app):
        for j in [*jobs, by_name]:
            await j.result(timeout=30)
    spans = exporter.get_finished_spans()
    creates = {attr(s, "messaging.message.id"): s for s in named(spans, "create")}
    runs = {attr(s, "messaging.message.id"): s for s in named(spans, "process")}
    for j in [*jobs, by_name]:
        assert runs[j.id].parent is not None
        assert runs[j.id].parent.span_id == ids(creates[j.id])[1]  # type: ignore[union-attr]
    (many,) = [s for s in named(spans, "send") if attr(s, "messaging.batch.message_count") == 3]
    assert many.status.status_code is StatusCode.UNSET


async def test_admin_calls_are_spans(traced: App, exporter: InMemorySpanExporter) -> None:
    q = traced.queue("admin")
    await q.pause()
    await q.resume()
    await q.purge_queue()
    names = [s.name for s in exporter.get_finished_spans()]
    assert names == ["pause admin", "resume admin", "purge_queue admin"]
    (pause, *_) = exporter.get_finished_spans()
    assert attr(pause, "aioqueue.operation") == "pause"
    assert pause.kind is SpanKind.CLIENT


async def test_instrument_twice_is_refused(traced: App, provider: TracerProvider) -> None:
    with pytest.raises(RuntimeError, match="instrumented already"):
        instrument(traced, provider)


async def test_the_traceparent_is_signed_with_the_job(
    redis_url: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    key = "k" * 32
    prefix = unique_prefix()
    async with App(redis_url, prefix=prefix, signing_key=key) as producer:
        instrument(producer, provider)
        job = await producer.queue().enqueue("t", [1])
    raw = await producer_payload(redis_url, prefix, job.id)
    parent = next(s for s in exporter.get_finished_spans() if s.name.startswith("create"))
    head = f"00-{ids(parent)[0]:032x}-{ids(parent)[1]:016x}-".encode()
    assert head in raw  # readable, and signed with the arguments
    start = raw.index(head)
    tp = raw[start : start + len(head) + 2]
    async with App(redis_url, prefix=prefix, signing_key=key) as reader:
        # a worker without tracing reads it all the same
        args, _ = reader.codec.load_args(reader.default_queue, job.id, "t", raw)
        assert args == (1,)
        assert carried_trace.get() == tp.decode()
        forged = raw.replace(tp, tp[:-19] + b"0" * 16 + tp[-3:])
        assert forged != raw
        assert len(forged) == len(raw)
        with pytest.raises(BadSignature):
            reader.codec.load_args(reader.default_queue, job.id, "t", forged)


async def producer_payload(url: str, prefix: str, job_id: str) -> bytes:
    from redis.asyncio import Redis

    from aioqueue._model.keys import QueueKeys

    client = Redis.from_url(url)
    try:
        keys = QueueKeys(prefix, "default")
        raw = await client.hget(keys.job(job_id), "p")
    finally:
        await client.aclose()
    assert isinstance(raw, bytes)
    return raw


@pytest.mark.slow
async def test_one_trace_across_two_processes(
    tmp_path: Path,
    redis_url: str,
    prefix: str,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    spans_file = tmp_path / "worker-spans.jsonl"
    os.environ["AIOQUEUE_TEST_SPANS"] = str(spans_file)
    procs = WorkerProcesses(tmp_path, redis_url, prefix, app="tests.obsapp:app")
    try:
        procs.start()
    finally:
        del os.environ["AIOQUEUE_TEST_SPANS"]
    try:
        async with App(redis_url, prefix=prefix) as producer:
            instrument(producer, provider)
            with provider.get_tracer("test").start_as_current_span("checkout") as root:
                job = await producer.queue().enqueue("ok", [5])
            assert await job.result(timeout=60) == 5

        def run_exported() -> list[dict[str, Any]]:
            return [
                s
                for s in read_spans(spans_file)
                if s["name"].startswith("process")
                and s["attributes"]["messaging.message.id"] == job.id
            ]

        await wait_until(
            lambda: bool(run_exported()), timeout=30, what=f"the worker's span:\n{procs.logs()}"
        )
    finally:
        procs.close()
        print(procs.logs())
    (run,) = run_exported()
    (create,) = [
        s
        for s in exporter.get_finished_spans()
        if s.name.startswith("create") and attr(s, "messaging.message.id") == job.id
    ]
    assert run["trace_id"] == f"{ids(root)[0]:032x}" == f"{ids(create)[0]:032x}"
    assert run["parent_id"] == f"{ids(create)[1]:016x}"
    assert run["kind"] == "CONSUMER"
    assert run["attributes"]["aioqueue.task"] == "ok"
    assert run["attributes"]["aioqueue.outcome"] == "completed"
    assert run["attributes"]["messaging.destination.name"] == "default"


async def test_the_blocking_producer_and_batches_carry_the_context(
    traced: App, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    app = traced

    @app.task
    async def part(n: int) -> int:
        return n

    @app.task
    async def total() -> int:
        batch = current_job().batch
        assert batch is not None
        return sum(item.result for item in await batch.results())

    tracer = provider.get_tracer("test")

    def produce() -> str:
        with tracer.start_as_current_span("blocking"):
            return app.sync().enqueue(part, 41).id

    sync_id = await asyncio.to_thread(produce)
    with tracer.start_as_current_span("fan-out") as fan:
        batch = await app.batch([part.call(1), part.call(2)], on_complete=total.call())
    async with Worker(app):
        assert await app.queue().job(sync_id).result(timeout=30) == 41
        assert batch.callback is not None
        assert await batch.callback.result(timeout=30) == 3
    app.sync().close()
    spans = exporter.get_finished_spans()
    blocking = next(s for s in spans if s.name == "blocking")
    (run,) = [s for s in named(spans, "process") if attr(s, "messaging.message.id") == sync_id]
    assert ids(run)[0] == ids(blocking)[0]
    batch_runs = [
        s for s in named(spans, "process") if attr(s, "aioqueue.task") in ("part", "total")
    ]
    batch_runs = [s for s in batch_runs if attr(s, "messaging.message.id") != sync_id]
    assert len(batch_runs) == 3  # two parts and the callback: all in the fan-out's trace
    assert {ids(s)[0] for s in batch_runs} == {ids(fan)[0]}
