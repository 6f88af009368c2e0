"""The dashboard's routes: pages (rendered by Jinja with autoescape on), their live JSON
endpoints, and the one POST endpoint of the actions (CSRF-checked, refused read-only)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlencode

import jinja2
import redis.exceptions as rexc
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from aioqueue._app.app import App
from aioqueue._model.checks import check_job_id, check_name
from aioqueue._model.exceptions import AioQueueError, ConfigurationError, JobNotFound
from aioqueue.dashboard import _data
from aioqueue.dashboard._actions import run_action
from aioqueue.dashboard._charts import bars
from aioqueue.dashboard._security import (
    CSRF_FIELD,
    CSRF_HEADER,
    AuthHook,
    AuthMiddleware,
    Csrf,
    HeadersMiddleware,
    HostMiddleware,
)

#: the most bytes a POST body may have (a form of at most 1,000 selected ids)
MAX_BODY = 256 * 1024
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}

Handler = Callable[[Request], Awaitable[Response]]


class Dashboard:
    """The state behind the routes: the App, the queue names, the CSRF secret, the mode."""

    def __init__(
        self,
        app: App,
        *,
        read_only: bool,
        queues: tuple[str, ...] | None,
        secret: bytes | None,
        title: str,
        poll_seconds: float,
    ) -> None:
        self.app = app
        self.read_only = read_only
        self.names = _data.Names(app, queues)
        self.csrf = Csrf(secret)
        self.title = title
        self.poll_ms = int(poll_seconds * 1000)
        self._opened = asyncio.Lock()
        env = jinja2.Environment(
            loader=jinja2.PackageLoader("aioqueue.dashboard", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.templates = Jinja2Templates(env=env)

    async def open(self) -> None:
        """Open the App on first use (idempotent; the CLI opens it beforehand)."""
        async with self._opened:
            await self.app.open()

    def render(self, request: Request, name: str, context: dict[str, Any]) -> Response:
        base = request.scope.get("root_path", "")
        sid, new = self.csrf.session(request)
        ctx = {
            "base": base,
            "title": self.title,
            "read_only": self.read_only,
            "csrf": self.csrf.token(sid),
            "csrf_field": CSRF_FIELD,
            "poll_ms": self.poll_ms,
            "msg": request.query_params.get("msg", ""),
            **context,
        }
        response = self.templates.TemplateResponse(request, name, ctx)
        if new:
            self.csrf.set_cookie(response, sid, base or "/", request.url.scheme == "https")
        return response


def _queue_arg(request: Request) -> str:
    try:
        return check_name("queue name", request.path_params["queue"])
    except ConfigurationError:
        raise HTTPException(404, "no such queue") from None


def _opt(request: Request, name: str) -> str | None:
    value = request.query_params.get(name, "").strip()
    return value or None


def routes(d: Dashboard) -> list[Route | Mount]:
    async def overview(request: Request) -> Response:
        data = await _data.overview(d.app, await d.names.get())
        return d.render(request, "overview.html", {"o": data, **_charts(data)})

    async def overview_json(request: Request) -> Response:
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
        return _json({"values": values, "html": _charts(data)})

    async def queue(request: Request) -> Response:
        name = _queue_arg(request)
        state = request.query_params.get("state", "queued")
        if state not in _data.TABS:
            raise HTTPException(400, f"unknown state {state!r}")
        task, group = _opt(request, "task"), _opt(request, "group")
        try:
            page = await _data.queue_page(
                d.app,
                name,
                state,
                task=task,
                group=group,
                cursor=_opt(request, "cursor"),
                newest_first=request.query_params.get("order") == "newest",
            )
        except ConfigurationError as exc:
            # a garbled or crafted cursor, or a filter that is no name: the request's fault
            raise HTTPException(400, str(exc)) from None
        filters = {"state": state, "task": task or "", "group": group or ""}
        order = request.query_params.get("order", "newest" if state == "failed" else "")
        here = request.url.path + ("?" + request.url.query if request.url.query else "")
        return d.render(
            request,
            "queue.html",
            {"q": page, "state": state, "filters": filters, "order": order, "here": here},
        )

    async def queue_json(request: Request) -> Response:
        name = _queue_arg(request)
        q = d.app.queue(name)
        counts = await q.counts()
        values: dict[str, Any] = {f"tab:{k}": v for k, v in counts.items()}
        values["paused"] = "paused" if await q.is_paused() else "running"
        return _json({"values": values})

    async def job(request: Request) -> Response:
        name = _queue_arg(request)
        job = await _data.job_page(d.app, name, _job_arg(request))
        here = request.url.path
        return d.render(request, "job.html", {"j": job, "here": here})

    async def job_json(request: Request) -> Response:
        job = await _data.job_page(d.app, _queue_arg(request), _job_arg(request))
        keys = ("state", "attempts", "started", "lease", "finished", "progress", "result")
        values = {k: job[k] for k in (*keys, "error", "traceback", "due", "cancel_requested")}
        hist = [[h[k] for k in _HISTORY] for h in job["history"]]
        return _json({"state": job["state"], "values": values, "tables": {"history": hist}})

    async def workers(request: Request) -> Response:
        rows = await _data.workers_page(d.app, await d.names.get())
        return d.render(request, "workers.html", {"workers": rows})

    async def workers_json(request: Request) -> Response:
        rows = await _data.workers_page(d.app, await d.names.get())
        table = [[_worker_cell(r, k) for k in _WORKER] for r in rows]
        return _json({"tables": {"workers": table}, "values": {"count": len(rows)}})

    async def dead(request: Request) -> Response:
        out = []
        for name in await d.names.get():
            page = await d.app.queue(name).jobs("failed", newest_first=True, limit=20)
            if page.items:
                out.append({"name": name, "jobs": [_data.summary_row(s) for s in page.items]})
        return d.render(request, "dead.html", {"queues": out, "here": request.url.path})

    async def action(request: Request) -> Response:
        if d.read_only:
            return _forbidden("the dashboard is read-only")
        form = await _form(request)
        token = (form.get(CSRF_FIELD) or [""])[0] or request.headers.get(CSRF_HEADER)
        if not d.csrf.valid(request, token):
            return _forbidden("missing or invalid CSRF token: reload the page and try again")
        name = _queue_arg(request)
        try:
            message = await run_action(d.app.queue(name), form)
        except ConfigurationError as exc:
            message = f"refused: {exc}"
        base = request.scope.get("root_path", "")
        back = (form.get("back") or [""])[0]
        if not _safe_back(back, base):
            back = f"{base}/queues/{name}"
        elif "/jobs/" in back and (form.get("action") or [""])[0] == "delete":
            back = f"{base}/queues/{name}"  # the job is gone: back to its queue
        back = back.split("&msg=")[0].split("?msg=")[0]
        sep = "&" if "?" in back else "?"
        return RedirectResponse(back + sep + urlencode({"msg": message}), status_code=303)

    def guarded(handler: Handler) -> Handler:
        async def run(request: Request) -> Response:
            await d.open()
            try:
                return await handler(request)
            except JobNotFound:
                return _error(d, request, 404, "no such job (it may have expired)")
            except ConfigurationError as exc:
                return _error(d, request, 400, str(exc))
            except (AioQueueError, rexc.RedisError, OSError) as exc:
                return _error(d, request, 503, f"the server failed: {type(exc).__name__}: {exc}")

        return run

    static = resources.files("aioqueue.dashboard") / "static"
    pages: list[tuple[str, Handler, list[str]]] = [
        ("/", overview, ["GET"]),
        ("/api/overview", overview_json, ["GET"]),
        ("/queues/{queue}", queue, ["GET"]),
        ("/api/queues/{queue}", queue_json, ["GET"]),
        ("/queues/{queue}/jobs/{job_id:path}", job, ["GET"]),
        ("/api/queues/{queue}/jobs/{job_id:path}", job_json, ["GET"]),
        ("/workers", workers, ["GET"]),
        ("/api/workers", workers_json, ["GET"]),
        ("/dead", dead, ["GET"]),
        ("/queues/{queue}/actions", action, ["POST"]),
    ]
    out: list[Route | Mount] = [Route(p, guarded(h), methods=m) for p, h, m in pages]
    out.append(Mount("/static", StaticFiles(directory=str(static)), name="static"))
    return out


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


def _job_arg(request: Request) -> str:
    try:
        return check_job_id(request.path_params["job_id"])
    except ConfigurationError:
        raise HTTPException(404, "no such job") from None


def _safe_back(back: str, base: str) -> bool:
    """Only a path of this dashboard: never another host (``//x``) nor a scheme."""
    prefix = (base or "") + "/"
    return back.startswith(prefix) and not back.startswith("//") and "\\" not in back


async def _form(request: Request) -> dict[str, list[str]]:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise HTTPException(415, "expected a form (application/x-www-form-urlencoded)")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise HTTPException(413, "form too large")
    return parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True)


def _forbidden(text: str) -> Response:
    return Response(text, status_code=403, media_type="text/plain", headers=SECURITY_HEADERS)


def _json(data: dict[str, Any]) -> Response:
    return JSONResponse(data, headers={"Cache-Control": "no-store"})


def _error(d: Dashboard, request: Request, status: int, message: str) -> Response:
    if request.url.path.startswith(request.scope.get("root_path", "") + "/api/"):
        return JSONResponse({"error": message}, status_code=status)
    response = d.render(request, "error.html", {"status": status, "message": message})
    response.status_code = status
    return response


def build(d: Dashboard, auth: AuthHook | None, hosts: list[str] | None = None) -> Starlette:
    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return _error(d, request, exc.status_code, str(exc.detail))

    return Starlette(
        routes=routes(d),
        middleware=[
            *([] if hosts is None else [Middleware(HostMiddleware, hosts=hosts)]),
            Middleware(HeadersMiddleware, headers=SECURITY_HEADERS),
            Middleware(AuthMiddleware, hook=auth),
        ],
        exception_handlers={HTTPException: http_error},
    )
