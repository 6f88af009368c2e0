"""The operator's commands of ``python -m aioqueue``: ``info``, ``groups``, ``jobs``, ``job``,
``why``, ``dead``, ``retry``, ``purge``, ``cancel``, ``promote``, ``pause``, ``resume``, ``limit``,
``enqueue``.

Each takes ``--url``/``--embedded``, ``--prefix``, ``-q/--queue`` and ``--json``, talks to the
server through ``Queue``'s API (no App module needed), prints a table (or JSON) and exits 0; a
bad command line exits 2, a failure at run time (server unreachable, no such job) exits 1,
always with one line on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from .._app.app import App
from .._model.checks import check_name
from .._model.exceptions import AioQueueError, ConfigurationError, JobNotFound
from .._queue.tasktable import lookup
from .format import echo, emit_json, error
from .show import dead as show_dead
from .show import groups as show_groups
from .show import info as show_info
from .show import job as show_job
from .show import jobs as show_jobs
from .show import queue_of
from .show import why as show_why
from .show import workers as show_workers
from .signals import add_signal_commands
from .workflow import show_workflow

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
STATES = ("scheduled", "queued", "active", "failed", "completed", "cancelled")

Handler = Callable[[App, argparse.Namespace], Awaitable[int]]
HANDLERS: dict[str, Handler] = {}


class UsageError(Exception):
    """A command line that only the command can refuse (exit 2)."""


# --------------------------------------------------------------------- option values
def name_arg(kind: str) -> Callable[[str], str]:
    def check(text: str) -> str:
        try:
            return check_name(kind, text)
        except ConfigurationError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return check


def server_args(p: argparse.ArgumentParser) -> None:
    """Add the options naming the server and the key prefix: ``--url``, ``--embedded`` and
    ``--prefix``, the same for every command that talks to Redis (``--embedded`` is resolved
    into ``--url`` by :func:`embedded_server` before the command runs)."""
    p.add_argument("--url", help="Redis URL (default: $AIOQUEUE_REDIS_URL, else localhost)")
    p.add_argument(
        "--embedded",
        action="store_true",
        help="use the embedded development server (the one a `worker --embedded` runs, else "
        "one started for this command in ./.aioqueue)",
    )
    p.add_argument("--prefix", type=name_arg("key prefix"), default="aq", help="key prefix (aq)")


#: the environment variable the CLI and the dashboard read the signing key from
SIGNING_KEY_ENV = "AIOQUEUE_SIGNING_KEY"


def signing_args(p: argparse.ArgumentParser) -> None:
    """Add ``--signing-key``: the App's HMAC key (default ``$AIOQUEUE_SIGNING_KEY``)."""
    p.add_argument(
        "--signing-key",
        help=f"the workers' signing key (default: ${SIGNING_KEY_ENV}): jobs enqueued are "
        "signed with it, results are verified with it; enqueue and retry refuse without it "
        "when the queue's live workers sign",
    )


def open_args(args: argparse.Namespace) -> App:
    """The App a command line names: --url, --prefix and the signing key (if any)."""
    key = getattr(args, "signing_key", None) or os.environ.get(SIGNING_KEY_ENV) or None
    return App(args.url, prefix=args.prefix, signing_key=key)


async def check_signing(app: App, queue: str, action: str) -> None:
    """Refuse ``action`` on a queue whose live workers sign when this App has no key: they
    would dead-letter the job as BadSignature, however the command reported it.

    Raises:
        UsageError: no key, and a live worker of the queue signs.
    """
    if app.codec.signer is not None:
        return
    if any(w.alive and w.signs for w in await app.queue(queue).workers()):
        raise UsageError(
            f"the workers of queue {queue!r} sign their jobs: without the key they would "
            f"dead-letter it as BadSignature. Give --signing-key or ${SIGNING_KEY_ENV} "
            f"to {action}"
        )


def queues_arg(p: argparse.ArgumentParser, what: str = "only this queue") -> None:
    """Add ``-q/--queue`` (repeatable, into ``queues``; None: every queue under the prefix)."""
    p.add_argument(
        "-q",
        "--queue",
        action="append",
        dest="queues",
        type=name_arg("queue name"),
        help=f"{what} (repeatable; default: every queue under the prefix)",
    )


def _json_value(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"invalid JSON {text!r}: {exc}") from None
        if not isinstance(value, kind):
            raise argparse.ArgumentTypeError(f"expected a JSON {kind.__name__}, got {text!r}")
        return value

    return parse


