"""Bounded work (I13): every script, called with the worst arguments a client can send (the
most ids a call takes, page sizes and counts far past any cap, anchors that match nothing so
each search runs to its bound, ids at the far end of a 200,000-long ready list), costs the
server under 50 ms on a queue of 200,000 jobs, measured by the server itself (``INFO
commandstats``, the usec of the script calls). A script without a row here fails the test;
the figures are printed (``-s``) and recorded in docs/data-model.md.

The queue is filled by a script of this test (its records have the fields enqueue writes), in
steps, so that filling takes a few seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from aioqueue import App
from aioqueue._model.exceptions import ServerRefused
from aioqueue._model.limits import (
    BACKLOG_TASKS,
    JOB_LOG_LINES,
    MAX_ACKS_PER_CALL,
    MAX_JOBS_PER_CALL,
)
from aioqueue._store.embedded import EmbeddedServer
from aioqueue._store.loader import SCRIPTS
from aioqueue._store.outcomes import Outcome
from aioqueue._store.scripts import QueueScripts

from .support.server import text

#: jobs in the queue, and the most server time one call may take
JOBS = 200_000
LIMIT_MS = 50.0
#: calls measured per script (the least is compared), and at most how many more for one
#: whose least is still over the limit
ROUNDS = 5
EXTRA = 10
#: each structure other than the ready list gets this many jobs, so each call finds work
SIDE = MAX_JOBS_PER_CALL * (ROUNDS + EXTRA + 1)
HUGE = 10**12

# n records in state s (ids <tag><i>) and into a structure: 'ready' (RPUSH), or a ZSET key
# suffix with score ARGV[6] (0 = long past, for active: leases run out)
_FILL = """
local base, tag, first, n, s, into, score = ARGV[1], ARGV[2], tonumber(ARGV[3]),
  tonumber(ARGV[4]), ARGV[5], ARGV[6], ARGV[7]
