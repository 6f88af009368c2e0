"""The operator's read-only commands of ``python -m aioqueue``: ``info``, ``groups``,
``workers``, ``jobs``, ``dead``, ``job`` and ``why`` (their parsers are in ``_cli_admin``)."""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from .._app.app import App
from .._model.safetext import escape
from .._queue.queue import Queue
from .._queue.queuereg import known_queues
from .format import clip, echo, emit_json, plain, table, when
from .schedules import as_record
from .schedules import table as schedule_table

EXIT_OK = 0


def queue_of(app: App, args: argparse.Namespace) -> Queue:
    return app.queue(args.queue)


def _cell(key: str, value: Any) -> Any:
    """An info row's value as the table shows it."""
    if key == "paused":
        return "yes" if value else ""
    if key == "wait_s":
        return "-" if value is None else f"{value:.1f}s"
    if key == "max_queued":
        return "-" if value is None else value
    return value


async def info(app: App, args: argparse.Namespace) -> int:
    names = [args.queue] if args.queue else await known_queues(app.redis, app.prefix)
    rows = []
    for name in names:
        q = app.queue(name)
        counts = await q.counts()
        tp = await q.throughput(60)
        last5 = tp.minutes[-5:]
        workers = await q.workers()
        rows.append(
            {
                "queue": name,
                **counts,
                "paused": await q.is_paused(),
                "max_queued": setting[0] if (setting := await q.max_queued()) else None,
                # the exact count max_queued bounds, in total and per task ('*': past 100)
                "backlog": sum((backlog := await q.backlog()).values()),
                "backlog_tasks": backlog,
                # the autoscaling signals: the backlog is "queued", and how long its head waits
                "wait_s": await q.wait_time(),
                "groups": len(await q.groups(limit=10_000)),
                "workers": sum(1 for w in workers if w.alive),
                "completed_1h": tp.completed,
                "failed_1h": tp.failed,
                "completed_per_min_5m": round(sum(m.completed for m in last5) / 5, 1),
                "stats": await q.stats(),
            }
        )
    # the periodic schedules of these queues, with their next runs
    schedules = await app.schedules.list(queues=names) if names else []
    if args.json:
        emit_json({"queues": rows, "schedules": [as_record(i) for i in schedules]})
        return EXIT_OK
    if not rows:
        echo(f"no queues under prefix {app.prefix!r}")
        return EXIT_OK
    headers = ["QUEUE", "SCHEDULED", "QUEUED", "WAIT", "ACTIVE", "FAILED", "DONE/1H"]
    headers += ["FAILED/1H", "DONE/MIN(5M)", "GROUPS", "WORKERS", "PAUSED", "MAX"]
    keys = ["queue", "scheduled", "queued", "wait_s", "active", "failed", "completed_1h"]
    keys += ["failed_1h", "completed_per_min_5m", "groups", "workers", "paused", "max_queued"]
    echo(table(headers, [[_cell(k, r[k]) for k in keys] for r in rows]))
    if schedules:
        echo("")
        echo(schedule_table(schedules, time.time()))
    return EXIT_OK


async def groups(app: App, args: argparse.Namespace) -> int:
    groups = await queue_of(app, args).groups(limit=int(args.limit))
    if args.json:
        emit_json({"queue": args.queue, "groups": groups})
        return EXIT_OK
    rows = [
        [
            g.name,
            g.queued,
            g.active,
            g.limit,
            None if g.rate is None else f"{g.rate}/{g.rate_seconds:g}s",
            "yes" if g.paused else "",
        ]
        for g in groups
    ]
    headers = ["GROUP", "QUEUED", "ACTIVE", "LIMIT", "RATE", "PAUSED"]
    echo(table(headers, rows) if rows else "no groups")
    return EXIT_OK


async def workers(app: App, args: argparse.Namespace) -> int:
    """The workers registered on a queue: what each is, and its heartbeat."""
    found = await queue_of(app, args).workers()
    if args.json:
        emit_json({"queue": args.queue, "workers": found})
        return EXIT_OK
    now = datetime.now(UTC)
    rows = [
        [
            w.id,
            w.host,
            w.pid,
            w.version,
            ",".join(w.queues),
            w.concurrency,
            "-" if w.started is None else _ago(now - w.started),
            "-" if w.last_beat is None else _ago(now - w.last_beat) + " ago",
            "yes" if w.alive else "DEAD",
            w.jobs_held,
            w.done,
            w.failed,
        ]
        for w in found
    ]
    headers = ["WORKER", "HOST", "PID", "VERSION", "QUEUES", "CONC", "UPTIME", "BEAT"]
    headers += ["ALIVE", "HELD", "DONE", "FAILED"]
    echo(table(headers, rows) if rows else f"no workers registered on queue {args.queue!r}")
    return EXIT_OK


def _ago(delta: timedelta) -> str:
    """A duration as people read it: 42s, 7m03s, 2h05m."""
    sec = max(int(delta.total_seconds()), 0)
    if sec < 60:
        return f"{sec}s"
    if sec < 3600:
        return f"{sec // 60}m{sec % 60:02d}s"
    return f"{sec // 3600}h{sec % 3600 // 60:02d}m"


