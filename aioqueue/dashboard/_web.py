"""The dashboard's pages, their live JSON endpoints and the POST of the actions, as
module-level endpoints (Starlette's style) listed in ``ROUTES``; the search, bulk actions,
job-id box and trends are in ``_find``. Pages are rendered by Jinja with autoescape on; a POST
is CSRF-checked and refused to a viewer or a read-only dashboard (``_page.may_post``)."""

from __future__ import annotations

from importlib import resources
from typing import Any
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from aioqueue._app.workflow import WorkflowHandle, workflow_tree
from aioqueue._model.exceptions import ConfigurationError, WorkflowError
from aioqueue.dashboard import _data, _find, _limits
from aioqueue.dashboard._actions import run_action
from aioqueue.dashboard._charts import bars
from aioqueue.dashboard._page import (
    SECURITY_HEADERS,
    Dashboard,
    as_json,
    dash,
    error,
    job_arg,
    may_post,
    page,
    queue_arg,
    safe_back,
)
from aioqueue.dashboard._security import AuthHook, AuthMiddleware, HeadersMiddleware, HostMiddleware

#: the most previous cursors a listing's links carry (its "previous page" goes that far back)
MAX_TRAIL = 20


@page
async def overview(request: Request) -> Response:
    d = dash(request)
    data = await _data.overview(d.app, await d.names.get())
    return d.render(request, "overview.html", {"o": data, **_charts(data)})


@page
async def overview_json(request: Request) -> Response:
    d = dash(request)
    data = await _data.overview(d.app, await d.names.get())
    values = {
        "workers": data["workers"],
        "completed_1h": data["completed_1h"],
        "failed_1h": data["failed_1h"],
    }
    for r in data["queues"]:
        for state, n in r["counts"].items():
            values[f"q:{r['name']}:{state}"] = n
        values[f"q:{r['name']}:workers"] = r["workers"]
        values[f"q:{r['name']}:completed_1h"] = r["completed_1h"]
        values[f"q:{r['name']}:failed_1h"] = r["failed_1h"]
        values[f"q:{r['name']}:paused"] = _paused_text(r)
    return as_json({"values": values, "html": _charts(data)})


@page
async def queue(request: Request) -> Response:
    d = dash(request)
    name = queue_arg(request)
    listing = _data.Listing.of(request.query_params)
    cursor = request.query_params.get("cursor") or None
    trail = [c for c in request.query_params.get("trail", "").split(",") if c][-MAX_TRAIL:]
    try:
        q = await _data.queue_page(d.app, name, listing, cursor)
    except ConfigurationError as exc:
        # a garbled or crafted cursor, or a filter that is no name: the request's fault
        raise HTTPException(400, str(exc)) from None
    here = request.url.path + ("?" + request.url.query if request.url.query else "")
    links = _pager(request.url.path, listing, cursor, q["cursor"], trail)
    ctx = {"q": q, "state": listing.state, "filters": listing, "here": here, **links}
    return d.render(request, "queue.html", ctx)


def _pager(
    path: str, listing: _data.Listing, cursor: str | None, nxt: str | None, trail: list[str]
) -> dict[str, str]:
    """The links of a listing's pages: next (its cursor, this one onto the trail), previous
    (the trail's last), first."""

    def link(**extra: str) -> str:
        return path + "?" + urlencode({**listing.query, **{k: v for k, v in extra.items() if v}})

    links = {"first_url": link() if cursor else "", "next_url": "", "prev_url": ""}
    if nxt:
        back = [*trail, cursor or "-"][-MAX_TRAIL:]
        links["next_url"] = link(cursor=nxt, trail=",".join(back))
    if cursor and trail:
        prev = trail[-1]
        links["prev_url"] = link(cursor="" if prev == "-" else prev, trail=",".join(trail[:-1]))
    elif cursor:
        links["prev_url"] = links["first_url"]
    return links


@page
async def queue_json(request: Request) -> Response:
    d = dash(request)
    q = d.app.queue(queue_arg(request))
    values: dict[str, Any] = {f"tab:{k}": v for k, v in (await _data.all_counts(q)).items()}
    values["paused"] = "paused" if await q.is_paused() else "running"
    return as_json({"values": values})


@page
async def job(request: Request) -> Response:
    d = dash(request)
    job = await _data.job_page(d.app, queue_arg(request), job_arg(request))
    return d.render(request, "job.html", {"j": job, "here": request.url.path})


@page
async def workflow(request: Request) -> Response:
    d = dash(request)
    handle = WorkflowHandle(d.app, request.path_params["workflow_id"], queue_arg(request))
    try:
        tree = await workflow_tree(handle)
    except WorkflowError as exc:
        return error(request, 404, str(exc))
    return d.render(request, "workflow.html", {"w": tree, "queue": handle.queue})


