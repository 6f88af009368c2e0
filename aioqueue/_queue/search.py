"""Search over one queue's jobs in a state (the dashboard's search, its bulk actions): the
listing's own filters (task, group) and text filters read here (error text, argument text),
with bounded work per call (I13): at most ``budget`` records read, then a cursor to go on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._model.job import JobState
from .inspect import JobSummary, summaries

if TYPE_CHECKING:
    from .queue import Queue

#: the most records one search call reads (its cursor goes on from there)
SEARCH_BUDGET = 1000
#: the ids read per round trip when text filters need each record
CHUNK = 200
#: the longest search text accepted
MAX_NEEDLE = 200


@dataclass(frozen=True, slots=True)
class SearchPage:
    """A page of matches: the jobs, how many records were read for it, and the cursor to go
    on (None: the listing is at its end)."""

    items: tuple[JobSummary, ...]
    scanned: int
    cursor: str | None


def _error_text(s: JobSummary) -> str:
    return "" if s.error is None else f"{s.error.type}: {s.error.message}".casefold()


async def search(
    q: Queue,
    state: str | JobState,
    *,
    task: str | None = None,
    group: str | None = None,
    error: str | None = None,
    text: str | None = None,
    cursor: str | None = None,
    newest_first: bool = False,
    limit: int = 50,
    budget: int = SEARCH_BUDGET,
) -> SearchPage:
    """The jobs of ``q`` in ``state`` whose task and group are those given and whose error
    (type and message) and arguments (as text) contain ``error`` and ``text`` (case-blind).

    Stops once ``limit`` jobs matched (at the end of a chunk: a page may hold a few more) or
    ``budget`` records were read; the cursor goes on after the last record read. Arguments
    that cannot be decoded here (encrypted without the key, corrupt) match no ``text``.
    """
    error = (error or "").strip().casefold()[:MAX_NEEDLE] or None
    text = (text or "").strip().casefold()[:MAX_NEEDLE] or None
    lister = q._lister(state, task, group, newest_first)
    scripts, codec = q._scripts, q.app.codec
    found: list[JobSummary] = []
    scanned = 0
    while True:
        want = min(CHUNK if error or text else limit, budget - scanned)
        ids, cursor = await lister.page(want, cursor)
        scanned += len(ids)
        rows = await summaries(scripts, codec, q.name, lister.state, ids)
        if error is not None:
            rows = [s for s in rows if error in _error_text(s)]
        if text is not None and rows:
            rows = await _with_text(q, rows, text)
        found += rows
        if cursor is None or len(found) >= limit or scanned >= budget:
            return SearchPage(tuple(found), scanned, cursor)


async def _with_text(q: Queue, rows: list[JobSummary], needle: str) -> list[JobSummary]:
    fields = await q._scripts.job_fields([s.id for s in rows], ("p", "o"))
    out = []
    for s, (payload, options) in zip(rows, fields, strict=True):
        try:
            args, kwargs = q.app.codec.load_args(
                q.name, s.id, s.task, payload or b"", options or b""
            )
        except Exception:  # sealed or garbled: no text to match
            continue
        if needle in json.dumps([list(args), kwargs], ensure_ascii=False, default=repr).casefold():
            out.append(s)
    return out
