#!/usr/bin/env python3
"""What fair groups cost: drain throughput with and without groups, priorities and limits.

    .venv/bin/python benchmarks/groups.py                 # 20,000 jobs, 5 repeats per scenario
    .venv/bin/python benchmarks/groups.py --repeats 1 --jobs 5000

Starts a private embedded Valkey (no AOF), then for each scenario and repeat: empties the
server, pre-queues the jobs (not timed), and times one in-process ``Worker`` (concurrency 100,
uvloop when installed) draining them with a no-op async task, from the worker's start
until it has run every job and the last ack has landed. Scenarios:

    none         no groups, priority 0 (the plain FIFO list: the baseline)
    none+prio    no groups, priorities mixed (-50, -10, 0, 10, 50)
    groups       1,000 groups, 20 jobs each: the ring serves them round-robin
    groups+prio  1,000 groups, 20 jobs each, priorities mixed as above within each group
    groups+limit 1,000 groups, 20 jobs each, every group limited to 5 jobs at once

Prints a table (jobs/s, median and best of the repeats, the best's ratio to ``none``, and the
server's script time per job from ``INFO commandstats``) and writes everything, every trial
included, to ``benchmarks/results/groups-latest.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _loop import has_uvloop, run  # benchmarks/_loop.py, beside this file

from aioqueue import App, EmbeddedServer, Task, Worker, __version__

RESULTS = Path(__file__).resolve().parent / "results"
PRIORITIES = (-50, -10, 0, 10, 50)

Noop = Task[[int], None]


@dataclass(frozen=True, slots=True)
class Config:
    jobs: int
    groups: int
    limit: int
    concurrency: int
    repeats: int
    uvloop: bool


@dataclass(slots=True)
class Trial:
    seconds: float
    jobs_per_s: float
    server_us_per_job: float


class Drained:
    """Counts the runs of the no-op task and tells when all ``n`` have run (in-process, so
    measuring adds no Redis traffic)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.ran = 0
        self.event = asyncio.Event()

    def tick(self) -> None:
        self.ran += 1
        if self.ran >= self.n:
            self.event.set()


def define(app: App, drained: Drained) -> Noop:
    @app.task(name="noop")
    async def noop(i: int) -> None:
        drained.tick()

    return noop


async def bounded(calls: list[Awaitable[Any]], at_once: int = 50) -> None:
    """Await ``calls`` with at most ``at_once`` in flight (the pool has 100 connections)."""
    for i in range(0, len(calls), at_once):
        await asyncio.gather(*calls[i : i + at_once])


async def fill_none(app: App, noop: Noop, cfg: Config, *, prio: bool) -> None:
    if not prio:
        for i in range(0, cfg.jobs, 5000):
            await noop.enqueue_many([{"i": j} for j in range(i, min(i + 5000, cfg.jobs))])
        return
    for k, p in enumerate(PRIORITIES):
        jobs = [{"i": j} for j in range(k, cfg.jobs, len(PRIORITIES))]
        await noop.options(priority=p).enqueue_many(jobs)


async def fill_groups(app: App, noop: Noop, cfg: Config, *, prio: bool, limit: bool) -> None:
    if limit:
        await app.queue().set_group_limit(None, cfg.limit)
    calls: list[Awaitable[Any]] = []
    for g in range(cfg.groups):
        group = f"tenant-{g:04d}"
        mine = range(g, cfg.jobs, cfg.groups)  # job numbers of this group
        if prio:  # within the group, its jobs take the priorities in turn
            for k, p in enumerate(PRIORITIES):
                jobs = [{"i": j} for j in mine[k :: len(PRIORITIES)]]
                if jobs:
                    calls.append(noop.options(group=group, priority=p).enqueue_many(jobs))
        else:
            calls.append(noop.options(group=group).enqueue_many([{"i": j} for j in mine]))
    await bounded(calls)


Filler = Callable[[App, Noop, Config], Coroutine[Any, Any, None]]

#: name -> (what it is, a format string over Config's fields; how its jobs are queued)
SCENARIOS: dict[str, tuple[str, Filler]] = {
    "none": ("no groups", lambda app, noop, cfg: fill_none(app, noop, cfg, prio=False)),
    "none+prio": (
        "no groups, priorities mixed",
        lambda app, noop, cfg: fill_none(app, noop, cfg, prio=True),
    ),
    "groups": (
        "{groups:,} groups, round-robin",
        lambda app, noop, cfg: fill_groups(app, noop, cfg, prio=False, limit=False),
    ),
    "groups+prio": (
        "{groups:,} groups, priorities mixed",
        lambda app, noop, cfg: fill_groups(app, noop, cfg, prio=True, limit=False),
    ),
    "groups+limit": (
        "{groups:,} groups, limit {limit} each",
        lambda app, noop, cfg: fill_groups(app, noop, cfg, prio=False, limit=True),
    ),
}


async def script_stats(app: App) -> tuple[int, int]:
    """(calls, microseconds) of script calls (FCALL, or EVALSHA) on the server so far."""
    stats = await app.redis.info("commandstats")
    entries = [stats.get(f"cmdstat_{c}", {}) for c in ("fcall", "evalsha")]
    return sum(int(e.get("calls", 0)) for e in entries), sum(int(e.get("usec", 0)) for e in entries)


