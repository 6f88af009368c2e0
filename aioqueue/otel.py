"""OpenTelemetry traces (``pip install 'aioqueue[otel]'``): ``instrument(app)`` makes an App's
producers, workers and admin calls emit spans, and carries the producer's trace context in
each job, so a job's run joins the trace it was enqueued from, across processes.

- each job made is a PRODUCER span ``create <queue>`` (ended at once; a child of the span
  current where ``enqueue`` was called) whose W3C ``traceparent`` travels in the job's
  payload: it is signed with the arguments when signing is on (docs/security.md), and the
  Lua scripts never read it;
- storing the jobs of one call is a CLIENT span ``send <queue>``, with their count;
- each run is a CONSUMER span ``process <queue>``, a child of the job's ``create`` span, with
  the job id, task, queue, attempt and outcome (``completed``, ``retried``, ``failed``,
  ``cancelled``); a failure's exception is recorded on it;
- the admin calls of the App's queues (pause, resume, requeue, promote, purge, cancel, ...)
  are CLIENT spans ``<operation> <queue>``.

Only ``opentelemetry-api`` is needed: spans go wherever the application's tracer provider
sends them (none configured: nowhere, at the cost of no-op spans).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar, cast

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ._model.codec import carried_trace
from ._model.exceptions import Retry
from ._model.hooks import CallNext, EnqueueEvent
from ._queue.queue import Queue
from ._version import __version__

if TYPE_CHECKING:
    from ._app.app import App
    from ._app.context import JobContext

__all__ = ["ADMIN_OPERATIONS", "instrument"]

#: the Queue methods traced as admin calls
ADMIN_OPERATIONS = (
    "cancel",
    "cancel_jobs",
    "pause",
    "promote",
    "purge",
    "purge_queue",
    "reap",
    "requeue",
    "resume",
    "set_default_group_rate_limit",
    "set_group_limit",
    "set_rate_limit",
)
SYSTEM = "aioqueue"
_W3C = TraceContextTextMapPropagator()
#: the ``send`` span of the enqueue call in progress in this context (between the before-
#: and after-enqueue hooks)
_sending: ContextVar[Span | None] = ContextVar("aioqueue_otel_sending", default=None)
#: inside a traced admin call
_in_admin: ContextVar[bool] = ContextVar("aioqueue_otel_admin", default=False)

F = TypeVar("F", bound=Callable[..., Coroutine[Any, Any, Any]])


def instrument(app: App, tracer_provider: TracerProvider | None = None) -> None:
    """Trace ``app``'s enqueues, runs and admin calls (see the module's docstring). Call it
    once, before the App's workers are made and before its queues are used: queues got
    from ``app.queue()`` earlier are not traced.

    Args:
        app: the App, on the producer's side, the worker's, or both.
        tracer_provider: where spans go (default: the global one,
            ``opentelemetry.trace.set_tracer_provider``).

    Raises:
        RuntimeError: ``app`` is instrumented already.
    """
    if app.codec.trace is not None:
        raise RuntimeError("this App is instrumented already")
    tracer = trace.get_tracer("aioqueue", __version__, tracer_provider=tracer_provider)
    app.codec.trace = functools.partial(_create, tracer)
    app.before_enqueue(functools.partial(_send_start, tracer))
    app.after_enqueue(_send_end)
    app.middleware(functools.partial(_consume, tracer))
    attrs = {name: _traced_admin(tracer, name, getattr(Queue, name)) for name in ADMIN_OPERATIONS}
    app.queues.retype(cast(type[Queue], type("TracedQueue", (Queue,), attrs)))


# ---------------------------------------------------------------------- producers
def _create(tracer: Tracer, queue: str, job_id: str, task: str) -> str | None:
    """The ``create`` span of one job, ended at once: its traceparent goes in the job."""
    span = tracer.start_span(
        f"create {queue}",
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": SYSTEM,
            "messaging.operation.type": "create",
            "messaging.destination.name": queue,
            "messaging.message.id": job_id,
            "aioqueue.task": task,
        },
    )
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=trace.set_span_in_context(span))
    span.end()
    return carrier.get("traceparent")


def _send_start(tracer: Tracer, event: EnqueueEvent) -> None:
    stale = _sending.get()
    if stale is not None:  # the last call of this context raised before it stored its jobs
        stale.set_status(Status(StatusCode.ERROR, "the jobs were not stored"))
        stale.end()
    span = tracer.start_span(
        f"send {event.queue}",
        kind=SpanKind.CLIENT,
        attributes={
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.destination.name": event.queue,
            "messaging.batch.message_count": len(event.job_ids),
            "aioqueue.task": event.task,
        },
    )
    if len(event.job_ids) == 1:
        span.set_attribute("messaging.message.id", event.job_ids[0])
    _sending.set(span)


def _send_end(event: EnqueueEvent) -> None:
    span = _sending.get()
    if span is not None:
        _sending.set(None)
        span.end()


# ---------------------------------------------------------------------- workers
async def _consume(tracer: Tracer, job: JobContext, call_next: CallNext) -> Any:
    """The middleware that runs each job inside its ``process`` span."""
    parent = carried_trace.get()
    context = _W3C.extract({"traceparent": parent}) if parent else None
    outcome = "cancelled"
    with tracer.start_as_current_span(
        f"process {job.queue}",
        context=context,
        kind=SpanKind.CONSUMER,
        attributes={
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.destination.name": job.queue,
            "messaging.message.id": job.id,
            "aioqueue.task": job.task,
            "aioqueue.attempt": job.attempt,
        },
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            result = await call_next()
            outcome = "completed"
            return result
        except Retry:
            outcome = "retried" if job.attempt < job.max_attempts else "failed"
            raise
        except Exception as exc:
            outcome = "retried" if job.attempt < job.max_attempts else "failed"
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise
        finally:  # "cancelled": by a request, a shutdown, a lost lease or its timeout
            span.set_attribute("aioqueue.outcome", outcome)


# ---------------------------------------------------------------------- admin calls
def _traced_admin(tracer: Tracer, name: str, method: F) -> F:
    @functools.wraps(method)
    async def call(self: Queue, *args: Any, **kwargs: Any) -> Any:
        if _in_admin.get():  # one admin call made of others (purge_queue): one span
            return await method(self, *args, **kwargs)
        token = _in_admin.set(True)
        try:
            return await _admin_span(tracer, name, self, method, args, kwargs)
        finally:
            _in_admin.reset(token)

    return cast(F, call)


async def _admin_span(
    tracer: Tracer, name: str, queue: Queue, method: F, args: Any, kwargs: Any
) -> Any:
    with tracer.start_as_current_span(
        f"{name} {queue.name}",
        kind=SpanKind.CLIENT,
        attributes={
            "messaging.system": SYSTEM,
            "messaging.destination.name": queue.name,
            "aioqueue.operation": name,
        },
    ):
        return await method(queue, *args, **kwargs)
