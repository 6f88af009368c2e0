"""A web dashboard for aioqueue: an ASGI app (Starlette) over the operator API.

Install with ``pip install 'aioqueue[dashboard]'``, then either run it::

    python -m aioqueue dashboard --port 8080 --user admin --password ...

or mount it into your own ASGI app (FastAPI, Starlette)::

    from aioqueue.dashboard import basic_auth, create_app

    api.mount("/queues", create_app(app, auth=basic_auth("admin", secret)))

It shows every queue with its counts and the last hour's throughput, each queue's jobs by
state (searched by task, group, error text and argument text, a bounded number of records
per request), a job's arguments, result, error and attempts, trends per queue and task over
the last hour, day and week, the workers and the dead letters, and updates them in place
every few seconds. Its actions (retry, delete, promote, cancel, pause, resume, purge a
group, and each of them on every job matching a search after a confirmation) are POSTs that
carry a per-session CSRF token; ``read_only=True`` removes them, and so does a viewer's
credential (``basic_auth(..., viewer=(user, password))``). See docs/dashboard.md.
"""

from __future__ import annotations

from starlette.applications import Starlette

from aioqueue._app.app import App
from aioqueue._model.exceptions import ConfigurationError
from aioqueue.dashboard._page import Dashboard
from aioqueue.dashboard._security import AuthHook, basic_auth
from aioqueue.dashboard._web import build

__all__ = ["AuthHook", "basic_auth", "create_app"]

_REQUIRED = object()


def create_app(
    app: App,
    *,
    auth: AuthHook | object | None = _REQUIRED,
    read_only: bool = False,
    queues: list[str] | tuple[str, ...] | None = None,
    secret: bytes | None = None,
    title: str = "aioqueue",
    poll_seconds: float = 2.0,
    allowed_hosts: list[str] | tuple[str, ...] | None = None,
) -> Starlette:
    """The dashboard of ``app``'s queues, as a Starlette app (mount it anywhere).

    Args:
        app: the App whose queues (those under its key prefix) are shown; it is opened on
            the first request if it is not open yet, and never closed by the dashboard.
        auth: required, so that a dashboard is never open by accident: a callable given the
            Starlette ``Request`` that returns (or awaits) True to let it in, False to refuse
            it (403), ``"viewer"`` to let it in read-only (no action buttons, its POSTs
            refused with 403), or a ``Response`` to send instead (``basic_auth(user,
            password, viewer=...)`` builds one for HTTP basic auth); ``None`` lets everyone
            in, for a dashboard mounted behind an authentication of your own.
        read_only: no actions: no buttons, and every POST is refused with 403.
        queues: the queues to show (default: every queue under the App's prefix, found
            with a SCAN of the database that is reused for 30 seconds).
        secret: the key of the CSRF tokens (default: random per process, so a restart asks
            open pages to reload before their next action). Give one shared by every process
            that serves the dashboard behind one load balancer.
        title: shown in the header and the page titles.
        poll_seconds: how often open pages refresh their numbers (>= 0.5).
        allowed_hosts: the host names (or addresses) a request's ``Host`` header may name;
            any other gets a 400 before anything answers (against DNS rebinding). ``None``
            (the default for a mounted app) checks nothing: the app it is mounted in
            decides; ``"*"`` allows any. ``aioqueue dashboard`` always passes its bound
            address, the forms of localhost and each ``--allowed-host``.

    Raises:
        ConfigurationError: ``auth`` not given, or a bad option.
    """
    if auth is _REQUIRED:
        raise ConfigurationError(
            "create_app needs auth=: a hook, basic_auth(user, password), or auth=None for a "
            "dashboard that is protected by something else"
        )
    if auth is not None and not callable(auth):
        raise ConfigurationError(f"auth must be a callable or None, got {auth!r}")
    if poll_seconds < 0.5:
        raise ConfigurationError(f"poll_seconds must be >= 0.5, got {poll_seconds!r}")
    names = None
    if queues is not None:
        from aioqueue._model.checks import check_name

        names = tuple(check_name("queue name", q) for q in queues)
    d = Dashboard(
        app,
        read_only=read_only,
        queues=names,
        secret=secret,
        title=title,
        poll_seconds=poll_seconds,
    )
    return build(d, auth, None if allowed_hosts is None else list(allowed_hosts))
