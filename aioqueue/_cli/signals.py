"""The signal and change commands of ``python -m aioqueue``: ``signal KEY`` wakes the jobs
waiting for an event (``ctx.wait_for_event``), ``change ID`` changes a job that has not
started (``Job.change``)."""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any

from .._app.app import App
from .format import echo, emit_json

#: refuses an action on a queue whose workers sign when the command has no key
SigningCheck = Callable[[App, str, str], Awaitable[None]]


def add_signal_commands(
    command: Callable[..., argparse.ArgumentParser], check_signing: SigningCheck
) -> None:
    """Add ``signal`` and ``change`` with the admin commands' ``command`` (server, signing
    and queue options); ``check_signing`` refuses to signal unsigned to signing workers."""
    signal = functools.partial(_signal, check_signing)
    p = command("signal", "wake the jobs waiting for event KEY, with a payload", signal)
    p.add_argument("key", metavar="KEY")
    p.add_argument("--payload", type=_json, default=None, help="JSON value (default null)")
    p = command("change", "change a queued or scheduled job: priority, when it runs", _change)
    p.add_argument("id", metavar="ID")
    p.add_argument("--priority", type=int, help="-100..100, higher first")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--delay", type=float, help="run it this many seconds from now")
    when.add_argument("--at", type=float, help="run it at this time (POSIX seconds)")


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON {text!r}: {exc}") from None


async def _signal(check_signing: SigningCheck, app: App, args: argparse.Namespace) -> int:
    await check_signing(app, args.queue, "signal")
    woken = await app.signal(args.key, args.payload, queue=args.queue)
    if args.json:
        emit_json({"queue": args.queue, "key": args.key, "woken": woken})
    else:
        echo(f"signal: {woken} jobs woken ({args.queue})")
    return 0


async def _change(app: App, args: argparse.Namespace) -> int:
    job = app.queue(args.queue).job(args.id)
    state = await job.change(priority=args.priority, delay=args.delay, at=args.at)
    if args.json:
        emit_json({"queue": args.queue, "id": args.id, "state": state.value})
    else:
        echo(f"change: job {args.id} is {state.value} ({args.queue})")
    return 0
