"""An operator's view of one queue, read only: job detail, throughput and groups, and the
records every read returns (the paged listings are in ``_lister``, the actions in ``_admin``).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._model.codec import Codec
from .._model.exceptions import BadSignature
from .._model.job import ErrorInfo, JobInfo, JobState
from .._model.limits import DEFAULT_MAX_ATTEMPTS, JOB_LOG_BYTES, JOB_LOG_LINES
from .._model.timeutil import score_ms
from .._store.scripts import QueueScripts

_FIELDS = ("t", "s", "g", "pr", "a", "m", "ct", "due", "f", "e", "b", "st")
#: the most ended attempts a job's record keeps (lua/lib/history.lua, HISTORY_MAX)
HISTORY_MAX = 20


@dataclass(frozen=True, slots=True)
class JobSummary:
    """One job of a listing (``Queue.jobs``)."""

    id: str
    queue: str
    task: str
    state: JobState
    group: str | None
    priority: int
    attempts: int
    max_attempts: int
    created_ms: int
    due_ms: int | None
    finished_ms: int | None
    #: the error of its last failed attempt (dead letters, and retried jobs)
    error: ErrorInfo | None
    #: the batch it is a sub-job of
    batch: str | None = None
    #: when its last attempt started (server ms; None: it never ran)
    started_ms: int | None = None


@dataclass(frozen=True, slots=True)
class JobPage:
    """A page of ``Queue.jobs``: its jobs, and the cursor of the next page (None: the end)."""

    items: tuple[JobSummary, ...]
    cursor: str | None


@dataclass(frozen=True, slots=True)
class AttemptInfo:
    """One attempt of a job (``JobDetail.history``): who ran it, when, and how it ended.

    ``outcome`` is one of ``running`` (the current attempt), ``completed``, ``retried`` (it
    failed and the job was retried), ``failed`` (it failed and the job was dead-lettered),
    ``cancelled``, ``released`` (given back unfinished: a worker shutting down, or the pull
    API's release), ``expired`` (its lease ran out: the worker died or hung) or ``buried``
    (its worker missed its heartbeats and was declared dead).
    """

    #: the attempt's number (a released or never-started attempt may be given back, so a
    #: number can repeat)
    number: int
    #: the worker that held it (None: a pull-API consumer, or not known)
    worker: str | None
    #: when it was leased and when it ended (server ms; None: not known, or still running)
    started_ms: int | None
    ended_ms: int | None
    outcome: str
    #: the error it ended with (the full traceback of the last one is in ``info.error``)
    error_type: str | None
    error_message: str | None


class ResultState(enum.Enum):
    """Whether ``JobDetail.result`` holds the job's result."""

    #: no result (the job has not completed, or it keeps none)
    NONE = "none"
    #: read (and, with signing on, verified as this job's result)
    OK = "ok"
    #: signing is on and the stored result is not this job's signed result (unsigned,
    #: tampered, another job's, or signed with a key not accepted here): never decoded
    BAD_SIGNATURE = "bad_signature"
    #: it cannot be decoded
    UNREADABLE = "unreadable"


@dataclass(frozen=True, slots=True)
class JobDetail:
    """Everything stored about one job (``Queue.job_detail``): ``JobInfo`` and the rest."""

    info: JobInfo
    group: str | None
    options: dict[str, Any]
    #: the result, once completed (None otherwise, or when it cannot be decoded)
    result: Any
    #: the batch it is a sub-job of
    batch: str | None
    #: when its current lease runs out (server ms), while active
    lease_deadline_ms: int | None
    cancel_requested: bool
    #: when its current or last attempt started (server ms; None: never leased)
    started_ms: int | None = None
    #: its attempts, oldest first: the last ``HISTORY_MAX`` that ended other than by success,
    #: then the running or completed one
    history: tuple[AttemptInfo, ...] = ()
    #: whether ``result`` is the job's result, or why not (``result`` is then None)
    result_state: ResultState = ResultState.NONE
    #: why the result could not be read (None unless BAD_SIGNATURE or UNREADABLE)
    result_error: str | None = None
    #: its log (``ctx.log`` and captured logging records), oldest first: (epoch seconds,
    #: level name, message); a garbled line is shown as the text it holds, at level ``?``
    logs: tuple[tuple[float, str, str], ...] = ()

    def result_text(self) -> str:
        """The result as the CLI and the dashboard show it: JSON, or the reason it is not."""
        if self.result_state is ResultState.OK:
            return json.dumps(self.result, default=repr)
        if self.result_error is not None:
            return f"({self.result_state.value}: {self.result_error})"
        return "-"


@dataclass(frozen=True, slots=True)
class ThroughputMinute:
    """Jobs finished in one minute of the server's clock."""

    #: the minute's start, epoch ms
    start_ms: int
    completed: int
    failed: int


@dataclass(frozen=True, slots=True)
class Throughput:
    """Jobs completed and dead-lettered per minute, oldest minute first (``Queue.throughput``)."""

    minutes: tuple[ThroughputMinute, ...]

    @property
    def completed(self) -> int:
        """Jobs completed over all the minutes."""
        return sum(m.completed for m in self.minutes)

    @property
    def failed(self) -> int:
        """Jobs dead-lettered over all the minutes."""
        return sum(m.failed for m in self.minutes)


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """One fairness group of a queue (``Queue.groups``)."""

    name: str
    queued: int
    active: int
    #: its own concurrency limit (None: the queue's default, if any)
    limit: int | None
    #: its own rate limit: jobs per ``rate_seconds`` seconds (None: the queue's default, if any)
    rate: int | None
    rate_seconds: float | None
    paused: bool


# --------------------------------------------------------------------- cursors
async def summaries(
    scripts: QueueScripts, codec: Codec, queue: str, state: JobState, ids: Sequence[str]
) -> list[JobSummary]:
    """The listed jobs' records, skipping those that left ``state`` since they were listed."""
    rows = await scripts.job_fields(ids, _FIELDS)
    out = []
    for job_id, r in zip(ids, rows, strict=True):
        t, s, g, pr, a, m, ct, due, f, e, b, st = r
        if s is None or s.decode(errors="replace") != state.value:
            continue
        error = None
        if e is not None:
            try:
                error = codec.load_error(e)
            except Exception:  # a garbled error field still lists its job
                error = ErrorInfo("Unreadable", repr(e[:200]))
        out.append(
            JobSummary(
                id=job_id,
                queue=queue,
                task=(t or b"").decode(errors="replace"),
                state=state,
                group=None if g is None else g.decode(errors="replace"),
                priority=_int(pr, 0),
                attempts=_int(a, 0),
                max_attempts=DEFAULT_MAX_ATTEMPTS if m is None else _int(m, 1),
                created_ms=_int(ct, 0),
                due_ms=None if due is None else _int(due, 0),
                finished_ms=None if f is None else _int(f, 0),
                error=error,
                batch=None if b is None else b.decode(errors="replace"),
                started_ms=None if st is None else _int(st, 0),
            )
        )
    return out


def _int(v: bytes | None, default: int) -> int:
    try:
        return int(v) if v is not None else default
    except ValueError:
        return default


# --------------------------------------------------------------------- detail, groups, rates
def _opt_int(v: object) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int | float | str | bytes):
        return None
    try:
        return int(v)
    except (ValueError, OverflowError):
        return None