local ids = {}
for i = first, first + n - 1 do
  local id = tag .. string.format('%020d', i)
  redis.call('HSET', base .. 'job:' .. id, 't', 'work', 'p', 'payload', 's', s, 'a', 0,
    'm', 3, 'ct', 1700000000000, 'l', 'tok')
  if into == 'ready' then
    ids[#ids + 1] = id
    if #ids == 1000 then redis.call('RPUSH', base .. 'ready', unpack(ids)); ids = {} end
  else
    redis.call('ZADD', base .. into, score, id)
  end
end
if #ids > 0 then redis.call('RPUSH', base .. 'ready', unpack(ids)) end
if into == 'ready' then redis.call('ZADD', base .. 'ring', 'NX', 1, '') end
redis.call('HINCRBY', base .. 'stats', 'enqueued', n)
return n
"""


# the last n ids of the ready list (ARGV[2]) still queued, among its last ARGV[3], in list order
_TAIL = """
local base, n, span = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local got = redis.call('LRANGE', base .. 'ready', -span, -1)
local out = {}
for i = #got, 1, -1 do
  if redis.call('HGET', base .. 'job:' .. got[i], 's') == 'queued' then
    table.insert(out, 1, got[i])
    if #out == n then break end
  end
end
return out
"""


@pytest.fixture(scope="module")
def server() -> Any:
    with EmbeddedServer(appendonly=False) as srv:
        # the server's own work is what is measured: where allowed, it gets ahead of the
        # other processes on a shared machine, which would otherwise inflate its figures
        if srv.pid is not None:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, srv.pid, -10)
        yield srv


@pytest.fixture
async def full(server: EmbeddedServer) -> AsyncIterator[tuple[App, Redis]]:
    """An App on a queue of 200,000 plain queued jobs (its ready list), plus scheduled, dead,
    completed and active (lease run out) ones."""
    async with App(server.url, prefix="b" + uuid.uuid4().hex[:8], socket_timeout=60) as app:
        raw = Redis.from_url(server.url, socket_timeout=120)
        base = app.queue("default")._keys.base
        for first in range(0, JOBS, 20_000):
            await raw.eval(_FILL, 0, base, "r", first, 20_000, "queued", "ready", 0)
        for tag, state, into, score in (
            ("s", "scheduled", "scheduled", HUGE),
            ("d", "failed", "dead", 1),
            ("c", "completed", "completed", 1),
            ("a", "active", "active", 0),
        ):
            await raw.eval(_FILL, 0, base, tag, 0, SIDE, state, into, score)
        assert await raw.llen(base + "ready") == JOBS
        try:
            yield app, raw
        finally:
            await raw.flushall()
            await raw.aclose()


async def server_ms(raw: Redis, call: Awaitable[Any]) -> float:
    """Server time of the script calls ``call`` makes, in ms (INFO commandstats)."""
    await raw.config_resetstat()
    with contextlib.suppress(ServerRefused):  # refused: what it cost still counts
        await call
    stats = await raw.info("commandstats")
    usec = sum(
        v["usec"]
        for k, v in stats.items()
        if k in ("cmdstat_fcall", "cmdstat_fcall_ro", "cmdstat_evalsha", "cmdstat_eval")
    )
    return float(usec) / 1000


def ids(tag: str, start: int, n: int = MAX_JOBS_PER_CALL) -> list[str]:
    return [tag + f"{i:020d}" for i in range(start, start + n)]


class Ctx:
    """What the rows draw their arguments from: each round takes fresh jobs."""

    def __init__(self, app: App, raw: Redis) -> None:
        self.app = app
        self.raw = raw
        self.s: QueueScripts = app.queue("default")._scripts
        self.base = self.s.base
        self.round = 0

    async def tail(self, n: int = MAX_JOBS_PER_CALL) -> list[str]:
        """The last n ids of the ready list still queued: the farthest from its head (a job
        cancelled or purged there by an earlier round stays in the list, not queued)."""
        # on the server (one call, not 30,000 replies to this process): the suite's CPU
        queued = [text(x) for x in await self.raw.eval(_TAIL, 0, self.base, n, 30 * n)]
        assert len(queued) == n
        return queued

    async def leased(self) -> list[tuple[str, str]]:
        res = await self.s.claim(MAX_JOBS_PER_CALL, 600_000, 0)
        assert len(res.jobs) == MAX_JOBS_PER_CALL
        return [(c.id, c.token) for c in res.jobs]

    def run(self, name: str, args: list[Any], keys: list[str] | None = None) -> Awaitable[Any]:
        return self.s.run(name, args, keys or [])


Row = Callable[[Ctx], Awaitable[Awaitable[Any]]]
INFO = ["host", 1, "v", "default", 1, 0, 0, 0, 0]  # ..., done, failed, signs


async def _page(c: Ctx) -> Awaitable[Any]:
    # more anchors than a cursor holds, none in the list: each search runs to its bound
    anchors = [f"gone{i}" for i in range(1400)]
    return c.run("page", [c.base, HUGE, c.round % 2, HUGE, *anchors], [c.base + "ready"])


async def _peek(c: Ctx) -> Awaitable[Any]:
    return c.run("peek", [c.base, 16, *(["t"] * 16), *await c.tail()])


async def _enqueue(c: Ctx) -> Awaitable[Any]:
    if c.round == 0:
        # backpressure on, and the backlog's count at its bound (100 tasks and the rest, the
        # sum under the server's keys): enqueue reads all of it (lib/core BL.total)
        await c.raw.hset(c.base + "qconf", "maxq", 2**53 - 1)
        counts: dict[Any, Any] = {f"t:task{i}": 1000 for i in range(BACKLOG_TASKS)}
        await c.raw.hset(c.base + "backlog", mapping={**counts, "*": 1000})
    run = ["work", 3, -1, -1, 0, "", "", "", "", "", MAX_JOBS_PER_CALL]
    for job_id in ids(f"e{c.round}-", 0):
        run += [job_id, "payload"]
    return c.run("enqueue", [c.base, 1, *run])


async def _claim(c: Ctx) -> Awaitable[Any]:
    return c.run("claim", [c.base, HUGE, 600_000, 0, "", 0, "ab", "", ""])


async def _complete(c: Ctx) -> Awaitable[Any]:
    items = [x for job_id, tok in await c.leased() for x in (job_id, tok, b"r", 60_000)]
    return c.run("complete", [c.base, MAX_JOBS_PER_CALL, *items])


# a waiting job D (ARGV[2]) whose set of dependencies holds the jobs ARGV[3..] and one more,
# each of which has D as its lone dependent (dd)
_FAN_IN = """
local base, d = ARGV[1], ARGV[2]
redis.call('HSET', base .. 'job:' .. d, 't', 'work', 'p', 'payload', 's', 'waiting', 'a', 0,
  'm', 3, 'ct', 1, 'dp', 'cancel', 'dl', '[]', 'dt', 0, 'xk', 'r')
local members = {base .. d .. '-more'}
for i = 3, #ARGV do
  redis.call('HSET', base .. 'job:' .. ARGV[i], 'dd', base .. d)
  members[#members + 1] = base .. ARGV[i]
end
redis.call('SADD', base .. 'deps:' .. d, unpack(members))
redis.call('ZADD', base .. 'waiting', 1, d)
return #members
"""


async def _complete_fan_in(c: Ctx) -> Awaitable[Any]:
    """1,000 completions in one call, each a dependency of one job (its lone dependent), each
    with a 4 KiB result: they tell it together, every result kept for it (lib/deps DQ.told)."""
    leased = await c.leased()
    d = f"F{c.round}"
    await c.raw.eval(_FAN_IN, 0, c.base, d, *[job_id for job_id, _ in leased])
    items = [x for job_id, tok in leased for x in (job_id, tok, b"r" * 4096, 60_000)]
    return c.run("complete", [c.base, MAX_JOBS_PER_CALL, *items])


async def _complete_claim(c: Ctx) -> Awaitable[Any]:
    leased = (await c.leased())[:MAX_ACKS_PER_CALL]
    items = [x for job_id, tok in leased for x in (job_id, tok, b"r", 60_000)]
    head = [c.base, HUGE, 600_000, 0, "", 0, "cd", "", "", MAX_ACKS_PER_CALL]
    return c.run("complete_claim", [*head, *items])


async def _pairs(c: Ctx) -> list[str]:
    return [x for pair in await c.leased() for x in pair]


async def _extend(c: Ctx) -> Awaitable[Any]:
    return c.run("extend", [c.base, 600_000, MAX_JOBS_PER_CALL, *await _pairs(c)])


async def _release(c: Ctx) -> Awaitable[Any]:
    pairs = (await _pairs(c))[: 2 * MAX_ACKS_PER_CALL]
    return c.run("release", [c.base, 0, 1, 0, MAX_ACKS_PER_CALL, *pairs])


async def _beat(c: Ctx) -> Awaitable[Any]:
    pairs = await _pairs(c)
    # with a trend sample: the per-task one reads the backlog's count (at its bound, see
    # _enqueue) and the claims' waits, planted far past theirs (read and trimmed by rank)
    await c.raw.zadd(c.base + "twait", {f"task{i}-{c.round}": i for i in range(10_000)})
    args = [c.base, "w1", 60_000, 600_000, HUGE, *INFO, 0, MAX_JOBS_PER_CALL, *pairs, HUGE, HUGE]
    return c.run("beat", args)


async def _fail(c: Ctx) -> Awaitable[Any]:
    job_id, tok = (await c.leased())[0]
    return c.run("fail", [c.base, job_id, tok, json.dumps({"type": "E"}), -1, 0])


async def _cancel(c: Ctx) -> Awaitable[Any]:
    return c.run("cancel", [c.base, 0, *await c.tail()])


async def _purge(c: Ctx) -> Awaitable[Any]:
    if c.round % 2:
        return c.run("purge", [c.base, "ready", "", HUGE])
    return c.run("purge", [c.base, "ids", "queued", 0, *await c.tail()])


async def _promote(c: Ctx) -> Awaitable[Any]:
    return c.run("promote", [c.base, *ids("s", c.round * MAX_JOBS_PER_CALL)])


async def _requeue(c: Ctx) -> Awaitable[Any]:
    return c.run("requeue", [c.base, *ids("d", c.round * MAX_JOBS_PER_CALL)])


async def _reap(c: Ctx) -> Awaitable[Any]:
    # leases that ran out, for this round alone (claims recover such leases too)
    await c.raw.eval(_FILL, 0, c.base, f"x{c.round}-", 0, MAX_JOBS_PER_CALL, "active", "active", 0)
    keys = [*c.s.lanes, c.s.keys.reap_lock]
    return c.run("reap", [c.base, HUGE, 1, 0], keys)


async def _watch(c: Ctx) -> Awaitable[Any]:
    return c.run("watch", [c.base, ids("r", JOBS - 1, 1)[0], 1, "job"])


async def _configure(c: Ctx) -> Awaitable[Any]:
    return c.run("configure", [c.base, "resume", "", "", ""])


async def _batch(c: Ctx) -> Awaitable[Any]:
    bid = f"b{c.round}"
    await c.run("batch", [c.base, "open", bid, "continue", 0, "", "", "", 0])
    members = [c.base + m for m in ids("m", 0)]
    return c.run("batch", [c.base, "add", bid, *members])


async def _deps(c: Ctx) -> Awaitable[Any]:
    """A dependent of the 1,000 jobs at the far end of the ready list (each registers it)."""
    deps = [c.base + i for i in await c.tail()]
    return c.run(
        "deps", [c.base, "add", f"dep{c.round}", "work", "p", 3, 0, "", "", "cancel", 0, *deps]
    )


# a completed dependency D (ARGV[2]) with n (ARGV[3], at most 1,000) dependents waiting for it
# alone
_DEPENDENTS = """
local base, d, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
redis.call('HSET', base .. 'job:' .. d, 't', 'work', 's', 'completed', 'dd', 1, 'ct', 1)
local members = {}
for i = 1, n do
  local id = d .. '-w' .. i
  redis.call('HSET', base .. 'job:' .. id, 't', 'work', 'p', 'payload', 's', 'waiting', 'a', 0,
    'm', 3, 'ct', 1, 'dp', 'cancel', 'dl', '["' .. base .. d .. '"]', 'dt', 0)
  redis.call('SADD', base .. 'deps:' .. id, base .. d)
  members[#members + 1] = base .. id
end
redis.call('SADD', base .. 'dependents:' .. d, unpack(members))
return n
"""


async def _deps_release(c: Ctx) -> Awaitable[Any]:
    """A dependency whose 1,000 dependents (one call's budget) wait for it alone: telling
    them copies its result (4 KiB) into each one's depres and releases each."""
    dep = f"D{c.round}"
    await c.raw.eval(_DEPENDENTS, 0, c.base, dep, MAX_JOBS_PER_CALL)
    return c.run("deps", [c.base, "more", dep, 1, "r" * 4096])


async def _schedule(c: Ctx) -> Awaitable[Any]:
    keys = [*c.s.lanes, c.s.keys.cron_next]
    await c.s.schedule_put("sch", json.dumps({"task": "work"}), 1)
    args = [c.base, "sch", 1, HUGE, f"tick{c.round}", "p", "work", 3, -1, 0, ""]
    return c.run("schedule", args, keys)


async def _schedules(c: Ctx) -> Awaitable[Any]:
    keys = [c.s.keys.cron_defs, c.s.keys.cron_next]
    return c.run("schedules", [c.base, "put", f"s{c.round}", "x" * 10_000, HUGE], keys)


async def _replace(c: Ctx) -> Awaitable[Any]:
    holder = ids("r", 0, 1)[0]
    return c.run("replace", [c.base, "k", holder, "p", "", -1, -1, 60_000])


async def _progress(c: Ctx) -> Awaitable[Any]:
    return c.run("progress", [c.base, ids("r", JOBS - 1, 1)[0], json.dumps({"p": 1})])


async def _tasks(c: Ctx) -> Awaitable[Any]:
    # a full table (the cap) whose entries each name 8 workers, and a put of as many names
    if c.round == 0:
        entry = " ".join(f"w{i}" for i in range(8)) + "\n{}"
        await c.raw.hset(c.base + "tasks", mapping={f"t{i}": entry for i in range(1000)})
    pairs = [x for i in range(MAX_JOBS_PER_CALL) for x in (f"t{i}", '{"max_attempts": 3}')]
    return c.run("tasks", [c.base, "put", f"w{c.round}", *pairs])


async def _rekey(c: Ctx) -> Awaitable[Any]:
    # one entry of as many fields as a call takes, none matching what is stored
    n = MAX_JOBS_PER_CALL - 1
    triples = [x for j in range(n) for x in (f"f{j}", "old", "new")]
    return c.run("rekey", [c.base, "job:" + ids("r", JOBS - 1, 1)[0], n, *triples])


async def _wait(c: Ctx) -> Awaitable[Any]:
    job_id, tok = (await c.leased())[0]  # an event wait: parked, in the event's set
    return c.run("wait", [c.base, job_id, tok, 1, 600_000, f"ev{c.round}", 0])


async def _joblog(c: Ctx) -> Awaitable[Any]:
    job_id, tok = (await c.leased())[0]
    lines = ["x" * 130] * JOB_LOG_LINES  # as many lines as a call takes, past the byte cap
    return c.run("joblog", [c.base, job_id, tok, *lines])


async def _step(c: Ctx) -> Awaitable[Any]:
    job_id, tok = (await c.leased())[0]
    return c.run("step", [c.base, job_id, tok, "put", f"s{c.round}", "v" * 10_000])


async def _why(c: Ctx) -> Awaitable[Any]:
    # a queued job at the far end of the ready list: the position search runs to its bound
    return c.run("why", [c.base, (await c.tail())[-1]])


async def _signal(c: Ctx) -> Awaitable[Any]:
    # an event whose set holds more members than a call wakes, none of them parked for it
    key = f"sig{c.round}"
    await c.raw.sadd(f"{c.base}evt:{key}", *ids("r", 0, 2 * MAX_JOBS_PER_CALL))
    return c.run("signal", [c.base, key, "payload"])


async def _change(c: Ctx) -> Awaitable[Any]:
    return c.run("change", [c.base, (await c.tail())[-1], 5, -1, -1])


async def _limit(c: Ctx) -> Awaitable[Any]:
    # as many limits as a holder may need, each at its concurrency with its most holders
    # (all stale: each must be looked at) and a rate log of its most starts
    names = [f"L{i}" for i in range(8)]
    if c.round == 0:
        for name in names:
            st = f"{c.base}lim:{{{name}:k}}"
            await c.raw.hset(st + ":h", mapping={f"h{j}": 1 for j in range(1000)})
            await c.raw.rpush(st + ":log", *range(1000))
    lim = {"b": c.base, "l": [[name, "k", 1000, 1000, 1, 1000] for name in names]}
    return c.run("limit", [c.base, "acquire", json.dumps({"lim": lim}), f"code{c.round}", 60_000])


ROWS: dict[str, Row] = {
    "enqueue": _enqueue,
    "claim": _claim,
    "complete": _complete,
    "complete:fan-in": _complete_fan_in,
    "complete_claim": _complete_claim,
    "fail": _fail,
    "release": _release,
    "extend": _extend,
    "watch": _watch,
    "reap": _reap,
    "beat": _beat,
    "tasks": _tasks,
    "configure": _configure,
    "batch": _batch,
    "cancel": _cancel,
    "deps": _deps,
    "deps:release": _deps_release,
    "schedule": _schedule,
    "schedules": _schedules,
    "requeue": _requeue,
    "promote": _promote,
    "purge": _purge,
    "replace": _replace,
    "page": _page,
    "peek": _peek,
    "progress": _progress,
    "rekey": _rekey,
    "wait": _wait,
    "joblog": _joblog,
    "step": _step,
    "why": _why,
    "signal": _signal,
    "change": _change,
    "limit": _limit,
}


def test_every_script_has_a_row() -> None:
    # a script may have more than one row ("<script>:<path>")
    assert {n.split(":")[0] for n in ROWS} == set(SCRIPTS), "a script without a bounded-work row"


# a backstop for a hang: what is asserted is each script's server time (INFO commandstats), not
# the wall time, and filling and draining 200,000 jobs takes 100 s and more on a busy machine
# (the 120 s default ran out there, 2026-11-28)
@pytest.mark.no_cover  # a test of scale: coverage paused (tests/conftest.py, "Coverage")
@pytest.mark.timeout(600)
async def test_every_script_stays_under_50_ms_at_200k_jobs(full: tuple[App, Redis]) -> None:
    app, raw = full
    c = Ctx(app, raw)
    figures: dict[str, list[float]] = {name: [] for name in ROWS}
    for c.round in range(ROUNDS + EXTRA):
        # the extra rounds only for a script not yet seen under the limit: on a machine
        # whose cores other processes keep busy, a quiet moment comes sooner or later
        again = [n for n in ROWS if c.round < ROUNDS or min(figures[n]) >= LIMIT_MS]
        for name in again:
            call = await ROWS[name](c)
            figures[name].append(await server_ms(raw, call))
    # the least of the rounds is the script's own cost: on a loaded machine (other processes
    # on the server's cores) every figure inflates, the least the least (the median and each
    # round are printed too)
    print(f"\nserver ms per call at {JOBS:,} jobs (least, median of {ROUNDS}+; all):")
    least = {n: min(f) for n, f in figures.items()}
    for name, f in sorted(figures.items(), key=lambda kv: -least[kv[0]]):
        print(
            f"  {name:15} {least[name]:8.2f} {statistics.median(f):8.2f}   "
            + " ".join(f"{x:.2f}" for x in f)
        )
    slow = {n: m for n, m in least.items() if m >= LIMIT_MS}
    assert not slow, f"scripts over {LIMIT_MS} ms: {slow}"


async def test_more_than_the_cap_is_refused_before_any_work(full: tuple[App, Redis]) -> None:
    app, raw = full
    c = Ctx(app, raw)
    over = MAX_JOBS_PER_CALL + 1
    tail = [text(x) for x in await raw.lrange(c.base + "ready", -over, -1)]
    calls: dict[str, list[Any]] = {
        "cancel": [c.base, 0, *tail],
        "promote": [c.base, *tail],
        "requeue": [c.base, *tail],
        "purge": [c.base, "ids", "queued", 0, *tail],
        "peek": [c.base, 1, "s", *tail],
        "extend": [c.base, 1000, over, *[x for i in tail for x in (i, "t")]],
        "release": [c.base, 0, 0, 0, over, *[x for i in tail for x in (i, "t")]],
        "complete": [c.base, over, *[x for i in tail for x in (i, "t", "r", 0)]],
        "enqueue": [c.base, 1, "work", 3, -1, -1, 0, "", "", "", "", "", over]
        + [x for i in tail for x in ("n" + i, "p")],
        "beat": [c.base, "w-over", 60_000, 1000, 0, *INFO, 0, over]
        + [x for i in tail for x in (i, "t")],
        "complete_claim": [c.base, 1, 1000, 0, "", 0, "ef", "", "", over]
        + [x for i in tail for x in (i, "t", "r", 0)],
        "batch": [c.base, "add", "b-over", *tail],
        "deps": [c.base, "add", "n-over", "work", "p", 3, 0, "", "", "cancel", 0]
        + [c.base + i for i in tail],
        "rekey": [c.base, "job:" + tail[0], over, *[x for _ in tail for x in ("f", "a", "b")]],
        "tasks": [c.base, "put", "w-over", *[x for i in range(over) for x in (f"t{i}", "{}")]],
    }
    for name, args in calls.items():
        with pytest.raises(ServerRefused, match=r"at most \d+ jobs a call"):
            await c.run(name, args)
    # nothing moved, nothing registered
    assert await raw.llen(c.base + "ready") == JOBS
    assert await raw.zscore(c.base + "workers", "w-over") is None
    assert not await raw.exists(c.base + "job:n" + tail[0])
    assert not await raw.exists(c.base + "tasks")


async def test_a_heartbeat_renews_more_leases_than_one_call_takes(app: App) -> None:
    # a worker of high concurrency holds more leases than one script call names: its
    # heartbeat renews them all, in calls of at most the cap each
    @app.task
    async def work(i: int) -> None:
        pass

    await work.enqueue_many([((i,), {}) for i in range(1500)])
    q = app.queue()
    held: list[tuple[str, str]] = []
    while len(held) < 1500:
        res = await q._scripts.claim(MAX_JOBS_PER_CALL, 600_000, 0)
        assert res.jobs
        held += [(c.id, c.token) for c in res.jobs]
    info = ["host", 1, "v", "default", 1500, 0, 0, 0, 0]
    outcomes = await q.leases.beat("w-big", 60_000, 600_000, 0, info, held)
    assert outcomes == [Outcome.OK] * 1500


async def test_a_batch_counts_in_more_members_than_one_call_takes(app: App) -> None:
    # members on another queue are counted into the batch before they exist: in calls of at
    # most the cap each, so a batch may be larger
    @app.task(queue="elsewhere")
    async def far(i: int) -> None:
        pass

    @app.task
    async def near(i: int) -> None:
        pass

    calls = [far.call(i) if i % 2 else near.call(i) for i in range(2 * MAX_JOBS_PER_CALL + 100)]
    batch: Any = await app.batch(calls)
    info = await batch.info()
    assert info.total == len(calls)
