"""What every endpoint of the dashboard shares: the ``Dashboard`` (the App, the queue names,
the CSRF secret, the mode, the templates) kept in the Starlette app's state, the ``page``
decorator that opens the App and turns failures into error pages, and small helpers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any, cast
from urllib.parse import parse_qs

import jinja2
import redis.exceptions as rexc
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.templating import Jinja2Templates

from aioqueue._app.app import App
from aioqueue._model.checks import check_job_id, check_name
from aioqueue._model.exceptions import AioQueueError, ConfigurationError, JobNotFound
from aioqueue.dashboard import _data
from aioqueue.dashboard._security import ADMIN, CSRF_FIELD, CSRF_HEADER, ROLE, Csrf

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
    """The state behind the endpoints: the App, the queue names, the CSRF secret, the mode."""

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

    def can_act(self, request: Request) -> bool:
        """Whether this request may act: not read-only, and its credential is an admin's."""
        return not self.read_only and request.scope.get(ROLE, ADMIN) == ADMIN

    def render(self, request: Request, name: str, context: dict[str, Any]) -> Response:
        base = request.scope.get("root_path", "")
        sid, new = self.csrf.session(request)
        ctx = {
            "base": base,
            "title": self.title,
            "read_only": not self.can_act(request),
            "viewer": not self.read_only and not self.can_act(request),
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


def dash(request: Request) -> Dashboard:
    """The Dashboard of the app serving ``request``."""
    return cast(Dashboard, request.app.state.dashboard)


def page(handler: Handler) -> Handler:
    """An endpoint that opens the App first and answers a failure with an error page (or
    JSON under /api/)."""

    @wraps(handler)
    async def run(request: Request) -> Response:
        d = dash(request)
        await d.open()
        try:
            return await handler(request)
        except JobNotFound:
            return error(request, 404, "no such job (it may have expired)")
        except ConfigurationError as exc:
            return error(request, 400, str(exc))
        except (AioQueueError, rexc.RedisError, OSError) as exc:
            return error(request, 503, f"the server failed: {type(exc).__name__}: {exc}")

    return run


async def may_post(request: Request) -> tuple[dict[str, list[str]], Response | None]:
    """The form of a POST, or the 403 that refuses it: a viewer or a read-only dashboard, or
    a missing or wrong CSRF token."""
    d = dash(request)
    if not d.can_act(request):
        return {}, forbidden("the dashboard is read-only for this user")
    form = await read_form(request)
    token = (form.get(CSRF_FIELD) or [""])[0] or request.headers.get(CSRF_HEADER)
    if not d.csrf.valid(request, token):
        return form, forbidden("missing or invalid CSRF token: reload the page and try again")
    return form, None


def queue_arg(request: Request) -> str:
    try:
        return check_name("queue name", request.path_params["queue"])
    except ConfigurationError:
        raise HTTPException(404, "no such queue") from None


def job_arg(request: Request) -> str:
    try:
        return check_job_id(request.path_params["job_id"])
    except ConfigurationError:
        raise HTTPException(404, "no such job") from None


def opt(request: Request, name: str) -> str | None:
    value = request.query_params.get(name, "").strip()
    return value or None


def one(form: dict[str, list[str]], name: str) -> str | None:
    value = (form.get(name) or [""])[0].strip()
    return value or None


async def read_form(request: Request) -> dict[str, list[str]]:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise HTTPException(415, "expected a form (application/x-www-form-urlencoded)")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise HTTPException(413, "form too large")
    return parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True)


def forbidden(text: str) -> Response:
    return Response(text, status_code=403, media_type="text/plain", headers=SECURITY_HEADERS)


def as_json(data: dict[str, Any]) -> Response:
    return JSONResponse(data, headers={"Cache-Control": "no-store"})


def error(request: Request, status: int, message: str) -> Response:
    if request.url.path.startswith(request.scope.get("root_path", "") + "/api/"):
        return JSONResponse({"error": message}, status_code=status)
    response = dash(request).render(request, "error.html", {"status": status, "message": message})
    response.status_code = status
    return response


def safe_back(back: str, base: str) -> bool:
    """Only a path of this dashboard: never another host (``//x``) nor a scheme."""
    prefix = (base or "") + "/"
    return back.startswith(prefix) and not back.startswith("//") and "\\" not in back
