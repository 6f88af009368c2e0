"""``python -m aioqueue dashboard``: serve the web dashboard (``aioqueue.dashboard``) under
uvicorn. It binds 127.0.0.1 unless told otherwise and refuses to start without credentials
(``--user``/``--password`` or ``$AIOQUEUE_DASHBOARD_USER``/``$AIOQUEUE_DASHBOARD_PASSWORD``;
``--viewer-user``/``--viewer-password`` add a read-only one) unless ``--no-auth`` says so
explicitly."""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from .._model.exceptions import AioQueueError
from .admin import open_args, queues_arg, server_args, signing_args
from .format import error

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def add_dashboard(sub: Any) -> None:
    """Add the ``dashboard`` command to the ``python -m aioqueue`` subparsers ``sub``."""
    what = "serve the web dashboard (needs aioqueue[dashboard])"
    p: argparse.ArgumentParser = sub.add_parser("dashboard", help=what, description=what)
    server_args(p)
    signing_args(p)
    queues_arg(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port to bind (8080)")
    p.add_argument(
        "--allowed-host",
        action="append",
        dest="allowed_hosts",
        default=[],
        metavar="HOST",
        help="a host name the Host header may name (repeatable; always allowed: the --host "
        "address and localhost; '*' any)",
    )
    p.add_argument("--read-only", action="store_true", help="no actions: view only")
    p.add_argument("--user", help="basic auth user (or $AIOQUEUE_DASHBOARD_USER)")
    p.add_argument("--password", help="basic auth password (or $AIOQUEUE_DASHBOARD_PASSWORD)")
    p.add_argument(
        "--viewer-user",
        help="a second, read-only user: sees everything, acts on nothing "
        "(or $AIOQUEUE_DASHBOARD_VIEWER_USER)",
    )
    p.add_argument(
        "--viewer-password",
        help="the read-only user's password (or $AIOQUEUE_DASHBOARD_VIEWER_PASSWORD)",
    )
    p.add_argument(
        "--no-auth",
        action="store_true",
        help="serve without authentication (only behind a proxy that authenticates)",
    )
    p.add_argument("--title", default="aioqueue", help="shown in the header (aioqueue)")


def _fail(message: str, code: int) -> int:
    error(message)
    return code


def dashboard(args: argparse.Namespace) -> int:
    """Run ``dashboard``; the exit code (when uvicorn stops)."""
    user = args.user or os.environ.get("AIOQUEUE_DASHBOARD_USER")
    password = args.password or os.environ.get("AIOQUEUE_DASHBOARD_PASSWORD")
    if args.no_auth and (user or password):
        return _fail("--no-auth and credentials exclude each other", EXIT_USAGE)
    if not args.no_auth and not (user and password):
        return _fail(
            "the dashboard needs credentials: --user and --password (or "
            "$AIOQUEUE_DASHBOARD_USER and $AIOQUEUE_DASHBOARD_PASSWORD), or --no-auth to "
            "serve it without authentication on purpose",
            EXIT_USAGE,
        )
    viewer_user = args.viewer_user or os.environ.get("AIOQUEUE_DASHBOARD_VIEWER_USER")
    viewer_pw = args.viewer_password or os.environ.get("AIOQUEUE_DASHBOARD_VIEWER_PASSWORD")
    if bool(viewer_user) != bool(viewer_pw) or (viewer_user and args.no_auth):
        return _fail("--viewer-user needs --viewer-password, and credentials", EXIT_USAGE)
    if not 0 <= args.port <= 65535:
        return _fail(f"--port must be 0-65535, got {args.port}", EXIT_USAGE)
    try:
        import uvicorn

        from ..dashboard import basic_auth, create_app
        from ..dashboard._security import local_hosts
    except ImportError as exc:
        return _fail(f"{exc}: pip install 'aioqueue[dashboard]'", EXIT_ERROR)
    try:
        app = open_args(args)
    except AioQueueError as exc:
        return _fail(str(exc), EXIT_USAGE)
    viewer = (str(viewer_user), str(viewer_pw)) if viewer_user else None
    try:
        auth = None if args.no_auth else basic_auth(str(user), str(password), viewer=viewer)
    except ValueError as exc:
        return _fail(str(exc), EXIT_USAGE)
    web = create_app(
        app,
        auth=auth,
        read_only=args.read_only,
        queues=args.queues,
        title=args.title,
        allowed_hosts=[*local_hosts(args.host), *args.allowed_hosts],
    )
    config = uvicorn.Config(web, host=args.host, port=args.port, log_level="info", lifespan="off")
    server = uvicorn.Server(config)

    async def serve() -> None:
        try:
            await app.open()
            await server.serve()
        finally:
            await app.aclose()

    try:
        asyncio.run(serve())
    except AioQueueError as exc:
        return _fail(f"{type(exc).__name__}: {exc}", EXIT_ERROR)
    except KeyboardInterrupt:
        return EXIT_OK
    return EXIT_OK