def _number(low: float, integer: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            what = "an integer" if integer else "a number"
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not math.isfinite(value) or value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low:g}, got {text!r}")
        return value

    return parse


def _limit_value(text: str) -> int | None:
    if text.lower() == "none":
        return None
    return int(_number(1, integer=True)(text))


# --------------------------------------------------------------------- the parsers
def add_commands(sub: Any) -> None:
    """Add the admin commands to the ``python -m aioqueue`` subparsers ``sub``."""

    def command(name: str, help: str, handler: Handler) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help, description=help)
        server_args(p)
        signing_args(p)
        p.add_argument(
            "-q", "--queue", type=name_arg("queue name"), default="default", help="queue (default)"
        )
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        p.set_defaults(handler=handler)
        return p

    def filters(p: argparse.ArgumentParser, since: bool = False) -> None:
        p.add_argument("--task", help="only jobs of this task name")
        p.add_argument("--group", help="only jobs of this fairness group")
        if since:
            p.add_argument("--since", type=_number(0), help="died at or after (POSIX seconds)")

    def selection(p: argparse.ArgumentParser, verb: str, since: bool = False) -> None:
        p.add_argument("ids", nargs="*", metavar="ID", help=f"job ids to {verb}")
        filters(p, since)
        p.add_argument("--all", action="store_true", help=f"{verb} every matching job")

    p = command("info", "queues: counts, throughput, groups (every queue without -q)", show_info)
    p.set_defaults(queue=None)
    p = command("groups", "a queue's groups: queued, active, limits, paused", show_groups)
    p.add_argument("--limit", type=_number(1, integer=True), default=100, help="at most (100)")
    command(
        "workers", "the workers registered on a queue: what each is, its heartbeat", show_workers
    )
    p = command("jobs", "list the jobs in a state, a page at a time", show_jobs)
    p.add_argument("state", choices=STATES)
    filters(p)
    _paging(p)
    p = command("dead", "list dead letters, newest first, with their errors", show_dead)
    filters(p)
    _paging(p, order="--oldest-first")
    p = command("job", "everything stored about one job", show_job)
    p.add_argument("id", metavar="ID")
    p = command("why", "why a job is not running (every block, from the server)", show_why)
    p.add_argument("id", metavar="ID")
    command("workflow", "a workflow's steps as a tree, with their states", show_workflow)
    sub.choices["workflow"].add_argument("id", metavar="ID", help="the workflow's id (wf-...)")
    selection(command("retry", "requeue dead letters, attempts reset", _retry), "retry", True)
    p = command("purge", "delete jobs that are not running (asks first)", _purge)
    p.add_argument("ids", nargs="*", metavar="ID", help="job ids to delete")
    p.add_argument(
        "--state",
        choices=("queued", "scheduled", "failed", "completed", "cancelled"),
        help="jobs in this state",
    )
    filters(p, since=True)
    p.add_argument("--all", action="store_true", help="the whole queue: all but running jobs")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    p = command("cancel", "cancel queued, scheduled and running jobs", _cancel)
    selection(p, "cancel")
    p.add_argument("--state", choices=("queued", "scheduled", "active"), help="only this state")
    selection(command("promote", "run scheduled jobs now", _promote), "promote")
    for name, verb in (("pause", "stop handing out"), ("resume", "resume handing out")):
        p = command(name, f"{verb} the queue's jobs (or a group's)", _pause)
        p.add_argument("--group", help="only this group")
    p = command("limit", "set a group's concurrency and rate limits", _limit)
    p.add_argument("--group", help="the group (default: the default of every group)")
    for option, text in (("--concurrency", "jobs at once"), ("--rate", "jobs per --per seconds")):
        p.add_argument(
            option, type=_limit_value, default=argparse.SUPPRESS, help=text + ", or none"
        )
    p.add_argument("--per", type=_number(0.001), default=1.0, help="rate period seconds (1)")
    add_signal_commands(command, check_signing)
    p = command("enqueue", "enqueue a job by task name", _enqueue)
    p.add_argument("task", metavar="TASK")
    p.add_argument("--args", type=_json_value(list), default=[], help="JSON list")
    p.add_argument("--kwargs", type=_json_value(dict), default={}, help="JSON object")
    p.add_argument("--delay", type=_number(0), help="seconds")
    p.add_argument("--priority", type=_number(-100, integer=True), help="(the task's)")
    p.add_argument("--group", help="fairness group")
    p.add_argument("--job-id", help="the job's id (default: a new one)")
    p.add_argument("--max-attempts", type=_number(1, integer=True), help="(the task's)")
    p.add_argument("--force", action="store_true", help="even if no live worker knows TASK")


