"""``python -m aioqueue rekey APP``: sign and encrypt again, with the first key of the App's
``signing_key`` and ``encryption_key`` lists, every stored payload and result sealed with
another listed key (``Queue.rekey``, docs/security.md "Encryption at rest and key rotation").

    python -m aioqueue rekey myproject.jobs:app [-q QUEUE ...] [--batch N] [--json]

The App module gives the keys (as the workers have them); ``--url``/``--prefix`` override its
server and prefix. Without ``-q``: every queue under the prefix. Exits 0 when every value
read is now sealed with the first keys, 1 when some could not be read (tampered, or sealed
with a key no longer listed: they are counted and named) or changed meanwhile, 2 on a bad
command line.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from typing import Any

from .._app.app import App
from .._model.exceptions import AioQueueError
from .._queue.rekey import RekeyReport
from .._store.loader import queue_names
from .admin import queues_arg, server_args
from .format import echo, emit_json

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def add_rekey(sub: Any) -> None:
    """Add the ``rekey`` command to the ``python -m aioqueue`` subparsers ``sub``."""
    what = "sign and encrypt stored jobs and results again with the first of the App's keys"
    p: argparse.ArgumentParser = sub.add_parser("rekey", help=what, description=what)
    p.add_argument("app", metavar="APP", help="the App with its keys, as module:attribute")
    server_args(p)
    p.set_defaults(prefix=None)
    queues_arg(p)
    p.add_argument("--batch", type=int, default=200, help="records read per step (200)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of lines")


def rekey_command(args: argparse.Namespace) -> int:
    """Run ``rekey``; the exit code."""
    from .load import load_app

    app = load_app(args.app)
    if args.url:
        app.url = args.url
    if args.prefix:
        app.prefix = args.prefix
    try:
        reports = asyncio.run(_rekey(app, args.queues, args.batch))
    except AioQueueError as exc:
        print(f"aioqueue: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    clean = all(not r.unreadable and not r.changed for r in reports)
    if args.json:
        emit_json({"queues": [dataclasses.asdict(r) for r in reports]})
        return EXIT_OK if clean else EXIT_ERROR
    for r in reports:
        echo(
            f"{r.queue}: {r.jobs} jobs; sealed again: {r.payloads} payloads, {r.results} "
            f"results, {r.batch_results} batch results; {r.current} already current, "
            f"{r.changed} changed meanwhile, {r.unreadable} unreadable"
        )
        for reason in r.reasons:
            echo(f"  {reason}")
    return EXIT_OK if clean else EXIT_ERROR


async def _rekey(app: App, queues: list[str] | None, batch: int) -> list[RekeyReport]:
    async with app:
        names = queues or await queue_names(app.redis, app.prefix)
        return [await app.queue(name).rekey(batch=batch) for name in names]
