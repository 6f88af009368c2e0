"""Durable steps, durable waits and per-job logs: what one run of a job records under it,
fenced by its lease (the calls behind ``JobContext.step``, ``sleep``, ``wait_for_event`` and
``log``).

``await ctx.step(name, fn, *args)`` runs ``fn`` once per job, across runs: its result is
recorded in the job's step hash (``lua/step.lua``) by the current lease holder only, sealed
with the job's codec (``_model/sealed.py``), and a later run of the job (a retry, a recovery
after a crash, a resume after a durable wait) gets the recorded result back without calling
``fn``. A durable wait (``lua/wait.lua``) parks the job: its lease is given back, its attempt
refunded, and it is scheduled at the wait's end (or woken by a signal, ``lua/signal.lua``);
the run ends with ``JobParked``, which the runner turns into "nothing to ack". ``ctx.log``
keeps lines with the job (``lua/joblog.lua``), written before the run's outcome.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from .._model.checks import to_ms
from .._model.exceptions import DuplicateStep, LeaseLost, NonRetryable, WaitTimedOut
from .._model.limits import JOB_LOG_LINES, MAX_STEPS_PER_JOB
from .._model.sealed import Sealing, open_value, seal_value

if TYPE_CHECKING:
    from .._store.scripts import QueueScripts

#: the longest step name (characters)
MAX_STEP_NAME = 200
#: the longest log line kept (bytes, UTF-8; longer ones are cut)
MAX_LOG_LINE = 2000


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

    __slots__ = ("capture", "fresh", "lines", "names", "token", "waits")

    def __init__(self, token: str, capture: int | None = None) -> None:
        self.token = token
        self.capture = capture
        self.names: set[str] = set()
        self.lines: list[str] = []
        #: durable waits made so far in this run (each is numbered by its order)
        self.waits = 0
        #: nothing was recorded for the job when this run first looked: its later steps are
        #: new, and only this run (the lease holder) can record them, so they skip the read
        self.fresh = False


class JobParked(Exception):
    """Ends a run whose job a durable wait parked (given back, fenced by its lease): the
    runner records nothing more for it. A task that catches ``Exception`` around a wait
    and goes on has lost its lease: its steps and result are refused (``LeaseLost``)."""


class _WaitHost(Protocol):
    """What a durable wait needs of the App: its codec and its dead-letter retention."""

    @property
    def codec(self) -> Sealing: ...
    @property
    def dead_ttl_ms(self) -> int: ...


async def run_step(
    scripts: QueueScripts,
    codec: Sealing,
    where: tuple[str, str, str],
    run: JobRun,
    name: str,
    call: Callable[[], Any],
) -> Any:
    """``ctx.step``: the recorded result of step ``name`` of the job ``where`` (queue, job id,
    task), or ``call()``'s (awaited if awaitable), recorded."""
    job_id = where[1]
    if not isinstance(name, str) or not 0 < len(name) <= MAX_STEP_NAME:
        raise ValueError(f"a step name is a string of 1 to {MAX_STEP_NAME} characters: {name!r}")
    if name in run.names:
        raise DuplicateStep(job_id, name)
    run.names.add(name)
    await flush_log(scripts, job_id, run)  # lines logged before the step are kept if it kills
    if not run.fresh:
        reply = await scripts.step(job_id, run.token, name, None)
        if reply[0] == 1:
            return open_value(codec, where, "st", name, reply[1])
        _check(job_id, reply[0])
        run.fresh = int(reply[1]) == 0
    value = call()
    if inspect.isawaitable(value):
        value = await value
    reply = await scripts.step(job_id, run.token, name, seal_value(codec, where, "st", name, value))
    _check(job_id, reply[0])
    # the value as a later run reads it, so every run sees the same (JSON: lists for tuples)
    return open_value(codec, where, "st", name, reply[1])


def _check(job_id: str, code: int) -> None:
    if code == -3:
        raise NonRetryable(f"job {job_id!r} has recorded {MAX_STEPS_PER_JOB} steps, the most")
    if code < 0:  # no such job, or the lease is no longer this run's: stop here
        raise LeaseLost(job_id)


async def durable_wait(
    scripts: QueueScripts,
    app: _WaitHost,
    where: tuple[str, str, str],
    run: JobRun,
    duration: float | timedelta,
    event: str,
) -> Any:
    """``ctx.sleep`` (``event`` ''), ``ctx.wait_for_event``: return when the wait is over
    (an event's payload), or park the job and end the run (``JobParked``)."""
    ms = to_ms(duration, "timeout" if event else "sleep")
    run.waits += 1
    job_id = where[1]
    await flush_log(scripts, job_id, run)
    reply = await scripts.wait(job_id, run.token, run.waits, ms, event, app.dead_ttl_ms)
    code = int(reply[0])
    if code == 1:  # a signal's payload, sealed for this queue and key
        return open_value(app.codec, (where[0], "", ""), "sg", event, reply[1])
    if code == 2:
        if event:
            raise WaitTimedOut(event, ms / 1000)
        return None
    if code == 3:
        raise JobParked(f"job {job_id!r} parked until {int(reply[1])} ms")
    raise LeaseLost(job_id)


async def send_signal(
    scripts_of: Iterable[QueueScripts], codec: Sealing, key: str, payload: Any
) -> int:
    """``app.signal``: wake every job of these queues waiting for ``key``, 1,000 per script
    call (I13), with ``payload`` sealed for each queue and key; returns how many woke."""
    if not isinstance(key, str) or not 0 < len(key) <= 200:
        raise ValueError(f"an event key is a string of 1 to 200 characters: {key!r}")
    woken = 0
    for scripts in scripts_of:
        queue = scripts.keys.queue
        data = seal_value(codec, (queue, "", ""), "sg", key, payload)
        for _ in range(1000):  # jobs that park meanwhile may be woken too; never unbounded
            n, left = await scripts.signal(key, data)
            woken += n
            if not left:
                break
    return woken


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


async def flush_log(scripts: QueueScripts, job_id: str, run: JobRun) -> None:
    """Write the run's buffered log lines (before a step, a wait and the run's outcome). A
    lease lost meanwhile drops them: only the holder writes."""
    if not run.lines:
        return
    lines, run.lines = run.lines, []
    await scripts.append_log(job_id, run.token, lines)