def _paging(p: argparse.ArgumentParser, order: str = "--newest-first") -> None:
    p.add_argument("--limit", type=_number(1, integer=True), default=50, help="per page (50)")
    p.add_argument("--cursor", help="the cursor printed under the previous page")
    p.add_argument(order, action="store_true", help="the other order")


def is_admin(args: argparse.Namespace) -> bool:
    """Whether the parsed command line is one of the commands added here (each sets its
    handler); other commands (``worker``, and any added elsewhere) are run by their own code."""
    return getattr(args, "handler", None) is not None


def run(args: argparse.Namespace) -> int:
    """Run an admin command; the exit code."""
    try:
        app = open_args(args)
    except AioQueueError as exc:
        return _fail(exc, EXIT_USAGE)
    try:
        return asyncio.run(_main(app, args))
    except KeyboardInterrupt:
        return EXIT_ERROR


@contextlib.contextmanager
def embedded_server(args: argparse.Namespace) -> Iterator[None]:
    """With ``--embedded``, point ``args.url`` at the development server for the command's
    whole life: the one already running on its port, or one started here and stopped on exit
    (the handle is held until then; a dropped handle would stop the server mid-command).

    Raises:
        EmbeddedServerError: the server cannot be started.
    """
    if not getattr(args, "embedded", False):
        yield
        return
    from .._store.embedded import attach_or_start

    server = attach_or_start()
    try:
        args.url = server.url
        yield
    finally:
        server.detach()


async def _main(app: App, args: argparse.Namespace) -> int:
    try:
        async with app:
            handler: Handler = args.handler
            return await handler(app, args)
    except UsageError as exc:
        return _fail(exc, EXIT_USAGE)
    except ConfigurationError as exc:
        return _fail(exc, EXIT_USAGE)
    except JobNotFound as exc:
        return _fail(exc, EXIT_ERROR)
    except AioQueueError as exc:
        return _fail(f"{type(exc).__name__}: {exc}", EXIT_ERROR)


def _fail(message: object, code: int) -> int:
    error(message)
    return code


def _done(args: argparse.Namespace, action: str, count: int, what: str) -> int:
    if args.json:
        emit_json({"queue": args.queue, "action": action, "count": count})
    else:
        echo(f"{action}: {count} {what} ({args.queue})")
    return EXIT_OK


# --------------------------------------------------------------------- acting
def _selector(args: argparse.Namespace, since: bool = False) -> dict[str, Any]:
    chosen = args.ids or args.all or args.task or args.group or (since and args.since)
    if not chosen:
        raise UsageError("give job ids, a filter (--task, --group) or --all")
    if args.ids and (args.all or args.task or args.group):
        raise UsageError("give job ids or filters, not both")
    sel: dict[str, Any] = {"task": args.task, "group": args.group, "all": args.all}
    if since:
        sel["since"] = args.since
    return sel


async def _retry(app: App, args: argparse.Namespace) -> int:
    q = queue_of(app, args)
    sel = _selector(args, since=True)
    await check_signing(app, q.name, "retry dead letters")
    n = await (q.requeue(args.ids) if args.ids else q.requeue(**sel))
    return _done(args, "retry", n, "dead letters requeued")


async def _promote(app: App, args: argparse.Namespace) -> int:
    q = queue_of(app, args)
    sel = _selector(args)
    n = await (q.promote(args.ids) if args.ids else q.promote(**sel))
    return _done(args, "promote", n, "scheduled jobs made runnable now")


async def _cancel(app: App, args: argparse.Namespace) -> int:
    q = queue_of(app, args)
    sel = _selector(args)
    n = await (q.cancel(args.ids) if args.ids else q.cancel(state=args.state, **sel))
    return _done(args, "cancel", n, "jobs cancelled or asked to stop")