def _opt_str(v: object) -> str | None:
    return v if isinstance(v, str) and v else None


def _history(h: dict[str, bytes], info: JobInfo) -> tuple[AttemptInfo, ...]:
    """The attempts in record ``h``: its stored history (hx; an entry or a history that cannot
    be read is left out), then the running or completed attempt from ``a``, ``wk``, ``st``
    and ``f``."""
    out: list[AttemptInfo] = []
    try:
        stored = json.loads(h["hx"]) if "hx" in h else []
    except ValueError:
        stored = []
    for e in stored if isinstance(stored, list) else []:
        if not isinstance(e, dict) or _opt_int(e.get("n")) is None:
            continue
        out.append(
            AttemptInfo(
                number=_opt_int(e.get("n")) or 0,
                worker=_opt_str(e.get("w")),
                started_ms=_opt_int(e.get("s")),
                ended_ms=_opt_int(e.get("e")),
                outcome=_opt_str(e.get("o")) or "unknown",
                error_type=_opt_str(e.get("t")),
                error_message=_opt_str(e.get("m")),
            )
        )
    if info.attempts > 0 and info.state in (JobState.ACTIVE, JobState.COMPLETED):
        done = info.state is JobState.COMPLETED
        out.append(
            AttemptInfo(
                number=info.attempts,
                worker=h["wk"].decode(errors="replace") or None if "wk" in h else None,
                started_ms=_opt_int(h.get("st")),
                ended_ms=info.finished_ms if done else None,
                outcome="completed" if done else "running",
                error_type=None,
                error_message=None,
            )
        )
    return tuple(out)


