"""``python -m aioqueue events``: switch a queue's event stream on or off, show its setting,
or follow it (``tail``: one line per event, or JSON lines).

    python -m aioqueue events on QUEUE [--maxlen N]
    python -m aioqueue events off QUEUE
    python -m aioqueue events status QUEUE
    python -m aioqueue events tail QUEUE [--since POS] [--kind K ...] [--count N] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from typing import Any

from .._app.app import App
from .._model.exceptions import AioQueueError
from .._model.safetext import escape
from .._queue.events import DEFAULT_EVENTS_MAXLEN, JobEvent, JobEventKind
from .admin import name_arg, server_args
from .format import echo, error

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def add_events(sub: Any) -> None:
    """Add the ``events`` command to the ``python -m aioqueue`` subparsers ``sub``."""
    what = "switch a queue's job events on or off, or follow them"
    p: argparse.ArgumentParser = sub.add_parser("events", help=what, description=what)
    p.add_argument("action", choices=("on", "off", "status", "tail"))
    p.add_argument("queue", type=name_arg("queue name"))
    server_args(p)
    p.add_argument(
        "--maxlen",
        type=_positive,
        default=DEFAULT_EVENTS_MAXLEN,
        help=f"on: keep about the newest N events ({DEFAULT_EVENTS_MAXLEN:,})",
    )
    p.add_argument(
        "--since", default="$", help='tail: "$" new events (default), "0" all kept, a position'
    )
    p.add_argument(
        "--kind",
        action="append",
        dest="kinds",
        choices=[k.value for k in JobEventKind],
        help="tail: only this kind (repeatable)",
    )
    p.add_argument("--count", type=_positive, help="tail: stop after N events")
    p.add_argument("--json", action="store_true", help="tail: JSON lines")


def _as_json(e: JobEvent) -> str:
    return json.dumps(
        {
            "position": e.position,
            "at": e.at.isoformat(),
            "kind": e.kind.value,
            "job_id": e.job_id,
            "task": e.task,
            "attempt": e.attempt,
            "worker": e.worker,
            "reason": e.reason,
            "due": e.due.isoformat() if e.due else None,
        }
    )


def _line(e: JobEvent) -> str:
    parts = [e.at.isoformat(timespec="milliseconds"), e.kind.value, e.job_id or "-"]
    parts += [e.task or "-", str(e.attempt) if e.attempt is not None else "-", e.worker or "-"]
    if e.due:
        parts.append(f"due={e.due.isoformat(timespec='milliseconds')}")
    if e.reason:
        parts.append(e.reason)
    return escape("  ".join(parts))


async def _run(app: App, args: argparse.Namespace) -> int:
    async with app:
        q = app.queue(args.queue)
        if args.action == "on":
            await q.set_events(args.maxlen)
        elif args.action == "off":
            await q.set_events(None)
        if args.action != "tail":
            cap = await q.events_maxlen()
            echo(f"events of {args.queue}: " + (f"on, about {cap:,} kept" if cap else "off"))
            return EXIT_OK
        n = 0
        it = app.events(args.queue, since=args.since, kinds=args.kinds)
        try:
            async for event in it:
                echo(_as_json(event) if args.json else _line(event))
                n += 1
                if args.count and n >= args.count:
                    break
        finally:
            await it.aclose()  # type: ignore[attr-defined]
        return EXIT_OK


def events(args: argparse.Namespace) -> int:
    """Run ``events``; the exit code."""
    try:
        app = App(args.url, prefix=args.prefix)
        with contextlib.suppress(KeyboardInterrupt):
            return asyncio.run(_run(app, args))
        return EXIT_OK
    except AioQueueError as exc:
        error(exc)
        return EXIT_ERROR
