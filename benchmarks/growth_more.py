"""Cost as the work grows, the rest of issue 26 point 3 (``growth.py`` has delayed jobs beside
many not due, and active groups): each mode prints one JSON line per size, figures per job or
per request taken from the server (``INFO commandstats``), which load barely changes.

    .venv/bin/python benchmarks/growth_more.py queues --sizes 1,100,1000,10000 --jobs 20000
    .venv/bin/python benchmarks/growth_more.py cron --sizes 10,1000
    .venv/bin/python benchmarks/growth_more.py due --sizes 10000,1000000
    .venv/bin/python benchmarks/growth_more.py dashboard --sizes 1000,1000000

* ``queues``: one worker serving Q queues. (a) ``--jobs`` no-op jobs spread round-robin over
  the Q queues, queued first, drained by one burst worker (concurrency 100): per job, the
  script µs, the commands and the script calls (claims and acks). (b) the same worker idle on
  the Q empty queues for ``--idle`` seconds: script calls and script µs per second. (c) the
  pickup latency of one job enqueued on the last queue while it idles.
* ``cron``: S schedules ``every=--every`` seconds on one queue (ticks on the same multiples of
  the interval, so S fire at once), fired by one ``Scheduler`` for ``--window`` seconds: per
  fired tick, the server's µs (all commands) and the scheduler's round trips.
* ``due``: S delayed jobs due over one hour, then a virtual offset of one hour taken off every
  score (the ``scheduled`` ZSET, by rank chunks of 2,000, ``ZADD XX``) so all are due, then one
  worker promotes and runs them: per job, script µs and commands.
* ``dashboard``: S queued jobs, then S completed (drained): the server's µs and commands per
  request of the dashboard's overview and of a job listing (first page, a deep page by cursor,
  newest first, filtered by a task no job has), each the median of 5 requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from growth import _stats  # benchmarks/growth.py, beside this file

#: shifts ARGV[2] ms off the scores of the ZSET KEYS[1] from rank ARGV[1] (2,000 entries)
SHIFT = """
local got = redis.call('ZRANGE', KEYS[1], ARGV[1], ARGV[1] + 1999, 'WITHSCORES')
local z = {}
for i = 1, #got, 2 do z[#z + 1] = got[i + 1] - ARGV[2]; z[#z + 1] = got[i] end
if #z > 0 then redis.call('ZADD', KEYS[1], 'XX', unpack(z)) end
return #got / 2
"""


async def _all_stats(r: Any) -> tuple[int, float, int]:
    """(commands, the server's CPU µs, script calls) so far. The CPU is ``INFO cpu`` (user +
    system): the server is this benchmark's own, so it is the requests' (and one INFO's)."""
    s = await r.info("commandstats")
    calls = sum(int(v["calls"]) for k, v in s.items() if k.startswith("cmdstat_"))
    c = await r.info("cpu")
    usec = (float(c["used_cpu_user"]) + float(c["used_cpu_sys"])) * 1e6
    scripts = sum(int(s.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("fcall", "evalsha"))
    return calls, usec, scripts


def _app(url: str, prefix: str) -> Any:
    from aioqueue import App

    return App(url, prefix=prefix, max_connections=200)


async def queues(url: str, q: int, n: int, idle: float) -> dict[str, Any]:
    from aioqueue import Worker

    app = _app(url, "gq")
    names = [f"q{i}" for i in range(q)]
    ran = asyncio.Event()

    @app.task(name="noop")
    async def noop(i: int) -> None:
        if i < 0:
            ran.set()

    async with app:
        await app.redis.flushall()
        calls = [
            noop.options(queue=names[k]).enqueue_many([{"i": j} for j in range(k, n, q)])
            for k in range(min(q, n))
        ]
        for i in range(0, len(calls), 50):
            await asyncio.gather(*calls[i : i + 50])
        k0, u0 = await _stats(app.redis)
        c0, s0 = time.process_time(), (await _all_stats(app.redis))[2]
        t0 = time.perf_counter()
        await Worker(app, queues=names, concurrency=100, burst=True).run()
        wall = time.perf_counter() - t0
        k1, u1 = await _stats(app.redis)
        c1, s1 = time.process_time(), (await _all_stats(app.redis))[2]
        done = sum([(await app.queue(x).stats())["completed"] for x in names[:10]])
        out: dict[str, Any] = {
            "queues": q,
            "jobs": n,
            "script_us_per_job": round((u1 - u0) / n, 2),
            "commands_per_job": round((k1 - k0 - 2) / n, 2),
            "script_calls_per_job": round((s1 - s0) / n, 3),
            "client_cpu_us_per_job": round((c1 - c0) / n * 1e6, 1),
            "drain_jobs_s": round(n / wall),
            "completed_first_10_queues": done,
        }
        # idle: the same worker on the empty queues; then one job on the last queue
        worker = Worker(app, queues=names, concurrency=100)
        task = asyncio.create_task(worker.run())
        await asyncio.sleep(min(10.0, 2 + q / 1000))  # started: registered, parked
        k0, u0 = await _stats(app.redis)
        sc0, c0 = (await _all_stats(app.redis))[2], time.process_time()
        await asyncio.sleep(idle)
        k1, u1 = await _stats(app.redis)
        sc1, c1 = (await _all_stats(app.redis))[2], time.process_time()
        out["idle_script_calls_per_s"] = round((sc1 - sc0) / idle, 1)
        out["idle_script_us_per_s"] = round((u1 - u0) / idle)
        out["idle_client_cpu_ms_per_s"] = round((c1 - c0) / idle * 1e3, 1)
        t0 = time.perf_counter()
        await noop.options(queue=names[-1]).enqueue(i=-1)
        try:
            await asyncio.wait_for(ran.wait(), 60)
            out["pickup_ms_last_queue"] = round((time.perf_counter() - t0) * 1e3, 1)
        except TimeoutError:
            out["pickup_ms_last_queue"] = "> 60,000"
        worker.stop()
        await task
    return out


async def cron(url: str, s: int, every: float, window: float) -> dict[str, Any]:
    from aioqueue._app.schedules import Scheduler

    app = _app(url, "gc")

    @app.task(name="noop")
    async def noop(i: int) -> None:
        return None

    async with app:
        await app.redis.flushall()
        for i in range(s):
            await app.schedules.add(noop, every=every, kwargs={"i": i}, name=f"c{i}")
        sched = Scheduler(app, ["default"])
        stop = asyncio.Event()
        k0, u0, sc0 = await _all_stats(app.redis)
        run = asyncio.create_task(sched.run(stop.is_set))
        await asyncio.sleep(window)
        stop.set()
        await run
        k1, u1, sc1 = await _all_stats(app.redis)
        fired = sched.fired
        queued = (await app.queue().counts())["queued"]
    return {
        "schedules": s,
        "every_s": every,
        "window_s": window,
        "fired": fired,
        "queued": queued,
        "server_cpu_us_per_fire": round((u1 - u0) / max(fired, 1), 2),
        "commands_per_fire": round((k1 - k0 - 2) / max(fired, 1), 2),
        "script_calls_per_fire": round((sc1 - sc0) / max(fired, 1), 2),
    }


async def due(url: str, s: int) -> dict[str, Any]:
    from aioqueue import Worker

    app = _app(url, "gd")
    ran = [0]
    done = asyncio.Event()

    @app.task(name="noop")
    async def noop(i: int) -> None:
        ran[0] += 1
        if ran[0] >= s:
            done.set()

    async with app:
        r = app.redis
        await r.flushall()
        t0 = time.perf_counter()
        for c in range(0, s, 5000):
            delay = 3600 * c / s + 60  # due over the hour after the next minute
            kw = [{"i": i} for i in range(c, min(c + 5000, s))]
            await noop.options(delay=delay).enqueue_many(kw)
        fill = time.perf_counter() - t0
        key = app.queue()._keys.scheduled
        t0 = time.perf_counter()
        for rank in range(0, s, 2000):  # the virtual hour: all due now
            await r.eval(SHIFT, 1, key, rank, 3_700_000)
        shift = time.perf_counter() - t0
        k0, u0 = await _stats(r)
        t0 = time.perf_counter()
        worker = Worker(app, concurrency=100)
        task = asyncio.create_task(worker.run())
        await done.wait()
        wall = time.perf_counter() - t0
        worker.stop()
        await task
        k1, u1 = await _stats(r)
    return {
        "delayed": s,
        "fill_s": round(fill, 1),
        "shift_s": round(shift, 1),
        "script_us_per_job": round((u1 - u0) / s, 2),
        "commands_per_job": round((k1 - k0 - 1) / s, 2),
        "jobs_per_s": round(s / wall),
    }


async def _per_request(r: Any, call: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """(the server's CPU µs, commands) of one request: the median of 5."""
    us, cmds = [], []
    for _ in range(5):
        k0, u0, _ = await _all_stats(r)
        await call()
        k1, u1, _ = await _all_stats(r)
        us.append(u1 - u0)
        cmds.append(k1 - k0 - 2)  # less an INFO
    return round(statistics.median(us), 1), statistics.median(cmds)


async def dashboard(url: str, s: int) -> dict[str, Any]:
    from aioqueue import Worker
    from aioqueue.dashboard._data import overview, queue_page

    app = _app(url, "gb")

    @app.task(name="noop")
    async def noop(i: int) -> None:
        return None

    out: dict[str, Any] = {"jobs": s}
    async with app:
        r = app.redis
        await r.flushall()
        for c in range(0, s, 5000):
            await noop.enqueue_many([{"i": i} for i in range(c, min(c + 5000, s))])
        for state in ("queued", "completed"):
            if state == "completed":
                await Worker(app, concurrency=100, burst=True).run()
            deep = await app.queue().jobs(state, limit=1000)
            cursor = deep.cursor

            def page(state: str = state, **kw: Any) -> Awaitable[Any]:
                base: dict[str, Any] = {"task": None, "group": None, "cursor": None}
                return queue_page(app, "default", state, **{"newest_first": False, **base, **kw})

            reqs: dict[str, Callable[[], Awaitable[Any]]] = {
                "overview": lambda: overview(app, ["default"]),
                "list first page": page,
                "list after 1,000": lambda page=page, c=cursor: page(cursor=c),  # type: ignore[misc]
                "list newest first": lambda page=page: page(newest_first=True),  # type: ignore[misc]
                "list by task (none match)": lambda page=page: page(task="other"),  # type: ignore[misc]
            }
            for what, call in reqs.items():
                us, cmds = await _per_request(r, call)
                out[f"{state}: {what}"] = {"server_cpu_us": us, "commands": cmds}
    return out


MODES: dict[str, Callable[..., Awaitable[dict[str, Any]]]] = {
    "queues": queues,
    "cron": cron,
    "due": due,
    "dashboard": dashboard,
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=sorted(MODES))
    p.add_argument("--sizes", required=True)
    p.add_argument("--jobs", type=int, default=20_000, help="queues: jobs drained")
    p.add_argument("--idle", type=float, default=10.0, help="queues: seconds idle measured")
    p.add_argument("--every", type=float, default=5.0, help="cron: the schedules' interval")
    p.add_argument("--window", type=float, default=22.0, help="cron: seconds measured")
    p.add_argument("--url", help="a running server (default: an embedded Valkey of our own)")
    a = p.parse_args()

    def one(url: str, size: int) -> dict[str, Any]:
        if a.mode == "queues":
            return asyncio.run(queues(url, size, a.jobs, a.idle))
        if a.mode == "cron":
            return asyncio.run(cron(url, size, a.every, a.window))
        return asyncio.run(MODES[a.mode](url, size))

    sizes = [int(x) for x in a.sizes.split(",")]
    if a.url:
        for size in sizes:
            print(json.dumps(one(a.url, size)), flush=True)
        return 0
    from aioqueue import EmbeddedServer

    with EmbeddedServer() as server:
        for size in sizes:
            print(json.dumps(one(server.url, size)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
