"""``current_job()``: what a running task can know about its job, and what it can do with it:
report progress, run durable steps (their records sealed with the job's codec here), log."""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

from .._model.codec import check_size
from .._model.exceptions import DuplicateStep, LeaseLost, NonRetryable
from .._model.hooks import State
from .._model.limits import MAX_STEPS_PER_JOB
from .._model.serialize import dumps_checked
from .._model.signing import place
from .steps import MAX_STEP_NAME, JobRun, add_line, flush_log, log_line, step_key

if TYPE_CHECKING:
    from .._model.codec import Codec
    from .._store.scripts import QueueScripts
    from .app import App
    from .batch import Batch

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class JobContext:
    """The job a task is running for, from ``current_job()``.

    Attributes:
        id: the job id.
        queue: its queue.
        task: the task name.
        attempt: this run's attempt number, from 1.
        max_attempts: attempts allowed before the job is dead-lettered.
        app: the App the worker runs for (its connection pool is usable from the task).
        batch: for a batch's callback, its batch (``await batch.results()``); else None.
        run: this run's lease token, step names and unwritten log lines (internal).
    """

    id: str
    queue: str
    task: str
    attempt: int
    max_attempts: int
    app: App
    batch: Batch[Any] | None = None
    run: JobRun = field(default_factory=lambda: JobRun(""), repr=False)

    @property
    def state(self) -> State:
        """The worker's shared objects, set by its startup hooks (``@app.on_startup``):
        ``current_job().state.get(Pool)``. (A context variable the worker sets once, so that
        a job's run pays nothing for it.)"""
        try:
            return _worker_state.get()
        except LookupError:  # a JobContext made outside a worker
            return State()

    async def progress(self, value: Any) -> None:
        """Record the job's progress (any JSON value, e.g. a fraction or a dict); readable
        from ``Job.info()`` in any process."""
        data = self.app.codec.json.dumps(value)
        await self.app.queue(self.queue)._scripts.set_progress(self.id, data)

    @overload
    async def step(
        self, name: str, fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs
    ) -> T: ...

    @overload
    async def step(self, name: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T: ...

    async def step(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` (sync or async) once for this job, across its runs:
        its result is recorded under the job, and when the job runs again (a retry, a
        recovery after a crash, a resume after ``sleep``) the recorded result is returned
        without calling ``fn``. Only the current lease holder records (docs/workflows.md).

        Args:
            name: the step's identity within the job (1 to 200 characters), the same in every
                run; two steps of one run must not share it.

        Returns:
            ``fn``'s result as the serializer gives it back (JSON: a tuple comes back a list),
            the same in every run.

        Raises:
            DuplicateStep: ``name`` was already used in this run.
            LeaseLost: the job is no longer this run's (its lease ran out): stop.
            SerializationError: the result cannot be serialised, or is over the payload limit.
        """
        scripts = self.app.queue(self.queue)._scripts
        call = functools.partial(fn, *args, **kwargs)
        return await run_step(
            scripts, self.app.codec, (self.queue, self.id, self.task), self.run, name, call
        )

    def step_key(self, name: str) -> str:
        """A stable idempotency key for step ``name`` of this job (64 hex characters; the same
        in every run): give it to the service the step calls (a payment API's idempotency
        key) to cover a step that ran but whose result was not recorded."""
        return step_key(self.app.prefix, self.queue, self.id, name)

    def log(self, msg: object, level: int = logging.INFO) -> None:
        """Keep a line in the job's log (``aioqueue job ID``, the dashboard's job page):
        written before the run's outcome, each step and each durable wait; the newest 500
        lines and 64 KiB are kept, longer lines cut to 2,000 bytes."""
        add_line(self.run, log_line(msg, level))


_current: contextvars.ContextVar[JobContext] = contextvars.ContextVar("aioqueue_current_job")
#: the running worker's State: set in ``Worker.run`` before it starts any task, so every task
#: it starts (and so every job's run) inherits it
_worker_state: contextvars.ContextVar[State] = contextvars.ContextVar("aioqueue_worker_state")


def current_job() -> JobContext:
    """The job the calling task is running for.

    Raises:
        RuntimeError: called outside a job run by a worker.
    """
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError("current_job() called outside a job run by an aioqueue worker") from None


class CaptureHandler(logging.Handler):
    """Keeps the logging records of a job's run in its log (``@app.task(capture_logs=level)``):
    one handler on the root logger, installed by the first worker that runs such a task; a
    record goes to the log of the job whose run emitted it (the context variable), if that
    job's task captures its level."""

    def emit(self, record: logging.LogRecord) -> None:
        job = _current.get(None)
        if job is not None and job.run.capture is not None and record.levelno >= job.run.capture:
            add_line(job.run, log_line(record.getMessage(), record.levelno, record.created))


_capture: list[CaptureHandler] = []


def capture_logs() -> None:
    """Install the CaptureHandler on the root logger (once per process)."""
    if not _capture:
        _capture.append(CaptureHandler())
        logging.getLogger().addHandler(_capture[0])


# ---------------------------------------------------------------------- durable steps
class CorruptStep(NonRetryable):
    """A step's recorded result cannot be read (garbled in Redis): the job is dead-lettered
    with this reason rather than run the step again, which already ran."""


def step_place(task: str, name: str) -> str:
    """Where a step's result is bound (as the task of an encrypted value): job, task and name."""
    return f"\x00step\x00{task}\x00{name}"


def encode_step(codec: Codec, queue: str, job_id: str, task: str, name: str, value: Any) -> bytes:
    """A step's result as stored: serialised, compressed, encrypted and signed for its place."""
    data = dumps_checked(codec.serializer, value, 0, f"the result of step {name!r}")
    check_size(data, codec.max_payload_bytes, f"the result of step {name!r}")
    data = codec.compressor.compress(data)
    if codec.encrypter is not None:
        data = codec.encrypter.seal_result(queue, job_id, step_place(task, name), None, data)
    if codec.signer is not None:
        data = codec.signer.sign_value(queue, job_id, task, place("st", name), data)
    return data


def decode_step(codec: Codec, queue: str, job_id: str, task: str, name: str, data: bytes) -> Any:
    """A recorded step's result, verified and decrypted for its place before it is decoded.

    Raises:
        BadSignature: signing is on and the record is unsigned, tampered or another place's.
        CorruptStep: it cannot be read otherwise.
    """
    what = f"result of step {name!r}"
    if codec.signer is not None:
        data = codec.signer.verify_value(queue, job_id, task, place("st", name), data, what)
    try:
        if codec.encrypter is not None:
            opened = codec.encrypter.open_result(queue, job_id, data)
            if opened.task != step_place(task, name):
                raise ValueError("encrypted for another place")
            data = opened.data
        data = codec.compressor.decompress(data)
        return codec.serializer.loads(data)
    except Exception as exc:
        raise CorruptStep(f"job {job_id!r}: the recorded {what} cannot be read: {exc!r}") from None


async def run_step(
    scripts: QueueScripts,
    codec: Codec,
    where: tuple[str, str, str],
    run: JobRun,
    name: str,
    call: Callable[[], Any],
) -> Any:
    """``ctx.step``: the recorded result of step ``name`` of the job ``where`` (queue, job id,
    task), or ``call()``'s (awaited if awaitable), recorded."""
    queue, job_id, task = where
    if not isinstance(name, str) or not 0 < len(name) <= MAX_STEP_NAME:
        raise ValueError(f"a step name is a string of 1 to {MAX_STEP_NAME} characters: {name!r}")
    if name in run.names:
        raise DuplicateStep(job_id, name)
    run.names.add(name)
    await flush_log(scripts, job_id, run)  # lines logged before the step are kept if it kills
    reply = await scripts.step(job_id, run.token, name, None)
    if reply[0] == 1:
        return decode_step(codec, queue, job_id, task, name, reply[1])
    _check(job_id, reply[0])
    value = call()
    if inspect.isawaitable(value):
        value = await value
    data = encode_step(codec, queue, job_id, task, name, value)
    reply = await scripts.step(job_id, run.token, name, data)
    _check(job_id, reply[0])
    # the value as a later run reads it, so every run sees the same (JSON: lists for tuples)
    return decode_step(codec, queue, job_id, task, name, reply[1])


def _check(job_id: str, code: int) -> None:
    if code == -3:
        raise NonRetryable(f"job {job_id!r} has recorded {MAX_STEPS_PER_JOB} steps, the most")
    if code < 0:  # no such job, or the lease is no longer this run's: stop here
        raise LeaseLost(job_id)
