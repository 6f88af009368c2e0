"""An operator's view of one queue, read only: paged job listings, job detail, throughput and
groups, and the records they return (the actions on them are in ``_admin``).

Listings page with an opaque cursor over the structures that hold each state (docs/operations.md):
the ZSETs ``scheduled``, ``active``, ``dead``, ``prio``, the indexes of finished jobs
``completed`` and ``cancelled`` and each group's lane by (score, id),
the plain FIFO list ``ready`` by anchor ids. A page costs a bounded number of round trips and
examines at most ``SCAN_BUDGET`` ids, whatever the queue's size.
"""

from __future__ import annotations

import base64
import bisect
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from ._codec import Codec
from ._exceptions import ConfigurationError
from ._job import ErrorInfo, JobInfo, JobState
from ._limits import MAX_JOBS_PER_CALL
from ._scripts import QueueScripts

#: the most ids one page examines (filters may leave a page short; its cursor goes on)
SCAN_BUDGET = 5000
#: the states a listing can show: the ones an index holds
LISTED = (
    JobState.SCHEDULED,
    JobState.QUEUED,
    JobState.ACTIVE,
    JobState.FAILED,
    JobState.COMPLETED,
    JobState.CANCELLED,
)
#: the states held in an index of finished jobs, which only lists (its entries may be stale)
INDEXED = (JobState.COMPLETED, JobState.CANCELLED)
_FIELDS = ("t", "s", "g", "pr", "a", "m", "ct", "due", "f", "e")
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
        return sum(m.completed for m in self.minutes)

    @property
    def failed(self) -> int:
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
def _encode(cur: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(cur, separators=(",", ":")).encode()).decode()


def _decode(cursor: str) -> dict[str, Any]:
    try:
        cur = json.loads(base64.urlsafe_b64decode(cursor.encode()))
    except (ValueError, TypeError):
        raise ConfigurationError(f"invalid cursor {cursor!r}") from None
    if not isinstance(cur, dict) or not isinstance(cur.get("src"), str):
        raise ConfigurationError(f"invalid cursor {cursor!r}")
    return cur


def check_state(state: str | JobState) -> JobState:
    try:
        st = JobState(state)
    except ValueError:
        raise ConfigurationError(
            f"unknown state {state!r}: use one of {', '.join(s.value for s in LISTED)}"
        ) from None
    if st not in LISTED:
        raise ConfigurationError(
            f"{st.value} jobs are not listed: look one up by id with job_detail(); "
            "listable: " + ", ".join(s.value for s in LISTED)
        )
    return st


