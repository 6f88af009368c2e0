"""``python -m aioqueue``: run workers, and list periodic schedules, from the command line
(the operator's commands, such as ``info``, ``dead`` and ``retry``, are in ``_cli_admin``).

Every failure ends in one line on stderr and an exit code, never a traceback: 2 for what the
command line alone shows to be wrong (a bad option value, a bad URL), 1 for what fails at run
time (the App cannot be imported, the server refuses the credentials or a command, or it
cannot be reached within ``--connect-timeout``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import random
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import redis.exceptions as rexc

from .._app.app import App
from .._app.logs import configure as configure_logging
from .._model.checks import check_name
from .._model.exceptions import (
    AioQueueError,
    ConfigurationError,
    EmbeddedServerError,
    ServerUnavailable,
)
from .._version import __version__
from .._worker.weights import cli_queues, queue_arg, split_weight
from .admin import add_commands, embedded_server, server_args
from .admin import run as run_admin
from .dashboard import add_dashboard, dashboard
from .events import add_events, events
from .format import error
from .health import add_health, health
from .isolation import add_isolation, isolation_of
from .limiter import add_limit, limit_command
from .load import EXIT_ERROR, EXIT_OK, EXIT_USAGE, load_app
from .metrics import add_metrics, run_metrics
from .parser import Parser
from .rekey import add_rekey, rekey_command

if TYPE_CHECKING:
    from .._store.embedded import DevServer

logger = logging.getLogger("aioqueue.cli")

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: the first and the longest pause between two attempts to reach the server at startup
CONNECT_BACKOFF = (0.1, 5.0)


# --------------------------------------------------------------------- option values
def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def _queue_name(text: str) -> str:
    try:
        return check_name("queue name", text)
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _log_level(text: str) -> str:
    level = text.upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(LOG_LEVELS)}, got {text!r}")
    return level


def _parser(worker_only: bool = False) -> Parser:
    """The command line's parser; ``worker_only``: with the worker command alone (a worker
    starting needs no other: building them all costs its start about 10 ms)."""
    version = f"aioqueue {__version__}"
    p = Parser(
        prog="python -m aioqueue", description="aioqueue: an asyncio job queue on Redis/Valkey."
    )
    p.add_argument("--version", action="version", version=version)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    w = sub.add_parser(
        "worker",
        help="run a worker",
        description="Run a worker for the tasks of an App. SIGTERM/SIGINT stop it gracefully "
        "(running jobs get --grace seconds, then go back to the queue); a second signal stops "
        "it at once, and the leases bring any unfinished jobs back.",
    )
    p.worker = w
    w.add_argument("--version", action="version", version=version)
    w.add_argument("app", metavar="MODULE:APP", help="the App to run, e.g. myproject.jobs:app")
    w.add_argument(
        "-q",
        "--queue",
        action="append",
        dest="queues",
        type=queue_arg,
        help="queue to consume, NAME or NAME:WEIGHT (repeatable; default: the App's default)",
    )
    w.add_argument("--strict", action="store_true", help="serve the queues in the order given")
    w.add_argument("-c", "--concurrency", type=int, default=100, help="jobs at once (100)")
    w.add_argument(
        "--prefetch",
        type=int,
        default=None,
        help="jobs leased ahead of free slots (default: concurrency/10, at most 100; 0: none)",
    )
    w.add_argument("--burst", action="store_true", help="exit once the queues are empty")
    w.add_argument(
        "--no-scheduler",
        action="store_true",
        help="do not fire the queues' periodic schedules (another worker must)",
    )
    w.add_argument("--grace", type=_seconds, default=30.0, help="shutdown grace in seconds (30)")
    w.add_argument(
        "--unknown-task-grace",
        type=_seconds,
        default=60.0,
        help="seconds a job of a task this worker does not know is handed back for another "
        "worker before it is dead-lettered as UnknownTask (60; 0: at once)",
    )
    w.add_argument(
        "--connect-timeout",
        type=_seconds,
        default=60.0,
        help="seconds to keep retrying, with backoff, a server that is down or loading its "
        "data at startup (60; 0: try once)",
    )
    w.add_argument("--url", help="Redis URL (overrides the App's and $AIOQUEUE_REDIS_URL)")
    w.add_argument(
        "--embedded",
        action="store_true",
        help="use the embedded Valkey server (started in ./.aioqueue if none is running)",
    )
    w.add_argument("--log-level", type=_log_level, default="INFO", help="DEBUG, INFO... (INFO)")
    w.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="text lines, or one JSON object per line; both carry the job's id, task, queue "
        "and attempt on lines logged while a job runs (text)",
    )
    w.add_argument("--no-uvloop", action="store_true", help="use asyncio's own event loop")
    w.add_argument(
        "--processes",
        type=int,
        default=1,
        help="worker processes, under a supervisor that restarts one that dies (1: no supervisor)",
    )
    w.add_argument(
        "--health-port",
        type=int,
        default=None,
        help="serve GET /healthz on this port (200 while the worker is alive, else 503); "
        "with --processes N, process i serves port+i",
    )
    w.add_argument("--health-host", default="0.0.0.0", help="address of --health-port (0.0.0.0)")
    w.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve the worker's Prometheus metrics on GET /metrics on this port (needs "
        "aioqueue[metrics]); with --processes N, process i serves port+i",
    )
    w.add_argument("--metrics-host", default="0.0.0.0", help="address of --metrics-port (0.0.0.0)")
    w.add_argument(
        "--reload",
        action="store_true",
        help="restart the worker when a .py file under the App's directory changes "
        "(development; needs aioqueue[reload])",
    )
    add_isolation(w)
    if worker_only:
        return p
    s = sub.add_parser(
        "schedules",
        help="list periodic schedules and their next runs",
        description="List the periodic schedules stored under a key prefix, with their next "
        "runs (declared in code by the workers that run them, or added at run time).",
    )
    server_args(s)
    s.add_argument(
        "-q",
        "--queue",
        action="append",
        dest="queues",
        type=_queue_name,
        help="only this queue (repeatable; default: every queue that has schedules)",
    )
    s.add_argument("--json", action="store_true", help="one JSON array instead of a table")
    add_commands(sub)
    add_health(sub)
    add_metrics(sub)
    add_dashboard(sub)
    add_events(sub)
    add_rekey(sub)
    add_limit(sub)
    return p


# --------------------------------------------------------------------- the worker command
def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); the exit code.

    A reader that goes away (``aioqueue jobs queued --json | head -1``) ends the command
    quietly, with exit code 0, as a pager or ``head`` expects."""
    try:
        code = _main(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        # stdout's reader is gone: no traceback, and nothing more to flush at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_OK
    return code


def _main(argv: Sequence[str] | None) -> int:
    given = sys.argv[1:] if argv is None else list(argv)
    parser = _parser(worker_only=given[:1] == ["worker"])
    args = parser.parse_args(given)
    if args.command == "worker":
        return _worker_command(parser, args)
    try:
        with embedded_server(args):
            return _operator_command(args)
    except EmbeddedServerError as exc:
        error(exc)
        return EXIT_ERROR


def _operator_command(args: argparse.Namespace) -> int:
    """Run one of the commands that are not ``worker``."""
    if args.command == "schedules":
        from .schedules import list_schedules

        return list_schedules(args.url, args.prefix, args.queues, as_json=args.json)
    own = (health, run_metrics, dashboard, events, rekey_command, limit_command)
    names = ("health", "metrics", "dashboard", "events", "rekey", "limiter")
    command = dict(zip(names, own, strict=True)).get(args.command)
    # else one of the operator's commands of _cli_admin (is_admin)
    return run_admin(args) if command is None else command(args)


def _worker_command(parser: Parser, args: argparse.Namespace) -> int:
    _check_args(parser, args)
    configure_logging(args.log_level, args.log_format)
    app = load_app(args.app)
    try:
        embedded = _choose_server(app, args)
    except AioQueueError as exc:
        error(exc)
        return EXIT_ERROR if args.embedded else EXIT_USAGE  # a server that failed, or a bad URL
    if args.processes > 1 or args.reload:
        from .supervisor import supervise

        try:
            url = app.url if args.embedded else None
            return supervise(_worker_parser(parser), args, url, args.app)
        finally:
            if embedded is not None:
                embedded.detach()
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
    except (AioQueueError, rexc.RedisError) as exc:
        # whatever the worker does not handle itself ends in one line too
        error(f"{type(exc).__name__}: {exc}")
        return EXIT_ERROR
    finally:
        if embedded is not None:
            embedded.detach()


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse (exit 2) what argparse's types do not: ranges, a queue given twice."""
    for option, value, low in (
        ("--concurrency", args.concurrency, 1),
        ("--prefetch", args.prefetch, 0),
        ("--processes", args.processes, 1),
        ("--health-port", args.health_port, 0),
        ("--metrics-port", args.metrics_port, 0),
    ):
        if value is not None and value < low:
            parser.error(f"{option} must be >= {low}, got {value}")
    if args.queues and len({split_weight(q)[0] for q in args.queues}) != len(args.queues):
        parser.error(f"argument -q/--queue: a queue is listed twice: {args.queues}")
    if args.health_port is not None and args.health_port + args.processes - 1 > 65535:
        parser.error(f"--health-port must be <= {65536 - args.processes}, got {args.health_port}")
    if args.metrics_port is not None and args.metrics_port + args.processes - 1 > 65535:
        parser.error(f"--metrics-port must be <= {65536 - args.processes}, got {args.metrics_port}")
    if args.metrics_port is not None:
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            parser.error("--metrics-port needs prometheus-client: pip install 'aioqueue[metrics]'")
    if args.reload:
        try:
            import watchfiles  # noqa: F401
        except ImportError:
            parser.error("--reload needs watchfiles: pip install 'aioqueue[reload]'")


def _worker_parser(parser: Parser) -> Parser:
    """The ``worker`` subcommand's parser (the supervisor rebuilds its workers' command
    lines from its options)."""
    if parser.worker is None:
        raise AssertionError("no worker command")
    return parser.worker


def _choose_server(app: App, args: argparse.Namespace) -> DevServer | None:
    """Point ``app`` at ``--embedded``'s server (returned: detach it at exit) or ``--url``.

    Raises:
        EmbeddedServerError: the embedded server cannot be started.
        ConfigurationError: ``--url`` is invalid.
    """
    if args.embedded:
        from .._store.embedded import attach_or_start

        embedded = attach_or_start()
        app.url = embedded.url
        return embedded
    if args.url:
        from .._store.connect import resolve_url

        app.url = resolve_url(args.url)
    return None


def warn_unconsumed_queues(app: App, queues: Sequence[str]) -> None:
    """Log a WARNING for each queue the App's tasks are sent to that ``queues`` leaves out:
    their jobs would wait for another worker."""
    missed: dict[str, list[str]] = {}
    for name, task in sorted(app.tasks.items()):
        queue = task.queue or app.default_queue
        if queue not in queues:
            missed.setdefault(queue, []).append(name)
    for queue, names in missed.items():
        logger.warning(
            "queue %r is not consumed by this worker (it consumes %s): tasks %s wait for a "
            "worker started with -q %s",
            queue,
            ", ".join(queues),
            ", ".join(names),
            queue,
        )


async def open_app(app: App, timeout: float) -> None:
    """``app.open()``, retried with exponential backoff and jitter while the server cannot be
    reached or is loading its data, for up to ``timeout`` seconds; each retry is logged.

    Raises:
        ConnectionError: still unreachable after ``timeout`` seconds.
        ConfigurationError: the server refused the credentials or a command (not retried).
    """
    deadline = time.monotonic() + timeout
    pause, longest = CONNECT_BACKOFF
    attempt = 1
    while True:
        try:
            await app.open()
            if attempt > 1:
                logger.info("connected on attempt %d", attempt)
            return
        except ServerUnavailable as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ServerUnavailable(f"{exc} (gave up after {timeout:g} s)") from exc
            wait = min(random.uniform(pause / 2, pause), left)
            logger.warning(
                "%s; retrying in %.1f s (attempt %d, giving up %.0f s from now)",
                exc,
                wait,
                attempt,
                left,
            )
            await asyncio.sleep(wait)
            pause = min(pause * 2, longest)
            attempt += 1


async def _run_worker(app: App, args: argparse.Namespace) -> int:
    from .._worker.worker import Worker

    try:
        await open_app(app, args.connect_timeout)
    except AioQueueError as exc:
        error(exc)
        return EXIT_ERROR
    metrics = None
    if args.metrics_port is not None:
        from ..metrics import WorkerMetrics

        metrics = WorkerMetrics()
    try:
        try:
            worker = Worker(
                app,
                queues=cli_queues(args.queues),
                strict=args.strict,
                concurrency=args.concurrency,
                burst=args.burst,
                grace=args.grace,
                prefetch=args.prefetch,
                scheduler=not args.no_scheduler,
                unknown_task_grace=args.unknown_task_grace,
                metrics=metrics,
                isolation=isolation_of(args),
            )
        except ConfigurationError as exc:
            error(exc)
            return EXIT_USAGE
        warn_unconsumed_queues(app, worker.queue_names)
        from .supervisor import stop_on_signals

        stop_on_signals(worker)
        health = None
        if args.health_port is not None:
            from .._worker.health import start_health_server

            try:
                health = await start_health_server(
                    lambda: worker.alive, args.health_host, args.health_port
                )
            except OSError as exc:
                error(f"cannot serve --health-port {args.health_port}: {exc}")
                return EXIT_ERROR
        exporter = None
        if metrics is not None:
            from ..metrics import serve

            try:
                exporter = await serve(metrics.registry, args.metrics_port, args.metrics_host)
            except OSError as exc:
                error(f"cannot serve --metrics-port {args.metrics_port}: {exc}")
                return EXIT_ERROR
        from .supervisor import report_to_supervisor

        reporter = asyncio.create_task(report_to_supervisor(worker.ready, worker.stop))
        try:
            await worker.run()
        finally:
            reporter.cancel()
            if health is not None:
                health.close()
            if exporter is not None:
                exporter.close()
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
