"""``python -m aioqueue``: run workers from the command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from ._app import App
from ._exceptions import AioQueueError
from ._version import __version__

logger = logging.getLogger("aioqueue.cli")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2


def load_app(target: str) -> App:
    """Import ``module:attribute`` (or ``module.attribute``) and return the App it names.

    Raises:
        SystemExit(1) with a clear message for an import error, a missing attribute, or an
        object that is not an App.
    """
    if ":" in target:
        module_name, _, attr = target.partition(":")
    else:
        module_name, _, attr = target.rpartition(".")
    if not module_name or not attr:
        _die(f"expected module:app (e.g. myproject.jobs:app), got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        _die(f"cannot import module {module_name!r}: {exc}")
    if not hasattr(module, attr):
        _die(f"module {module_name!r} has no attribute {attr!r}")
    obj = getattr(module, attr)
    if not isinstance(obj, App):
        _die(f"{target!r} is a {type(obj).__name__}, not an aioqueue.App")
    return obj


def _die(message: str) -> NoReturn:
    print(f"aioqueue: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_ERROR)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m aioqueue", description="aioqueue: an asyncio job queue on Redis/Valkey."
    )
    p.add_argument("--version", action="version", version=f"aioqueue {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    w = sub.add_parser(
        "worker",
        help="run a worker",
        description="Run a worker for the tasks of an App. SIGTERM/SIGINT stop it gracefully "
        "(running jobs get --grace seconds, then go back to the queue); a second signal stops "
        "it at once, and the leases bring any unfinished jobs back.",
    )
    w.add_argument("app", metavar="MODULE:APP", help="the App to run, e.g. myproject.jobs:app")
    w.add_argument(
        "-q",
        "--queue",
        action="append",
        dest="queues",
        help="queue to consume (repeatable; default: the App's default queue)",
    )
    w.add_argument("-c", "--concurrency", type=int, default=100, help="jobs at once (default 100)")
    w.add_argument(
        "--prefetch",
        type=int,
        default=None,
        help="jobs leased ahead of free slots (default: concurrency/10, at most 100; 0: none)",
    )
    w.add_argument("--burst", action="store_true", help="exit once the queues are empty")
    w.add_argument("--grace", type=float, default=30.0, help="shutdown grace in seconds (30)")
    w.add_argument("--url", help="Redis URL (overrides the App's and $AIOQUEUE_REDIS_URL)")
    w.add_argument(
        "--embedded",
        action="store_true",
        help="use the embedded Valkey server (started in ./.aioqueue if none is running)",
    )
    w.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING... (INFO)")
    w.add_argument("--no-uvloop", action="store_true", help="use asyncio's own event loop")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.concurrency < 1:
        print("aioqueue: error: --concurrency must be >= 1", file=sys.stderr)
        return EXIT_USAGE
    app = load_app(args.app)
    embedded = None
    if args.embedded:
        from ._embedded import attach_or_start

        try:
            embedded = attach_or_start()
        except AioQueueError as exc:
            print(f"aioqueue: error: {exc}", file=sys.stderr)
            return EXIT_ERROR
        app.url = embedded.url
    elif args.url:
        from ._app import resolve_url

        try:
            app.url = resolve_url(args.url)
        except AioQueueError as exc:
            print(f"aioqueue: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
    try:
        runner = _run_worker(app, args)
        if not args.no_uvloop:
            try:
                import uvloop

                return int(uvloop.run(runner))
            except ImportError:
                pass
        return asyncio.run(runner)
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        if embedded is not None:
            embedded.detach()


async def _run_worker(app: App, args: argparse.Namespace) -> int:
    from ._worker import Worker

    try:
        await app.open()
    except AioQueueError as exc:
        print(f"aioqueue: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    try:
        worker = Worker(
            app,
            queues=args.queues,
            concurrency=args.concurrency,
            burst=args.burst,
            grace=args.grace,
            prefetch=args.prefetch,
        )
        loop = asyncio.get_running_loop()
        signals = 0

        def on_signal(signame: str) -> None:
            nonlocal signals
            signals += 1
            if signals == 1:
                logger.info("%s: stopping (again to force)", signame)
                worker.stop()
            else:
                logger.warning("%s again: stopping now", signame)
                worker.stop(force=True)

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig.name)
        await worker.run()
        if worker.abandoned:
            # asyncio.run() would wait for those tasks forever: leave now, their leases
            # bring the jobs back
            with contextlib.suppress(Exception):
                await asyncio.wait_for(app.aclose(), 2.0)
            logging.shutdown()
            os._exit(EXIT_OK)
        return EXIT_OK
    finally:
        await app.aclose()