# --------------------------------------------------------------------- listing
class Lister:
    """Pages of one listing: the structures that hold a state, in order, each paged by a
    cursor that survives jobs entering and leaving them."""

    def __init__(
        self,
        scripts: QueueScripts,
        state: JobState,
        *,
        task: str | None = None,
        group: str | None = None,
        newest_first: bool = False,
        since_ms: int | None = None,
        until_ms: int | None = None,
    ) -> None:
        self.s = scripts
        self.state = state
        self.task = task
        self.group = group
        self.rev = newest_first
        self.since_ms = since_ms
        self.until_ms = until_ms

    async def sources(self) -> list[str]:
        """The structures holding the state: 'scheduled', 'active', 'dead', 'completed',
        'cancelled', or for queued 'prio', 'ready' and 'g:<group>' (one group's, with a group
        filter)."""
        if self.state in INDEXED:
            return [self.state.value]
        if self.state is JobState.SCHEDULED:
            return ["scheduled"]
        if self.state is JobState.ACTIVE:
            return ["active"]
        if self.state is JobState.FAILED:
            return ["dead"]
        if self.group is not None:
            return ["g:" + self.group]
        groups = sorted(await self.s.group_counts())
        srcs = ["prio", "ready", *("g:" + g for g in groups)]
        return srcs[::-1] if self.rev else srcs

    def _key(self, src: str) -> str:
        k = self.s.keys
        if src.startswith("g:"):
            return k.lane(src[2:])
        return str(getattr(k, src))

    async def page(self, limit: int, cursor: str | None) -> tuple[list[str], str | None]:
        """Up to ``limit`` ids, and the next cursor."""
        srcs = await self.sources()
        cur = _decode(cursor) if cursor else {"src": srcs[0] if srcs else ""}
        src = cur["src"]
        if src not in srcs:
            # its group left the listing meanwhile: go on with the next one in name order
            if not src.startswith("g:"):
                return [], None
            gs = sorted(x for x in srcs if x.startswith("g:"))
            if self.rev:
                i = bisect.bisect_left(gs, src)
                later = [x for x in srcs if not x.startswith("g:")]
                src = gs[i - 1] if i > 0 else (later[0] if later else "")
            else:
                i = bisect.bisect_right(gs, src)
                src = gs[i] if i < len(gs) else ""
            if not src:
                return [], None
            cur = {"src": src}
        ids: list[str] = []
        budget = SCAN_BUDGET
        while True:
            want = limit - len(ids)
            got, nxt, scanned = await self._from(src, cur, want, budget)
            ids += got
            budget -= scanned
            if nxt is not None:
                if len(ids) >= limit or budget <= 0:
                    return ids, _encode(nxt)
                cur = nxt
                continue
            i = srcs.index(src) + 1
            if i >= len(srcs):
                return ids, None
            src, cur = srcs[i], {"src": srcs[i]}
            if len(ids) >= limit or budget <= 0:
                return ids, _encode(cur)

    async def _from(
        self, src: str, cur: dict[str, Any], want: int, budget: int
    ) -> tuple[list[str], dict[str, Any] | None, int]:
        """Up to ``want`` matching ids of one structure after ``cur``: (ids, the cursor to
        go on from or None when the structure is done, how many ids were examined)."""
        n = max(1, min(want, budget, MAX_JOBS_PER_CALL))
        if src == "ready":
            raw, nxt = await self._list_page(cur, n)
        else:
            raw, nxt = await self._zset_page(self._key(src), cur, n)
        ids = await self._matching(raw)
        return ids, nxt, len(raw)

    async def _zset_page(
        self, key: str, cur: dict[str, Any], n: int
    ) -> tuple[list[str], dict[str, Any] | None]:
        score = cur.get("sc")
        last = cur.get("id")
        if score is None:
            if self.rev:
                score = self.until_ms if self.until_ms is not None else "+inf"
            else:
                score = self.since_ms if self.since_ms is not None else "-inf"
        stop: float | None = self.since_ms if self.rev else self.until_ms
        out: list[tuple[str, float]] = []
        offset = 0
        ended = False
        while len(out) < n:
            # never an offset past ids that consumers may pop meanwhile: each fetch starts at
            # a (score, id) cursor; an offset only steps over a run of ties before it
            got = await self.s.zpage(key, score, n + 1, offset, self.rev, stop)
            taken = 0
            for m, sc in got:
                mid = m.decode()
                # ties are ordered by member: skip those at or before the cursor
                if last is not None and sc == score and ((mid >= last) == self.rev or mid == last):
                    continue
                out.append((mid, sc))
                taken += 1
            if len(got) < n + 1:
                ended = True
                break
            if taken:
                last, score = out[-1]
                offset = 0
            else:
                offset += len(got)
        if ended and len(out) <= n:
            return [x for x, _ in out], None
        out = out[:n]
        last_id, last_sc = out[-1]
        return [x for x, _ in out], {"src": cur["src"], "sc": last_sc, "id": last_id}

    async def _list_page(
        self, cur: dict[str, Any], n: int
    ) -> tuple[list[str], dict[str, Any] | None]:
        """A page of the ready LIST (consumed at its head, appended at its tail): the cursor
        holds the page's last ids and where the last one was; the next page starts after
        (before, newest first) the first of them still in the list."""
        anchors: list[str] = cur.get("an", [])
        first, got = await self.s.ready_page(n, self.rev, int(cur.get("pos", 0)), anchors)
        if first < 0:
            return [], None
        ids = [x.decode() for x in got]
        if self.rev:
            ids.reverse()
        if len(ids) < n:
            return ids, None
        # the next page starts after (before) the last of these still in the list; where the
        # last one is now, to look for it there first
        pos = first if self.rev else first + len(ids) - 1
        return ids, {"src": "ready", "an": ids[-3:][::-1], "pos": pos}

    async def _matching(self, ids: list[str]) -> list[str]:
        if ids and self.state in INDEXED:
            # an index entry may be stale (its record expired, or its id was used again):
            # only those still in the state count toward the page
            rows = await self.s.job_fields(ids, ("s", "t", "g"))
            want = self.state.value.encode()
            out = []
            for job_id, (s, t, g) in zip(ids, rows, strict=True):
                if s != want:
                    continue
                if self.task is not None and (t or b"").decode(errors="replace") != self.task:
                    continue
                if self.group is not None and (g or b"").decode(errors="replace") != self.group:
                    continue
                out.append(job_id)
            return out
        if not ids or (self.task is None and (self.group is None or self.state is JobState.QUEUED)):
            return ids
        rows = await self.s.job_fields(ids, ("t", "g"))
        out = []
        for job_id, (t, g) in zip(ids, rows, strict=True):
            if self.task is not None and (t or b"").decode(errors="replace") != self.task:
                continue
            if self.group is not None and (g or b"").decode(errors="replace") != self.group:
                continue
            out.append(job_id)
        return out

    async def pages(self, size: int = MAX_JOBS_PER_CALL) -> AsyncIterator[list[str]]:
        """Every matching id, a page at a time."""
        cursor: str | None = None
        while True:
            ids, cursor = await self.page(size, cursor)
            if ids:
                yield ids
            if cursor is None:
                return


async def summaries(
    scripts: QueueScripts, codec: Codec, queue: str, state: JobState, ids: Sequence[str]
) -> list[JobSummary]:
    """The listed jobs' records, skipping those that left ``state`` since they were listed."""
    rows = await scripts.job_fields(ids, _FIELDS)
    out = []
    for job_id, r in zip(ids, rows, strict=True):
        t, s, g, pr, a, m, ct, due, f, e = r
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
                max_attempts=_int(m, 1),
                created_ms=_int(ct, 0),
                due_ms=None if due is None else _int(due, 0),
                finished_ms=None if f is None else _int(f, 0),
                error=error,
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
    result = None
    if info.state is JobState.COMPLETED and "r" in h:
        try:
            result = codec.load_result(h["r"])
        except Exception:
            result = None
    deadline = None
    if info.state is JobState.ACTIVE:
        score = await scripts.read(scripts.client.zscore(scripts.keys.active, info.id))
        deadline = None if score is None else int(score)
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
    )


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
