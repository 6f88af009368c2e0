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
import json
import logging
import time
from typing import TYPE_CHECKING

from .._model.limits import JOB_LOG_BYTES, JOB_LOG_LINES

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

    __slots__ = ("capture", "lines", "names", "token")

    def __init__(self, token: str, capture: int | None = None) -> None:
        self.token = token
        self.capture = capture
        self.names: set[str] = set()
        self.lines: list[str] = []


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
