"""Finding things: the job-id box (``/find``), the bulk actions over a search's matches with a
count and a confirmation (``/queues/{queue}/bulk``: bounded per request, continuing with a
cursor), and a queue's trends (``/queues/{queue}/trends``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from aioqueue._model.checks import check_job_id
from aioqueue._model.exceptions import ConfigurationError, CorruptRecord, JobNotFound
from aioqueue._queue.search import SEARCH_BUDGET
from aioqueue._queue.trends import SPANS, TrendPoint
from aioqueue.dashboard import _data
from aioqueue.dashboard._actions import OFFERED, act_on
from aioqueue.dashboard._charts import bars
from aioqueue.dashboard._page import dash, forbidden, may_post, one, page, queue_arg

#: the actions a bulk confirmation offers (each only for the states that offer it)
BULK = ("retry", "delete", "cancel", "promote")


@page
async def find(request: Request) -> Response:
    """The job-id box: the job's page, in whichever of the dashboard's queues holds it."""
    d = dash(request)
    raw = request.query_params.get("id", "").strip()
    try:
        job_id = check_job_id(raw)
    except ConfigurationError:
        raise HTTPException(400, f"not a job id: {raw[:100]!r}") from None
    for name in await d.names.get():
        try:
            await d.app.queue(name).job_info(job_id)
        except JobNotFound:
            continue
        except CorruptRecord:
            pass  # its page says what cannot be read
        base = request.scope.get("root_path", "")
        return RedirectResponse(f"{base}/queues/{name}/jobs/{job_id}", status_code=303)
    raise HTTPException(404, f"no job {job_id!r} in any queue (it may have expired)")


def _bulk_args(params: Any) -> tuple[_data.Listing, str]:
    listing = _data.Listing.of(params)
    act = params.get("action", "")
    if act not in BULK or act not in OFFERED[listing.state]:
        raise ConfigurationError(
            f"{act or 'no action'!r} is not offered for {listing.state!r} jobs"
        )
    return listing, act


@page
async def bulk(request: Request) -> Response:
    """GET: how many jobs of the next window (``SEARCH_BUDGET`` records from ``cursor``)
    match, and a button to confirm; POST (confirmed): act on that window's matches, then the
    confirmation of the next window."""
    d = dash(request)
    if not d.can_act(request):
        return forbidden("the dashboard is read-only for this user")
    name = queue_arg(request)
    q = d.app.queue(name)
    if request.method == "POST":
        form, refused = await may_post(request)
        if refused is not None:
            return refused
        params = {k: v[0] for k, v in form.items() if v}
        listing, act = _bulk_args(params)
        found = await listing.page(q, one(form, "cursor"), limit=SEARCH_BUDGET)
        n = await act_on(q, act, listing.state, [s.id for s in found.items]) if found.items else 0
        done = params.get("done", "")
        total = (int(done) if done.isdigit() and len(done) < 16 else 0) + n
        query = {**listing.query, "action": act, "done": str(total)}
        query["msg"] = f"{act}: {n} of {len(found.items)} matching jobs in this window"
        if found.cursor:
            query["cursor"] = found.cursor
        else:
            query["end"] = "1"
        base = request.scope.get("root_path", "")
        return RedirectResponse(f"{base}/queues/{name}/bulk?{urlencode(query)}", status_code=303)
    listing, act = _bulk_args(request.query_params)
    cursor = request.query_params.get("cursor") or None
    end = request.query_params.get("end") == "1"
    window = None if end else await listing.page(q, cursor, limit=SEARCH_BUDGET)
    counts = await _data.all_counts(q)
    ctx = {
        "qname": name,
        "act": act,
        "listing": listing,
        "cursor": cursor or "",
        "found": window,
        "jobs": [] if window is None else [_data.summary_row(s) for s in window.items[:20]],
        "total": counts.get(listing.state, 0),
        "done": request.query_params.get("done", ""),
        "back": f"{request.scope.get('root_path', '')}/queues/{name}?{urlencode(listing.query)}",
    }
    return d.render(request, "bulk.html", ctx)


@page
async def trends(request: Request) -> Response:
    """A queue's trends over the last hour, day or week; of one task with ``task``."""
    d = dash(request)
    name = queue_arg(request)
    span = request.query_params.get("span", "hour")
    if span not in SPANS:
        raise HTTPException(400, f"span must be one of {', '.join(SPANS)}")
    t = await d.app.queue(name).trends(span)
    task = request.query_params.get("task", "")
    points = t.tasks.get(task, ()) if task else t.points
    fmt = "%H:%M" if span != "week" else "%a %Hh"
    unit = "minute" if span == "hour" else "hour"
    rows = [(p.start_ms, p.completed, p.failed) for p in points]
    charts = {
        "completed": bars(rows, 1, "completed", f"completed per {unit}", fmt),
        "failed": bars(rows, 2, "failed", f"dead-lettered per {unit}", fmt),
    }
    # a task's backlog and wait too: its count sampled by the workers' beats, and the
    # longest wait of its jobs started in the bucket (lib/trends.lua)
    gauges = [(p.start_ms, p.backlog or 0, round((p.wait or 0) * 1000)) for p in points]
    charts["backlog"] = bars(gauges, 1, "backlog", f"highest backlog per {unit}", fmt)
    charts["wait"] = bars(gauges, 2, "wait", f"longest wait (ms) per {unit}", fmt)
    ctx = {
        "qname": name,
        "span": span,
        "spans": {
            s: "?" + urlencode({"span": s, **({"task": task} if task else {})}) for s in SPANS
        },
        "task": task,
        "charts": charts,
        "tasks": [_task_row(k, v) for k, v in t.tasks.items()],
        "shown": _task_row(task, points),
        "latest": _latest(points),
    }
    return d.render(request, "trends.html", ctx)


def _task_row(task: str, points: tuple[TrendPoint, ...]) -> dict[str, Any]:
    waits = [p.wait for p in points if p.wait is not None]
    return {
        "task": task,
        "completed": sum(p.completed for p in points),
        "failed": sum(p.failed for p in points),
        "backlog": _latest(points)["backlog"],
        "wait": _data.took(0, round(max(waits) * 1000)) if waits else "-",
    }


def _latest(points: tuple[TrendPoint, ...]) -> dict[str, str]:
    """The newest bucket holding a backlog sample (a worker's beat), as text."""
    for p in reversed(points):
        if p.backlog is not None:
            at = datetime.fromtimestamp(p.start_ms / 1000, UTC).strftime("%H:%M")
            wait = "-" if p.wait is None else _data.took(0, round(p.wait * 1000))
            return {"backlog": str(p.backlog), "wait": wait, "at": at}
    return {"backlog": "-", "wait": "-", "at": "-"}
