"""Durable steps and per-job logs: what one run of a job records under it, fenced by its lease.

``await ctx.step(name, fn, *args)`` runs ``fn`` once per job, across runs: its result is
recorded in the job's step hash (``lua/step.lua``) by the current lease holder only, encoded
with the job's codec (signed and encrypted for its place on such apps), and a later run of
the job (a retry, a recovery after a crash, a resume after a durable wait) gets the recorded
result back without calling ``fn``. ``ctx.log(msg)`` keeps lines with the job
(``lua/joblog.lua``), written before the run's outcome.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._codec import check_size
from ._exceptions import DuplicateStep, LeaseLost, NonRetryable
from ._limits import JOB_LOG_BYTES, JOB_LOG_LINES, MAX_STEPS_PER_JOB
from ._serialize import dumps_checked
from ._signing import place

if TYPE_CHECKING:
    from ._codec import Codec
    from ._context import JobContext

#: the longest step name (characters)
MAX_STEP_NAME = 200
#: the longest log line kept (bytes, UTF-8; longer ones are cut)
MAX_LOG_LINE = 2000


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


def step_key(prefix: str, queue: str, job_id: str, name: str) -> str:
    """A stable idempotency key for a step of a job: the same in every run, different for
    every other step, job, queue or prefix (hex SHA-256 of them, length-prefixed)."""
    parts = (prefix, queue, job_id, name)
    raw = b"".join(b"%d:%b" % (len(p.encode()), p.encode()) for p in parts)
    return hashlib.sha256(raw).hexdigest()


class JobRun:
    """What one run of a job keeps for its steps and its log: the lease token that fences
    their writes, the step names used so far, the log lines not yet written, and the level
    from which its task's own logging records are kept (None: none)."""

    __slots__ = ("capture", "lines", "names", "token")

    def __init__(self, token: str, capture: int | None = None) -> None:
        self.token = token
        self.capture = capture
        self.names: set[str] = set()
        self.lines: list[str] = []


async def run_step(
    ctx: JobContext, name: str, fn: Callable[..., Any], args: Any, kwargs: Any
) -> Any:
    """``ctx.step``: the recorded result of step ``name``, or ``fn``'s, recorded."""
    if not isinstance(name, str) or not 0 < len(name) <= MAX_STEP_NAME:
        raise ValueError(f"a step name is a string of 1 to {MAX_STEP_NAME} characters: {name!r}")
    run = ctx.run
    if name in run.names:
        raise DuplicateStep(ctx.id, name)
    run.names.add(name)
    codec = ctx.app.codec
    scripts = ctx.app.queue(ctx.queue)._scripts
    await flush_log(ctx)  # lines logged before the step are kept even if it kills the worker
    reply = await scripts.step(ctx.id, run.token, name, None)
    if reply[0] == 1:
        return decode_step(codec, ctx.queue, ctx.id, ctx.task, name, reply[1])
    _check(ctx, reply[0])
    value = fn(*args, **kwargs)
    if inspect.isawaitable(value):
        value = await value
    data = encode_step(codec, ctx.queue, ctx.id, ctx.task, name, value)
    reply = await scripts.step(ctx.id, run.token, name, data)
    _check(ctx, reply[0])
    # the value as a later run reads it, so every run sees the same (JSON: lists for tuples)
    return decode_step(codec, ctx.queue, ctx.id, ctx.task, name, reply[1])


def _check(ctx: JobContext, code: int) -> None:
    if code == -3:
        raise NonRetryable(f"job {ctx.id!r} has recorded {MAX_STEPS_PER_JOB} steps, the most")
    if code < 0:  # no such job, or the lease is no longer this run's: stop here
        raise LeaseLost(ctx.id)


# ---------------------------------------------------------------------- the job's log
def log_line(msg: object, level: int = logging.INFO, at: float | None = None) -> str:
    """One stored log line: JSON ``{"t": epoch seconds, "l": level name, "m": message}``,
    the message cut so that the line fits ``MAX_LOG_LINE`` bytes."""
    text = str(msg)
    budget = MAX_LOG_LINE - 64
    if len(text.encode()) > budget:
        text = text.encode()[:budget].decode(errors="ignore") + "…"
    t = round(time.time() if at is None else at, 3)
    return json.dumps({"t": t, "l": logging.getLevelName(level), "m": text})


def add_line(run: JobRun, line: str) -> None:
    """Buffer a line; the oldest go once the buffer holds more than the log keeps."""
    run.lines.append(line)
    if len(run.lines) > JOB_LOG_LINES:
        del run.lines[0]


async def flush_log(ctx: JobContext) -> None:
    """Write the run's buffered log lines (before a step, a wait and the run's outcome). A
    lease lost meanwhile drops them: only the holder writes."""
    run = ctx.run
    if not run.lines:
        return
    lines, run.lines = run.lines, []
    await ctx.app.queue(ctx.queue)._scripts.append_log(ctx.id, run.token, lines)


def read_lines(raw: list[bytes]) -> list[tuple[float, str, str]]:
    """A job's stored log as (epoch seconds, level, message); a garbled line is shown as
    the text it holds, at level ``?``."""
    out: list[tuple[float, str, str]] = []
    for item in raw[-JOB_LOG_LINES:]:
        text = item[:JOB_LOG_BYTES].decode(errors="replace")
        try:
            d = json.loads(text)
            out.append((float(d["t"]), str(d["l"]), str(d["m"])))
        except (ValueError, KeyError, TypeError):
            out.append((0.0, "?", text))
    return out