async def _purge(app: App, args: argparse.Namespace) -> int:
    q = queue_of(app, args)
    if args.ids:
        if args.all or args.task or args.group or args.since is not None:
            raise UsageError("give job ids or a selection, not both")
        what = f"{len(args.ids)} job(s) by id"
    elif args.all:
        if args.state or args.task or args.group or args.since is not None:
            raise UsageError("--all purges the whole queue: give it no other selection")
        what = "every queued, scheduled and dead job"
    elif args.group and not args.state:
        args.state = "queued"
        what = f"the queued backlog of group {args.group!r}"
    elif args.state:
        what = f"{args.state} jobs" + "".join(
            f" {k}={v!r}" for k, v in (("task", args.task), ("group", args.group)) if v
        )
    else:
        raise UsageError("give job ids, --state STATE, --group GROUP or --all")
    if not args.yes and not _confirm(f"purge {what} of queue {args.queue!r}?"):
        return _fail("not confirmed; nothing purged (use --yes to skip the question)", EXIT_ERROR)
    if args.ids:
        n = await q.purge(job_ids=args.ids)
    elif args.all:
        counts = await q.purge_queue()
        if args.json:
            emit_json(
                {
                    "queue": args.queue,
                    "action": "purge",
                    "count": sum(counts.values()),
                    "by_state": counts,
                }
            )
        else:
            echo(
                f"purge: {sum(counts.values())} jobs deleted ({args.queue}): "
                + ", ".join(f"{k} {v}" for k, v in counts.items())
            )
        return EXIT_OK
    else:
        n = await q.purge(args.state, task=args.task, group=args.group, since=args.since)
    return _done(args, "purge", n, "jobs deleted")


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        raise UsageError(f"{question} cannot be asked: stdin is not a terminal; pass --yes")
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")


async def _pause(app: App, args: argparse.Namespace) -> int:
    q = queue_of(app, args)
    if args.command == "pause":
        await q.pause(args.group)
    else:
        await q.resume(args.group)
    target = f"group {args.group!r} of {args.queue}" if args.group else args.queue
    if args.json:
        emit_json({"queue": args.queue, "action": args.command, "group": args.group})
    else:
        echo(f"{args.command}d: {target}")
    return EXIT_OK


async def _limit(app: App, args: argparse.Namespace) -> int:
    q = queue_of(app, args)
    if not _given(args):
        raise UsageError("give --concurrency K and/or --rate N [--per SECONDS] ('none' clears)")
    if "concurrency" in _given(args):
        await q.set_group_limit(args.group, args.concurrency)
    if "rate" in _given(args):
        if args.group is None:
            await q.set_default_group_rate_limit(args.rate, args.per)
        else:
            await q.set_rate_limit(args.rate, args.per, group=args.group)
    target = f"group {args.group!r}" if args.group else "every group without its own"
    settings = {k: getattr(args, k) for k in ("concurrency", "rate") if k in _given(args)}
    if args.json:
        emit_json(
            {
                "queue": args.queue,
                "action": "limit",
                "group": args.group,
                **settings,
                "per": args.per,
            }
        )
    else:
        echo(
            f"limit: {target} of {args.queue}: "
            + ", ".join(f"{k} {'none' if v is None else v}" for k, v in settings.items())
            + (f" per {args.per:g} s" if "rate" in settings else "")
        )
    return EXIT_OK


def _given(args: argparse.Namespace) -> set[str]:
    """Which of --concurrency and --rate the command line gave ('none' gives None)."""
    return {k for k in ("concurrency", "rate") if k in vars(args)}


async def _enqueue(app: App, args: argparse.Namespace) -> int:
    queue = queue_of(app, args)
    await check_signing(app, queue.name, "enqueue")
    found = await lookup(queue.door, queue.name, args.task)
    if found.unknown and not args.force:
        raise UsageError(found.message() + " (--force enqueues it anyway)")
    if not found.live:
        print(
            f"aioqueue: warning: no live worker serves queue {queue.name!r} (the task name is "
            "not checked; the job waits for a worker)",
            file=sys.stderr,
        )
    job = await queue.enqueue(
        args.task,
        args.args,
        args.kwargs,
        delay=args.delay,
        priority=None if args.priority is None else int(args.priority),
        group=args.group,
        job_id=args.job_id,
        max_attempts=None if args.max_attempts is None else int(args.max_attempts),
        allow_unknown=True,
    )
    if args.json:
        emit_json({"queue": args.queue, "action": "enqueue", "id": job.id})
    else:
        echo(job.id)
    return EXIT_OK