async def acked(app: App, n: int) -> None:
    """Return once the server counts ``n`` completed jobs (checked every millisecond; only
    called after every job has run, so for the last few acks)."""
    for _ in range(60_000):
        if (await app.queue().stats()).get("completed", 0) >= n:
            return
        await asyncio.sleep(0.001)
    raise TimeoutError("the last acks never landed")


async def trial(url: str, name: str, cfg: Config) -> Trial:
    async with App(url, prefix="bench", max_connections=200) as app:
        await app.redis.flushall()
        drained = Drained(cfg.jobs)
        await SCENARIOS[name][1](app, define(app, drained), cfg)
        counts = await app.queue().counts()
        assert counts["queued"] == cfg.jobs, (name, counts)
        _, usec0 = await script_stats(app)
        # not burst=True: a burst worker can stop early while its own acks still hold group
        # slots (see tests/test_qos.py::test_a_burst_worker_drains_a_limited_group)
        worker = Worker(app, concurrency=cfg.concurrency)
        t0 = time.perf_counter()
        async with worker:
            await asyncio.wait_for(drained.event.wait(), 600)
            # every job has run; the drain ends when the last ack has landed (the worker's
            # shutdown is not part of it)
            await acked(app, cfg.jobs)
            seconds = time.perf_counter() - t0
        _, usec1 = await script_stats(app)
        stats = await app.queue().stats()
        assert stats.get("completed") == cfg.jobs, (name, stats)
        counts = await app.queue().counts()
        assert counts == {"scheduled": 0, "queued": 0, "active": 0, "failed": 0}, counts
    return Trial(seconds, cfg.jobs / seconds, (usec1 - usec0) / cfg.jobs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--groups", type=int, default=1_000)
    ap.add_argument("--limit", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-uvloop", action="store_true")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--out", type=Path, default=RESULTS / "groups-latest.json")
    args = ap.parse_args(argv)
    names = [s for s in args.scenarios.split(",") if s]
    unknown = set(names) - set(SCENARIOS)
    if unknown:
        ap.error(f"unknown scenarios {sorted(unknown)}; known: {', '.join(SCENARIOS)}")
    cfg = Config(
        args.jobs,
        args.groups,
        args.limit,
        args.concurrency,
        args.repeats,
        has_uvloop() and not args.no_uvloop,
    )

    trials: dict[str, list[Trial]] = {n: [] for n in names}
    with EmbeddedServer(appendonly=False) as server:
        # interleaved, so a drift of the machine's speed touches every scenario alike
        for r in range(cfg.repeats):
            for name in names:
                t = run(trial(server.url, name, cfg), cfg.uvloop)
                trials[name].append(t)
                print(
                    f"  repeat {r + 1}/{cfg.repeats} {name:<13} {t.jobs_per_s:>9,.0f} jobs/s",
                    file=sys.stderr,
                )
        version = asyncio.run(server_version(server.url))

    what = {n: SCENARIOS[n][0].format(**asdict(cfg)) for n in names}
    medians = {n: statistics.median(t.jobs_per_s for t in ts) for n, ts in trials.items()}
    best = {n: max(t.jobs_per_s for t in ts) for n, ts in trials.items()}
    server_us = {n: min(t.server_us_per_job for t in ts) for n, ts in trials.items()}
    base, base_best = medians.get("none"), best.get("none")
    lines = [
        f"Drain of {cfg.jobs:,} pre-queued no-op jobs, one in-process Worker at concurrency "
        f"{cfg.concurrency} ({'uvloop' if cfg.uvloop else 'asyncio'}), {cfg.repeats} runs "
        f"each, interleaved; Valkey {version}. Other load on the machine only slows a run "
        "down, so the best run is the truer cost; the median shows what a run typically got.",
        "",
        f"| {'scenario':<13} | {'what':<30} | {'median/s':>9} | {'best/s':>9} | "
        f"{'vs none':>7} | {'server us/job':>13} |",
        f"|{'-' * 15}|{'-' * 32}|{'-' * 11}|{'-' * 11}|{'-' * 9}|{'-' * 15}|",
    ]
    for n in names:
        ratio = f"{best[n] / base_best:.2f}" if base_best else "-"
        lines.append(
            f"| {n:<13} | {what[n]:<30} | {medians[n]:>9,.0f} | {best[n]:>9,.0f} | "
            f"{ratio:>7} | {server_us[n]:>13.1f} |"
        )
    lines += [
        "",
        "vs none: best run against the best run without groups; server us/job: the server's "
        "script time per job (INFO commandstats), lowest of the runs.",
    ]
    table = "\n".join(lines)
    print(table)

    out = {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "aioqueue": __version__,
        "valkey": version,
        "host": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "config": asdict(cfg),
        "scenarios": {
            n: {
                "what": what[n],
                "jobs_per_s_median": medians[n],
                "jobs_per_s_best": best[n],
                "ratio_to_none_median": medians[n] / base if base else None,
                "ratio_to_none_best": best[n] / base_best if base_best else None,
                "server_us_per_job_min": server_us[n],
                "trials": [asdict(t) for t in trials[n]],
            }
            for n in names
        },
        "table": table,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwritten to {args.out}", file=sys.stderr)
    return 0


async def server_version(url: str) -> str:
    async with App(url) as app:
        info = await app.redis.info("server")
    return str(info.get("valkey_version") or info.get("redis_version", "?"))


if __name__ == "__main__":
    raise SystemExit(main())
