"""``python -m aioqueue metrics --port P``: the queue exporter, one Prometheus scrape target
for the whole system (``aioqueue.metrics.QueueCollector``: every queue's depths, groups, oldest
job, dead letters, workers, pauses, read when scraped). Runs until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from typing import Any

from .._app.app import App
from .._model.exceptions import AioQueueError, ServerUnavailable
from .._model.safetext import EscapingFormatter
from .admin import queues_arg, server_args
from .format import error

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
logger = logging.getLogger("aioqueue.cli")


def add_metrics(sub: Any) -> None:
    """Add the ``metrics`` command to the ``python -m aioqueue`` subparsers ``sub``."""
    what = "serve the queues' Prometheus metrics on GET /metrics (needs aioqueue[metrics])"
    p: argparse.ArgumentParser = sub.add_parser("metrics", help=what, description=what)
    server_args(p)
    queues_arg(p, "queue to report")
    p.add_argument("--port", type=int, default=9808, help="port to listen on (9808)")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (0.0.0.0)")
    p.add_argument(
        "--max-groups",
        type=int,
        default=20,
        help="group series per queue: the largest backlogs, the rest summed (20)",
    )


def run_metrics(args: argparse.Namespace) -> int:
    """Run the exporter until a signal; the exit code."""
    handler = logging.StreamHandler()
    handler.setFormatter(EscapingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level="INFO", handlers=[handler])
    if not 0 <= args.port <= 65535 or args.max_groups < 0:
        error("--port must be 0-65535 and --max-groups >= 0")
        return EXIT_USAGE
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        error("metrics needs prometheus-client: pip install 'aioqueue[metrics]'")
        return EXIT_USAGE
    try:
        app = App(args.url, prefix=args.prefix)
    except AioQueueError as exc:
        error(f"{exc}")
        return EXIT_USAGE
    try:
        return asyncio.run(_serve(app, args))
    except KeyboardInterrupt:
        return EXIT_OK


async def _serve(app: App, args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry

    from ..metrics import QueueCollector, serve

    async def refresh() -> None:
        # the server may be away at start, or go away: each scrape connects if it has to, and
        # a scrape that cannot read the queues answers 503 (serve), so Prometheus records the
        # target down instead of the exporter exiting
        await app.open()
        await collector.refresh()

    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(app.aclose)
        try:
            await app.open()
        except ServerUnavailable as exc:
            logger.warning("%s; serving 503 until it can be reached", exc)
        collector = QueueCollector(app, args.queues, max_groups=args.max_groups)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        try:
            server = await serve(registry, args.port, args.host, before=refresh)
        except OSError as exc:
            error(f"cannot serve --port {args.port}: {exc}")
            return EXIT_ERROR
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            server.close()
        logger.info("metrics exporter stopped")
    return EXIT_OK
