"""``python -m aioqueue health``: is a queue served? For probes, monitors and scripts.

Exit 0 when the server answers and at least one live worker is registered on the queue (its
heartbeats on time, ``Queue.workers()``); 1 otherwise (server unreachable within
``--timeout``, refused, or no live worker); 2 for a bad command line. One line of status on
stdout, or one JSON object with ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
from typing import Any

import redis.exceptions as rexc

from .._app.app import App
from .._model.exceptions import AioQueueError
from .admin import name_arg, server_args
from .format import echo, error

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def add_health(sub: Any) -> None:
    """Add the ``health`` command to the ``python -m aioqueue`` subparsers ``sub``."""
    what = "exit 0 if the server answers and a live worker consumes the queue, else 1"
    p: argparse.ArgumentParser = sub.add_parser("health", help=what, description=what)
    server_args(p)
    p.add_argument(
        "-q", "--queue", type=name_arg("queue name"), default="default", help="queue (default)"
    )
    p.add_argument(
        "--timeout", type=_timeout, default=5.0, help="seconds to get an answer in all (5)"
    )
    p.add_argument("--json", action="store_true", help="one JSON object instead of a line")


def health(args: argparse.Namespace) -> int:
    """Run ``health``; the exit code."""
    try:
        app = App(args.url, prefix=args.prefix)
    except AioQueueError as exc:
        error(exc)
        return EXIT_USAGE
    status = asyncio.run(_status(app, args.queue, args.timeout))
    if args.json:
        echo(json.dumps(status))
    else:
        echo(_line(status))
    return EXIT_OK if status["healthy"] else EXIT_ERROR


async def _status(app: App, queue: str, timeout: float) -> dict[str, Any]:
    status: dict[str, Any] = {
        "healthy": False,
        "queue": queue,
        "server": False,
        "live_workers": 0,
        "registered_workers": 0,
        "error": None,
    }
    try:
        async with asyncio.timeout(timeout), app:
            status["server"] = True
            found = await app.queue(queue).workers()
    except TimeoutError:
        status["error"] = f"no answer from the server within {timeout:g} s"
        return status
    except (AioQueueError, rexc.RedisError, OSError) as exc:
        status["error"] = f"{type(exc).__name__}: {exc}"
        return status
    live = sum(1 for w in found if w.alive)
    status.update(live_workers=live, registered_workers=len(found), healthy=live > 0)
    return status


def _line(status: dict[str, Any]) -> str:
    queue = status["queue"]
    if status["error"] is not None:
        return f"unhealthy: {status['error']}"
    live, registered = status["live_workers"], status["registered_workers"]
    if live:
        return f"ok: {live} live worker(s) on queue {queue!r} ({registered} registered)"
    return f"unhealthy: no live worker on queue {queue!r} ({registered} registered)"
