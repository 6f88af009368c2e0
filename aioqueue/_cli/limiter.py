"""``python -m aioqueue limiter APP NAME``: show a named limiter's state (one key of it), or
change its settings at run time for every worker (docs/flow-control.md).

    python -m aioqueue limiter myproject.jobs:app stripe [--key K] [-q QUEUE]
        [--rate N/SECONDS] [--burst B] [--concurrency C] [--reset] [--json]

The App module declares the limiter (``app.limiter``); ``--url``/``--prefix`` override its
server and prefix. Exits 0, 1 when the server fails or the App has no such limiter, 2 on a
bad command line.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from typing import Any

from .._app.app import App
from .._app.limiters import LimiterState, declared
from .._model.exceptions import AioQueueError
from .admin import server_args
from .format import echo, emit_json, error
from .load import EXIT_ERROR, EXIT_OK, load_app_args


def _rate(text: str) -> tuple[int, float]:
    """``N/SECONDS`` (``100/1``, ``5/0.5``) or ``N`` (per second)."""
    n, _, per = text.partition("/")
    try:
        return int(n), float(per or "1")
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N/SECONDS, got {text!r}") from None


def add_limit(sub: Any) -> None:
    """Add the ``limiter`` command to the ``python -m aioqueue`` subparsers ``sub``."""
    what = "show a named limiter's state, or change its settings for every worker"
    p: argparse.ArgumentParser = sub.add_parser("limiter", help=what, description=what)
    p.add_argument("app", metavar="APP", help="the App that declares it, as module:attribute")
    p.add_argument("name", metavar="NAME", help="the limiter's name")
    server_args(p)
    p.set_defaults(prefix=None)
    p.add_argument("--key", default="", help="the key of a keyed limiter")
    p.add_argument("-q", "--queue", help="the queue whose waiting jobs to count (the App's)")
    p.add_argument("--rate", type=_rate, help="N/SECONDS: at most N starts per SECONDS")
    p.add_argument("--burst", type=int, help="at most this many starts at once")
    p.add_argument("--concurrency", type=int, help="at most this many running at once")
    p.add_argument("--reset", action="store_true", help="back to the settings declared in code")
    p.add_argument("--json", action="store_true", help="one JSON object instead of lines")


def limit_command(args: argparse.Namespace) -> int:
    """Run ``limiter``; the exit code."""
    app = load_app_args(args)
    try:
        state = asyncio.run(_limit(app, args))
    except AioQueueError as exc:
        error(exc)
        return EXIT_ERROR
    if args.json:
        emit_json(dataclasses.asdict(state))
        return EXIT_OK
    lim = app.limiters[state.name]
    rate = f"{lim.rate[0]}/{lim.rate[1]:g}s" if lim.rate else "none"
    echo(
        f"{state.name} key={state.key!r}: declared rate {rate}, burst {lim.burst}, "
        f"concurrency {lim.concurrency or 'none'}; run-time settings {state.overrides or 'none'}"
    )
    tokens = "unknown (unused)" if state.tokens is None else str(state.tokens)
    wait = max(state.next_admit_ms - state.now_ms, 0)
    echo(
        f"  tokens now {tokens}, next start in {wait} ms (TAT {state.tat_ms}), "
        f"{state.holders} running, {state.waiting} waiting in {args.queue or app.default_queue}"
    )
    return EXIT_OK


async def _limit(app: App, args: argparse.Namespace) -> LimiterState:
    declared(app, args.name)  # the App must declare it (its settings are in code)
    async with app:
        if args.reset or args.rate or args.burst is not None or args.concurrency is not None:
            await app.limiters.set(
                args.name,
                rate=args.rate,
                burst=args.burst,
                concurrency=args.concurrency,
                reset=args.reset,
                queue=args.queue,
            )
        return await app.limiters.state(args.name, args.key, queue=args.queue)