def _print_page(args: argparse.Namespace, page: Any, dead: bool = False) -> int:
    if args.json:
        emit_json({"queue": args.queue, "items": page.items, "cursor": page.cursor})
        return EXIT_OK
    if dead:
        headers = ["ID", "TASK", "GROUP", "ATTEMPTS", "DIED", "ERROR"]
        rows = [
            [
                j.id,
                j.task,
                j.group,
                f"{j.attempts}/{j.max_attempts}",
                when(j.finished_ms),
                clip(f"{j.error.type}: {j.error.message}" if j.error else "", 60),
            ]
            for j in page.items
        ]
    else:
        headers = ["ID", "TASK", "STATE", "GROUP", "PRIO", "ATTEMPTS", "CREATED", "DUE"]
        rows = [
            [
                j.id,
                j.task,
                j.state.value,
                j.group,
                j.priority,
                f"{j.attempts}/{j.max_attempts}",
                when(j.created_ms),
                when(j.due_ms),
            ]
            for j in page.items
        ]
    echo(table(headers, rows) if rows else "no jobs")
    if page.cursor:
        echo(f"more: --cursor {page.cursor}")
    return EXIT_OK


async def jobs(app: App, args: argparse.Namespace) -> int:
    page = await queue_of(app, args).jobs(
        args.state,
        task=args.task,
        group=args.group,
        limit=int(args.limit),
        cursor=args.cursor,
        newest_first=args.newest_first,
    )
    return _print_page(args, page)


async def dead(app: App, args: argparse.Namespace) -> int:
    page = await queue_of(app, args).jobs(
        "failed",
        task=args.task,
        group=args.group,
        limit=int(args.limit),
        cursor=args.cursor,
        newest_first=not args.oldest_first,
    )
    return _print_page(args, page, dead=True)


async def job(app: App, args: argparse.Namespace) -> int:
    d = await queue_of(app, args).job_detail(args.id)
    if args.json:
        emit_json(d)
        return EXIT_OK
    i = d.info
    # an encrypted job read without its key (this command has none): no plaintext to show
    sealed = "(encrypted)" if i.encrypted else "(unreadable)"
    result = d.result_text() if i.args is not None or not i.encrypted else sealed
    fields: list[tuple[str, object]] = [
        ("id", i.id),
        ("queue", i.queue),
        ("task", i.task),
        ("state", i.state.value + ("  (cancellation requested)" if d.cancel_requested else "")),
        ("attempts", f"{i.attempts}/{i.max_attempts}"),
        ("priority", i.priority),
        ("group", d.group or "-"),
        ("batch", d.batch or "-"),
        ("args", json.dumps(i.args, default=repr) if i.args is not None else sealed),
        ("kwargs", json.dumps(i.kwargs, default=repr) if i.kwargs is not None else "-"),
        ("options", json.dumps(d.options) if d.options else "-"),
        ("created", when(i.created_ms)),
        ("due", when(i.due_ms)),
        ("started", when(d.started_ms)),
        ("lease until", when(d.lease_deadline_ms)),
        ("finished", when(i.finished_ms)),
        ("progress", json.dumps(i.progress, default=repr) if i.progress is not None else "-"),
        ("result", result if i.state.value == "completed" else "-"),
    ]
    if i.error:
        fields.append(("error", f"{i.error.type}: {i.error.message}"))
    width = max(len(k) for k, _ in fields)
    for k, v in fields:
        echo(f"{k.ljust(width)}  {escape(str(v))}")
    if d.history:
        echo("history:")
        echo(_history_table(d.history))
    if i.error and i.error.traceback:
        echo("traceback:")
        echo(i.error.traceback.rstrip())
    if d.logs:
        echo("log:")
        for t, level, msg in d.logs:
            echo(f"  {when(int(t * 1000)) if t else '-'}  {escape(level)}  {escape(msg)}")
    return EXIT_OK


async def why(app: App, args: argparse.Namespace) -> int:
    """Why a job is not running: its reasons, the deciding one first (exit 0 even for a job
    not found: that is an answer)."""
    w = await queue_of(app, args).why(args.id)
    if args.json:
        emit_json({**plain(w), "reason": w.reason, "sentence": w.sentence()})
        return EXIT_OK
    echo(f"{escape(w.job_id)}  {w.state.value if w.state else '-'}")
    for row in w.rows:
        echo(f"  {row.reason.value.ljust(12)}  {row.sentence(w.now_ms)}")
    return EXIT_OK


def _history_table(history: Any) -> str:
    """A job's attempts, oldest first: number, worker, times, how each ended."""
    rows = []
    for a in history:
        took = None
        if a.started_ms is not None and a.ended_ms is not None:
            took = f"{max(a.ended_ms - a.started_ms, 0) / 1000:.3f}s"
        error = f"{a.error_type or ''}: {a.error_message or ''}" if a.error_type else None
        rows.append(
            (
                a.number,
                clip(a.worker, 40) if a.worker else "-",
                when(a.started_ms),
                when(a.ended_ms),
                took,
                a.outcome,
                clip(error, 60) if error else None,
            )
        )
    return table(("#", "worker", "started", "ended", "took", "outcome", "error"), rows)
