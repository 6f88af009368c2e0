"""Who may see the dashboard (the ``auth`` hook, HTTP basic auth) and the CSRF token every
POST must carry (bound to a per-browser session cookie by an HMAC with a per-app secret)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import inspect
import secrets
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: the hook: given the request, True lets it through as an admin, ``"viewer"`` as a
#: read-only viewer; False refuses it (403); a Response is sent as it is (basic auth's 401
#: with its challenge)
AuthHook = Callable[[Request], "bool | str | Response | Awaitable[bool | str | Response]"]

#: where the middleware puts the request's role (ADMIN or VIEWER) in the ASGI scope
ROLE = "aioqueue.role"
ADMIN, VIEWER = "admin", "viewer"

SESSION_COOKIE = "aqdash_session"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"


def basic_auth(
    username: str,
    password: str,
    realm: str = "aioqueue",
    *,
    viewer: tuple[str, str] | None = None,
) -> AuthHook:
    """An ``auth`` hook for HTTP basic auth: ``username``/``password`` is the admin (every
    action), ``viewer`` an optional (user, password) that sees everything and acts on nothing
    (no buttons; its POSTs get a 403). Anything else gets a 401 with the browser's login
    challenge. Compared in constant time."""
    creds: list[tuple[str, str, bool | str]] = [(username, password, True)]
    if viewer is not None:
        creds.append((viewer[0], viewer[1], VIEWER))
    if not all(u and p for u, p, _ in creds):
        raise ValueError("basic_auth needs a non-empty username and password")
    if viewer is not None and viewer[0] == username:
        raise ValueError("the viewer needs a username of its own")
    wanted = [(u.encode(), p.encode(), role) for u, p, role in creds]

    def check(request: Request) -> bool | str | Response:
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "basic":
            try:
                user, sep, pw = base64.b64decode(value, validate=True).partition(b":")
            except (binascii.Error, ValueError):
                user, sep, pw = b"", b"", b""
            found: bool | str = False
            for want_user, want_pass, role in wanted:  # every one compared, in constant time
                ok_user = hmac.compare_digest(user, want_user)
                ok_pass = hmac.compare_digest(pw, want_pass)
                if sep and ok_user and ok_pass:
                    found = role
            if found:
                return found
        return PlainTextResponse(
            "authentication required",
            status_code=401,
            headers={"WWW-Authenticate": f'Basic realm="{realm}", charset="UTF-8"'},
        )

    return check


class AuthMiddleware:
    """Runs the hook before anything else answers; None lets every request through (only
    when the dashboard was created with ``auth=None`` on purpose)."""

    def __init__(self, app: ASGIApp, hook: AuthHook | None) -> None:
        self.app = app
        self.hook = hook

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.hook is None:
            await self.app(scope, receive, send)
            return
        verdict = self.hook(Request(scope, receive))
        if inspect.isawaitable(verdict):
            verdict = await verdict
        if isinstance(verdict, Response):
            await verdict(scope, receive, send)
        elif verdict:
            scope[ROLE] = VIEWER if verdict == VIEWER else ADMIN
            await self.app(scope, receive, send)
        else:
            await PlainTextResponse("forbidden", status_code=403)(scope, receive, send)


class Csrf:
    """Per-session CSRF tokens: the session is a random cookie, the token its HMAC under
    the app's secret, so a token is good for one browser session only."""

    def __init__(self, secret: bytes | None) -> None:
        self.secret = secret or secrets.token_bytes(32)

    def session(self, request: Request) -> tuple[str, bool]:
        """The request's session id, and whether it is new (then set it as a cookie)."""
        sid = request.cookies.get(SESSION_COOKIE, "")
        if len(sid) == 43 and sid.replace("-", "").replace("_", "").isalnum():
            return sid, False
        return secrets.token_urlsafe(32), True

    def token(self, sid: str) -> str:
        return hmac.new(self.secret, sid.encode(), hashlib.sha256).hexdigest()

    def valid(self, request: Request, given: str | None) -> bool:
        sid = request.cookies.get(SESSION_COOKIE)
        if not sid or not given:
            return False
        return hmac.compare_digest(self.token(sid), given)

    def set_cookie(self, response: Response, sid: str, path: str, secure: bool) -> None:
        response.set_cookie(
            SESSION_COOKIE, sid, path=path or "/", httponly=True, samesite="strict", secure=secure
        )


class HeadersMiddleware:
    """Adds the security headers (CSP and friends) to every response that lacks them."""

    def __init__(self, app: ASGIApp, headers: dict[str, str]) -> None:
        self.app = app
        self.headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                have = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in self.headers if k not in have]
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, with_headers)


def host_of(header: str) -> str:
    """The host of a ``Host`` header, without its port, lower case ('[::1]' for IPv6)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[: header.find("]") + 1] if "]" in header else ""
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def local_hosts(bound: str) -> list[str]:
    """The hosts a dashboard bound to ``bound`` answers by default: that address and the
    forms of localhost."""
    hosts = ["localhost", "127.0.0.1", "[::1]"]
    if bound and bound not in ("0.0.0.0", "::"):
        hosts.append(f"[{bound}]" if ":" in bound else bound)
    return [host_of(h) for h in hosts]


class HostMiddleware:
    """Refuses (400) a request whose ``Host`` header names none of the allowed hosts, before
    anything else answers: a page of another site cannot reach the dashboard by pointing its
    own name at this address (DNS rebinding)."""

    def __init__(self, app: ASGIApp, hosts: list[str]) -> None:
        self.app = app
        self.hosts = frozenset(host_of(h) if h != "*" else h for h in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and "*" not in self.hosts:
            host = Request(scope).headers.get("host", "")
            if host_of(host) not in self.hosts:
                response = PlainTextResponse("invalid Host header", status_code=400)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
