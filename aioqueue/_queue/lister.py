"""Paged listings of one queue's jobs in a state (``Lister``, behind ``Queue.jobs``).

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
from collections.abc import AsyncIterator
from typing import Any

from .._model.exceptions import ConfigurationError
from .._model.job import JobState
from .._model.limits import MAX_JOBS_PER_CALL
from .._store.scripts import QueueScripts

#: the most ids one page examines (filters may leave a page short; its cursor goes on)
SCAN_BUDGET = 5000
#: the anchor ids a cursor of the ready list carries (page.lua uses no more), and the longest
#: cursor accepted back: a page's cursor is far shorter
MAX_ANCHORS = 3
MAX_CURSOR = 2048
#: the states a listing can show: the ones an index holds
LISTED = (
    JobState.WAITING,
    JobState.SCHEDULED,
    JobState.QUEUED,
    JobState.ACTIVE,
    JobState.FAILED,
    JobState.COMPLETED,
    JobState.CANCELLED,
)
#: the states held in an index, which only lists (its entries may be stale): finished jobs,
#: and jobs waiting for their dependencies (``waiting``; a batch's callback is not in it)
INDEXED = (JobState.WAITING, JobState.COMPLETED, JobState.CANCELLED)


def _encode(cur: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(cur, separators=(",", ":")).encode()).decode()


def _decode(cursor: str) -> dict[str, Any]:
    """The cursor a page handed out, checked field by field: it comes back from the client, so
    anything else (oversized, garbled, more anchors than a page writes) is refused (I13)."""
    if not isinstance(cursor, str) or len(cursor) > MAX_CURSOR:
        raise ConfigurationError(f"invalid cursor (at most {MAX_CURSOR} characters)")
    try:
        cur = json.loads(base64.urlsafe_b64decode(cursor.encode()))
    except (ValueError, TypeError):
        raise ConfigurationError(f"invalid cursor {cursor!r}") from None
    if not (isinstance(cur, dict) and _valid(cur)):
        raise ConfigurationError(f"invalid cursor {cursor!r}")
    return cur


def _valid(cur: dict[str, Any]) -> bool:
    """A cursor's fields have the types and ranges this module writes: a crafted one with
    unknown fields, more anchors than a page writes, a position past 2^50, a NaN score or a
    list of numbers is refused, not sent to a script."""
    src, an, pos, sc, last = (cur.get(k) for k in ("src", "an", "pos", "sc", "id"))
    if not isinstance(src, str) or set(cur) - {"src", "an", "pos", "sc", "id"}:
        return False
    if an is not None and not (
        isinstance(an, list) and len(an) <= MAX_ANCHORS and all(isinstance(a, str) for a in an)
    ):
        return False
    if pos is not None and not (type(pos) is int and 0 <= pos < 2**50):
        return False
    if sc is not None and not (type(sc) in (int, float) and abs(sc) < 2**63):
        return False  # NaN too: it compares false
    return last is None or isinstance(last, str)


def check_state(state: str | JobState) -> JobState:
    try:
        st = JobState(state)
    except ValueError:
        raise ConfigurationError(
            f"unknown state {state!r}: use one of {', '.join(s.value for s in LISTED)}"
        ) from None
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
        ids = await self._matching(raw, src == "ready")
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
        return ids, {"src": "ready", "an": ids[-MAX_ANCHORS:][::-1], "pos": pos}

    async def _matching(self, ids: list[str], stale: bool) -> list[str]:
        if ids and (stale or self.state in INDEXED):
            # an index entry may be stale (its record expired, or its id was used again), and
            # so may an entry of the ready list (a job cancelled far from its head: see
            # leave_ready in lua/lib/lanes): only those still in the state count
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