async def detail(scripts: QueueScripts, codec: Codec, info: JobInfo) -> JobDetail:
    raw = await scripts.job_record(info.id)
    h = {k.decode(): v for k, v in raw.items()}
    options: dict[str, Any] = {}
    if "o" in h:
        try:
            options = codec.load_options(h["o"])
        except Exception:
            options = {}
    result, state, why = None, ResultState.NONE, None
    if info.state is JobState.COMPLETED and "r" in h:
        try:
            result = codec.load_result(h["r"], queue=info.queue, job_id=info.id)
            state = ResultState.OK
        except BadSignature as exc:
            state, why = ResultState.BAD_SIGNATURE, str(exc)
        except Exception as exc:
            state, why = ResultState.UNREADABLE, f"{type(exc).__name__}: {exc}"
    deadline = None
    if info.state is JobState.ACTIVE:
        score = await scripts.read(scripts.client.zscore(scripts.keys.active, info.id))
        deadline = None if score is None else score_ms(score)
    return JobDetail(
        info=info,
        group=h["g"].decode(errors="replace") if "g" in h else None,
        options=options,
        result=result,
        batch=h["b"].decode(errors="replace") if "b" in h else None,
        lease_deadline_ms=deadline,
        cancel_requested="x" in h,
        started_ms=_opt_int(h.get("st")),
        history=_history(h, info),
        result_state=state,
        result_error=why,
        logs=_log_lines(await scripts.job_log(info.id)) if "xk" in h else (),
    )


def _log_lines(raw: list[bytes]) -> tuple[tuple[float, str, str], ...]:
    """A job's stored log lines (JSON ``{"t", "l", "m"}``, ``_app/steps.py``), read
    tolerantly."""
    out: list[tuple[float, str, str]] = []
    for item in raw[-JOB_LOG_LINES:]:
        text = item[:JOB_LOG_BYTES].decode(errors="replace")
        try:
            d = json.loads(text)
            out.append((float(d["t"]), str(d["l"]), str(d["m"])))
        except (ValueError, KeyError, TypeError):
            out.append((0.0, "?", text))
    return tuple(out)


async def throughput(scripts: QueueScripts, minutes: int) -> Throughput:
    raw = await scripts.throughput()
    now_min = await scripts.server_ms() // 60000
    counts: dict[tuple[str, int], int] = {}
    for field, value in raw.items():
        kind, _, minute = field.decode(errors="replace").partition(":")
        try:
            counts[kind, int(minute)] = int(value)
        except ValueError:
            continue  # garbage in the hash is ignored
    rows = [
        ThroughputMinute(m * 60000, counts.get(("c", m), 0), counts.get(("f", m), 0))
        for m in range(now_min - minutes + 1, now_min + 1)
    ]
    return Throughput(tuple(rows))


async def groups(scripts: QueueScripts, limit: int) -> list[GroupInfo]:
    queued = await scripts.group_counts()
    gconf, gactive, _ = await scripts.group_settings()
    conf = {k.decode(errors="replace"): v for k, v in gconf.items()}
    active = {k.decode(errors="replace"): _int(v, 0) for k, v in gactive.items()}
    names = set(queued) | {g for g in active if g} | {k.partition(":")[2] for k in conf}
    names.discard("")
    out = []
    for name in sorted(names)[:limit]:
        rate_n = conf.get("rate_n:" + name)
        rate_ms = conf.get("rate_ms:" + name)
        lim = conf.get("limit:" + name)
        out.append(
            GroupInfo(
                name=name,
                queued=queued.get(name, 0),
                active=active.get(name, 0),
                limit=None if lim is None else _int(lim, 0),
                rate=None if rate_n is None else _int(rate_n, 0),
                rate_seconds=None if rate_ms is None else _int(rate_ms, 0) / 1000,
                paused=("paused:" + name) in conf,
            )
        )
    return out
