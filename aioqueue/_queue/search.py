"""Search over one queue's jobs in a state (the dashboard's search, its bulk actions): the
listing's own filters (task, group) and text filters read here (error text, argument text),
with bounded work per call (I13): at most ``budget`` records read, then a cursor to go on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .._model.codec import Codec
from .._store.scripts import QueueScripts
from .inspect import JobSummary, summaries
from .lister import Lister

#: the most records one search call reads (its cursor goes on from there)
SEARCH_BUDGET = 1000
#: the most ids read per round trip when text filters need each record; at least
#: MIN_CHUNK, so that a page fills up in few round trips (it may end MIN_CHUNK - 1 over)
CHUNK = 200
MIN_CHUNK = 20
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
    lister: Lister,
    scripts: QueueScripts,
    codec: Codec,
    queue: str,
    *,
    error: str | None,
    text: str | None,
    cursor: str | None,
    limit: int,
    budget: int,
) -> SearchPage:
    """The jobs ``lister`` lists (its state, task and group) whose error (type and message)
    and arguments (as JSON text) contain ``error`` and ``text`` (case-blind): see
    ``Queue.search``."""
    error = (error or "").strip().casefold()[:MAX_NEEDLE] or None
    text = (text or "").strip().casefold()[:MAX_NEEDLE] or None
    found: list[JobSummary] = []
    scanned = 0
    while True:
        left = limit - len(found)
        want = min(max(min(CHUNK, left), MIN_CHUNK) if error or text else left, budget - scanned)
        ids, cursor = await lister.page(want, cursor)
        scanned += len(ids)
        rows = await summaries(scripts, codec, queue, lister.state, ids)
        if error is not None:
            rows = [s for s in rows if error in _error_text(s)]
        if text is not None and rows:
            rows = await _with_text(scripts, codec, queue, rows, text)
        found += rows
        if cursor is None or len(found) >= limit or scanned >= budget:
            return SearchPage(tuple(found), scanned, cursor)


async def _with_text(
    scripts: QueueScripts, codec: Codec, queue: str, rows: list[JobSummary], needle: str
) -> list[JobSummary]:
    fields = await scripts.job_fields([s.id for s in rows], ("p", "o"))
    out = []
    for s, (payload, options) in zip(rows, fields, strict=True):
        try:
            args, kwargs = codec.load_args(queue, s.id, s.task, payload or b"", options or b"")
        except Exception:  # sealed or garbled: no text to match
            continue
        if needle in json.dumps([list(args), kwargs], ensure_ascii=False, default=repr).casefold():
            out.append(s)
    return out