@page
async def job_json(request: Request) -> Response:
    job = await _data.job_page(dash(request).app, queue_arg(request), job_arg(request))
    keys = ("state", "attempts", "started", "lease", "finished", "progress", "result")
    values = {k: job[k] for k in (*keys, "error", "traceback", "due", "cancel_requested")}
    hist = [[h[k] for k in _HISTORY] for h in job["history"]]
    return as_json({"state": job["state"], "values": values, "tables": {"history": hist}})


@page
async def workers(request: Request) -> Response:
    d = dash(request)
    rows = await _data.workers_page(d.app, await d.names.get())
    return d.render(request, "workers.html", {"workers": rows})


@page
async def workers_json(request: Request) -> Response:
    d = dash(request)
    rows = await _data.workers_page(d.app, await d.names.get())
    table = [[_worker_cell(r, k) for k in _WORKER] for r in rows]
    return as_json({"tables": {"workers": table}, "values": {"count": len(rows)}})


@page
async def dead(request: Request) -> Response:
    d = dash(request)
    out = []
    for name in await d.names.get():
        got = await d.app.queue(name).jobs("failed", newest_first=True, limit=20)
        if got.items:
            out.append({"name": name, "jobs": [_data.summary_row(s) for s in got.items]})
    return d.render(request, "dead.html", {"queues": out, "here": request.url.path})


@page
async def action(request: Request) -> Response:
    form, refused = await may_post(request)
    if refused is not None:
        return refused
    name = queue_arg(request)
    try:
        message = await run_action(dash(request).app.queue(name), form)
    except ConfigurationError as exc:
        message = f"refused: {exc}"
    base = request.scope.get("root_path", "")
    back = (form.get("back") or [""])[0]
    if not safe_back(back, base):
        back = f"{base}/queues/{name}"
    elif "/jobs/" in back and (form.get("action") or [""])[0] == "delete":
        back = f"{base}/queues/{name}"  # the job is gone: back to its queue
    back = back.split("&msg=")[0].split("?msg=")[0]
    sep = "&" if "?" in back else "?"
    return RedirectResponse(back + sep + urlencode({"msg": message}), status_code=303)


_HISTORY = ("number", "worker", "started", "ended", "took", "outcome", "error")
_WORKER: tuple[str, ...] = ("id", "host", "pid", "version", "queues", "concurrency")
_WORKER += ("uptime", "beat", "alive", "held", "done", "failed")


def _worker_cell(row: dict[str, Any], key: str) -> str:
    if key == "alive":
        return "alive" if row["alive"] else "DEAD"
    return str(row[key])


def _paused_text(row: dict[str, Any]) -> str:
    if row["paused"]:
        return "paused"
    if row["paused_groups"]:
        return "groups paused: " + ", ".join(row["paused_groups"][:5])
    return ""


def _charts(data: dict[str, Any]) -> dict[str, str]:
    return {
        "chart_completed": bars(data["series"], 1, "completed", "completed per minute"),
        "chart_failed": bars(data["series"], 2, "failed", "dead-lettered per minute"),
    }


ROUTES: list[BaseRoute] = [
    Route("/", overview),
    Route("/api/overview", overview_json),
    Route("/find", _find.find),
    Route("/queues/{queue}", queue),
    Route("/api/queues/{queue}", queue_json),
    Route("/queues/{queue}/trends", _find.trends),
    Route("/queues/{queue}/bulk", _find.bulk, methods=["GET", "POST"]),
    Route("/queues/{queue}/jobs/{job_id:path}", job),
    Route("/api/queues/{queue}/jobs/{job_id:path}", job_json),
    Route("/queues/{queue}/workflows/{workflow_id}", workflow),
    Route("/workers", workers),
    Route("/api/workers", workers_json),
    Route("/dead", dead),
    Route("/limiters", _limits.limiters, methods=["GET", "POST"]),
    Route("/queues/{queue}/actions", action, methods=["POST"]),
    Mount(
        "/static",
        StaticFiles(directory=str(resources.files("aioqueue.dashboard") / "static")),
        name="static",
    ),
]


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error(request, exc.status_code, str(exc.detail))


def build(d: Dashboard, auth: AuthHook | None, hosts: list[str] | None = None) -> Starlette:
    web = Starlette(
        routes=ROUTES,
        middleware=[
            *([] if hosts is None else [Middleware(HostMiddleware, hosts=hosts)]),
            Middleware(HeadersMiddleware, headers=SECURITY_HEADERS),
            Middleware(AuthMiddleware, hook=auth),
        ],
        exception_handlers={HTTPException: _http_error},
    )
    web.state.dashboard = d
    return web
