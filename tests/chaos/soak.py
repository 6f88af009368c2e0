"""The chaos soak: the contract (I1, I2, I3, I5, I8) under random faults, with figures.

Worker processes (``tests.chaos.chaosapp``) and concurrent producers work through tens of
thousands of jobs of mixed durations, priorities, groups and delays on a private server with an
append-only file, while the soak

- SIGKILLs random worker processes (and restarts them), besides the poison jobs that kill the
  worker running them;
- kills random connections of workers and producers with ``CLIENT KILL``;
- restarts the server (SIGTERM, AOF replayed), and in the long mode also SIGKILLs it and
  restarts it from its AOF.

Then it checks: every job completed, or (poison and doomed jobs, and only they) dead-lettered
with the expected reason; none lost; none completed twice in the store; side effects repeated
only for jobs whose earlier run was on a worker that died; no lease left; every job record gone
once retention has run, and the server's memory back near its baseline. It prints a JSON summary::

    python -m tests.chaos.soak                      # the bounded mode CI runs (~45 s)
    python -m tests.chaos.soak --long               # 40,000 jobs, ~3 minutes
    python -m tests.chaos.soak --jobs N --seconds S --workers W --seed X

Exit status 0 when every check passed, 1 otherwise.

How store completions are observed: result records expire after ``result_ttl``, so a monitor
polls every unfinished job's record (one pipelined ``HMGET`` per job, every half second) and
remembers when each was first seen finished; a finished record seen later in another state or
with another finish time counts as completed twice, as does a ``completed`` counter above the
number of distinct completed jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import redis.exceptions as rexc
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from aioqueue import AioQueueError, App, EmbeddedServer
from aioqueue._model.keys import QueueKeys
from aioqueue._store.loader import SCRIPTS

from ..support.invariants import check_invariants
from ..support.prewarmed import spawn_aioqueue
from ..support.processes import Process
from ..support.server import text
from .chaosapp import POISON_EXIT, WF_QUEUES, WfKeys, done_key, register_workflows, started_key
from .cluster import ClusterServer
from .wfsoak import WfPlan, check_workflows, enqueue_workflows, plan_workflows, signal_waiters

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER_NAME = "chaos-w"
PRODUCER_NAME = "chaos-p"


@dataclass(frozen=True, slots=True)
class SoakConfig:
    """One soak run. Times are seconds."""

    jobs: int = 8000
    seconds: float = 30.0  # the chaos phase; producers enqueue over its first 60 %
    workers: int = 3
    concurrency: int = 32
    producers: int = 6
    seed: int = 1
    lease: float = 3.0
    result_ttl: float = 6.0
    dead_ttl: float = 6.0
    worker_kills: int = 8
    client_kill_rounds: int = 8
    server_restarts: int = 1  # SIGTERM (AOF flushed), then start on the same AOF
    server_crashes: int = 0  # SIGKILL, then start on the same AOF
    poison: int = 2
    doomed: int = 6
    # a phase that waits for work (warm-up, drain, retention, workers starting) gives up when
    # its work has not moved for this long, however long it has run: a busy machine gets the
    # time it needs, and a stuck run still ends
    stall_timeout: float = 60.0
    memory_tolerance: int = 512 * 1024
    # on a local cluster (3 primaries, 3 replicas): a server crash is a failover of the
    # queue's primary (killed, its replica promoted); memory is not compared (the queue's
    # primary changes)
    cluster: bool = False
    # DAG workflows (wfsoak.py) on queues of their own, stored before the faults begin; their
    # first steps sleep (parked) into the chaos phase, spread over its first 60 %
    workflows: int = 24

    @classmethod
    def long(cls, **overrides: Any) -> SoakConfig:
        """The longer local mode: 40,000 jobs over about three minutes."""
        base = cls(
            jobs=40_000,
            seconds=150.0,
            workers=3,
            concurrency=48,
            worker_kills=30,
            client_kill_rounds=30,
            server_restarts=2,
            server_crashes=1,
            poison=5,
            doomed=20,
            workflows=100,
        )
        return replace(base, **overrides)


@dataclass(frozen=True, slots=True)
class JobPlan:
    """One job the producers enqueue, and what must become of it."""

    id: str
    task: str
    kwargs: dict[str, Any]
    delay: float | None
    priority: int
    group: str | None
    expect: str  # "completed" or "failed"
    reason: str | None = None  # the error type of an expected dead letter
    at: float = 0.0  # seconds after the start of the producers
    max_attempts: int = 25  # by-name enqueue does not know the task's own setting


def plan_jobs(cfg: SoakConfig, rng: random.Random) -> list[JobPlan]:
    """The jobs of a run: mostly quick ones, some long (beyond the lease), some failing once,
    a few doomed (always raise) and poison (kill their worker)."""
    spread = cfg.seconds * 0.6
    special = rng.sample(range(cfg.jobs // 10, cfg.jobs // 2), cfg.poison + cfg.doomed)
    poison = set(special[: cfg.poison])
    doomed = set(special[cfg.poison :])
    plans = []
    for i in range(cfg.jobs):
        jid = f"s{cfg.seed}-{i:06d}"
        at = spread * i / cfg.jobs
        if i in poison:
            plans.append(
                JobPlan(jid, "poison", {"i": i}, None, 0, None, "failed", "LeaseExpired", at, 3)
            )
            continue
        if i in doomed:
            plans.append(
                JobPlan(jid, "doomed", {"i": i}, None, 0, None, "failed", "ValueError", at, 2)
            )
            continue
        roll = rng.random()
        if roll < 0.45:
            ms = 0
        elif roll < 0.80:
            ms = rng.randint(1, 20)
        elif roll < 0.95:
            ms = rng.randint(20, 200)
        elif roll < 0.99:
            ms = rng.randint(200, 1000)
        else:
            ms = rng.randint(int(cfg.lease * 1000) + 500, int(cfg.lease * 1000) + 2500)
        task = "flaky" if rng.random() < 0.03 else "work"
        delay = round(rng.uniform(0.05, 2.0), 3) if rng.random() < 0.08 else None
        priority = rng.choice([p for p in range(-10, 11) if p]) if rng.random() < 0.15 else 0
        group = f"tenant-{rng.randrange(6)}" if rng.random() < 0.25 else None
        plans.append(
            JobPlan(jid, task, {"i": i, "ms": ms}, delay, priority, group, "completed", at=at)
        )
    return plans


# ---------------------------------------------------------------------- worker processes
@dataclass(slots=True)
class _Proc:
    popen: Process
    name: str
    log: Path


class WorkerPool:
    """Keeps ``n`` worker processes running: whichever dies is replaced at once."""

    def __init__(self, cfg: SoakConfig, url: str, prefix: str, log_dir: Path) -> None:
        self.cfg = cfg
        self.url = url
        self.prefix = prefix
        self.log_dir = log_dir
        self.procs: list[_Proc] = []
        self.all: list[_Proc] = []
        self.killed: set[int] = set()  # pids we SIGKILLed
        self.poisoned: set[int] = set()  # pids a poison job killed
        self.unexpected: list[str] = []  # other deaths: "name pid code"
        self.start_failures: list[str] = []  # workers that could not connect at startup
        self.restarts = 0
        self._stopping = False

    @property
    def dead_pids(self) -> set[int]:
        """Every worker pid that died with jobs possibly in flight."""
        return self.killed | self.poisoned

    def start(self) -> None:
        for _ in range(self.cfg.workers):
            self.procs.append(self._spawn())

    def _spawn(self) -> _Proc:
        n = len(self.all) + 1
        name = f"{WORKER_NAME}{n}"
        log = self.log_dir / f"worker{n}.log"
        env = dict(os.environ)
        env.update(
            AIOQUEUE_REDIS_URL=self.url,
            CHAOS_PREFIX=self.prefix,
            CHAOS_LEASE=str(self.cfg.lease),
            CHAOS_RESULT_TTL=str(self.cfg.result_ttl),
            CHAOS_DEAD_TTL=str(self.cfg.dead_ttl),
            CHAOS_CLIENT_NAME=name,
        )
        args = ["worker", "tests.chaos.chaosapp:app"]
        args += ["--url", self.url, "--concurrency", str(self.cfg.concurrency), "--grace", "5"]
        args += ["--log-level", "WARNING"]
        if self.cfg.workflows:
            args += [a for q in ("default", *WF_QUEUES) for a in ("-q", q)]
        popen = spawn_aioqueue(args, cwd=REPO_ROOT, env=env, log=log)
        proc = _Proc(popen, name, log)
        self.all.append(proc)
        return proc

    def kill_random(self, rng: random.Random) -> int | None:
        """SIGKILL one running worker (it is replaced by ``supervise``); its pid."""
        alive = [p for p in self.procs if p.popen.poll() is None]
        if not alive:
            return None
        victim = rng.choice(alive)
        self.killed.add(victim.popen.pid)
        victim.popen.kill()
        return victim.popen.pid

    def supervise(self) -> None:
        """Replace dead workers, recording why each died."""
        if self._stopping:
            return
        for i, proc in enumerate(self.procs):
            code = proc.popen.poll()
            if code is None:
                continue
            self._classify(proc, code)
            self.procs[i] = self._spawn()
            self.restarts += 1

    def _classify(self, proc: _Proc, code: int) -> None:
        """Record why a worker died."""
        pid = proc.popen.pid
        if pid in self.killed:
            pass
        elif code == POISON_EXIT:
            self.poisoned.add(pid)
        elif code == 1 and "cannot reach Redis" in proc.log.read_text(errors="replace"):
            # the server was down or loading for longer than the CLI's --connect-timeout (60 s)
            # while this worker started; replaced like any other
            self.start_failures.append(f"{proc.name}: {_last_line(proc.log)}")
        else:
            self.unexpected.append(f"{proc.name} pid {pid} exit {code}")

    async def stop(self, timeout: float = 20.0) -> list[str]:
        """SIGTERM every worker and wait; problems (non-zero exits, hangs) are returned."""
        self._stopping = True
        problems = []
        signalled = []
        for proc in self.procs:
            code = proc.popen.poll()
            if code is None:
                proc.popen.send_signal(signal.SIGTERM)
                signalled.append(proc)
            else:
                self._classify(proc, code)
        deadline = time.monotonic() + timeout
        for proc in signalled:
            while time.monotonic() < deadline:
                if proc.popen.poll() is not None:
                    break
                await asyncio.sleep(0.05)
            if proc.popen.poll() is None:
                problems.append(f"{proc.name} ignored SIGTERM for {timeout} s")
                proc.popen.kill()
            elif proc.popen.returncode != 0:
                problems.append(f"{proc.name} exited with {proc.popen.returncode} on SIGTERM")
        return problems

    def kill_all(self) -> None:
        """Teardown: SIGKILL and reap every process ever started."""
        self._stopping = True
        for proc in self.all:
            if proc.popen.poll() is None:
                proc.popen.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(10)

    def log_tails(self, names: Sequence[str] | None = None, chars: int = 2000) -> str:
        out = []
        for proc in self.all:
            if names is None or proc.name in names:
                text = proc.log.read_text(errors="replace") if proc.log.exists() else ""
                out.append(f"--- {proc.name} (pid {proc.popen.pid}):\n{text[-chars:]}")
        return "\n".join(out)


def _last_line(path: Path) -> str:
    lines = path.read_text(errors="replace").strip().splitlines()
    return lines[-1] if lines else ""


# ---------------------------------------------------------------------- observing the store
# The monitor reads each unfinished job's record twice a second, on the event loop that also
# runs the producers: one command per 2,000 records instead of a pipeline of 2,000 HMGETs. The
# pipeline cost the soak's process about a quarter of its run in redis-py's command packing and
# reply parsing (cProfile, with both cores loaded: 13.8 of 55 s), enough to put the producers
# behind their schedule on a starved CPU.
READ_RECORDS = """
local out = {}
for i, key in ipairs(KEYS) do out[i] = redis.call('HMGET', key, 's', 'f', 'e') end
return out
"""


@dataclass(slots=True)
class Tracker:
    """What the monitor saw of each job's record."""

    pending: set[str] = field(default_factory=set)  # enqueued, not yet seen finished
    # ids whose record may not exist yet (a parent's children): pending once seen
    expected: set[str] = field(default_factory=set)
    finished: dict[str, tuple[str, bytes, str]] = field(default_factory=dict)  # state, f, reason
    alive: set[str] = field(default_factory=set)  # finished, record still there: re-checked
    vanished: set[str] = field(default_factory=set)  # record gone before seen finished
    regressions: list[str] = field(default_factory=list)  # finished, then seen otherwise
    polls: int = 0
    poll_errors: int = 0

    async def poll(self, redis: Redis, keys: QueueKeys) -> None:
        ids = [*self.expected, *self.pending, *self.alive]
        for start in range(0, len(ids), 2000):
            chunk = ids[start : start + 2000]
            job_keys = [keys.job(jid) for jid in chunk]
            replies = await redis.eval(READ_RECORDS, len(job_keys), *job_keys)
            for jid, (s, f, e) in zip(chunk, replies, strict=True):
                self._see(jid, s, f, e)
        self.polls += 1

    def _see(self, jid: str, s: bytes | None, f: bytes | None, e: bytes | None) -> None:
        state = s.decode() if s is not None else None
        if jid in self.expected:
            if state is None:
                return
            self.expected.discard(jid)
            self.pending.add(jid)
        if jid in self.pending:
            if state is None:
                self.pending.discard(jid)
                self.vanished.add(jid)
            elif state in ("completed", "failed", "cancelled"):
                self.pending.discard(jid)
                self.finished[jid] = (state, f or b"", _reason(e))
                self.alive.add(jid)
        elif jid in self.alive:
            if state is None:
                self.alive.discard(jid)  # its retention ran out
            elif (state, f or b"") != self.finished[jid][:2]:
                self.regressions.append(f"{jid}: {self.finished[jid][0]} then {state}")
                self.alive.discard(jid)


def _reason(e: bytes | None) -> str:
    if not e:
        return ""
    try:
        return str(json.loads(e)["type"])
    except (ValueError, KeyError, TypeError):
        return "?"


async def used_memory(redis: Redis) -> int:
    info = await redis.info("memory")
    return int(info["used_memory"])


async def settled_memory(redis: Redis, timeout: float = 15.0) -> int:
    """``used_memory`` once nothing is left to free in the background (DEL is lazy on
    Valkey) and two readings 250 ms apart agree within 4 KiB."""
    deadline = time.monotonic() + timeout
    last = -1
    while True:
        info = await redis.info("memory")
        used = int(info["used_memory"])
        pending = int(info.get("lazyfree_pending_objects", 0))
        if (pending == 0 and abs(used - last) < 4096) or time.monotonic() > deadline:
            return used
        last = used
        await asyncio.sleep(0.25)


async def memory_stats(redis: Redis) -> dict[str, int]:
    """``MEMORY STATS``, flattened to its numeric fields."""
    raw = await redis.execute_command("MEMORY", "STATS")  # type: ignore[no-untyped-call]
    pairs = dict(zip(raw[::2], raw[1::2], strict=True)) if isinstance(raw, list) else raw
    out: dict[str, int] = {}
    for k, v in pairs.items():
        name = k.decode() if isinstance(k, bytes) else str(k)
        if isinstance(v, int):
            out[name] = v
        elif isinstance(v, list):  # db.0: [overhead.hashtable.main, n, ...]
            for kk, vv in zip(v[::2], v[1::2], strict=True):
                if isinstance(vv, int):
                    sub = kk.decode() if isinstance(kk, bytes) else str(kk)
                    out[f"{name}.{sub}"] = vv
    return out


def memory_diff(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The fields of two ``memory_stats`` that moved by more than 1 KiB."""
    names = sorted(set(before) | set(after))
    return {
        n: after.get(n, 0) - before.get(n, 0)
        for n in names
        if abs(after.get(n, 0) - before.get(n, 0)) > 1024
    }


async def load_scripts(redis: Redis) -> None:
    """Load every script, so the script cache is the same at the baseline and at the end."""
    for script in SCRIPTS.values():
        await redis.script_load(script.source)
    await redis.script_load(READ_RECORDS)


async def count_keys(redis: Redis, match: str) -> int:
    return len([k async for k in redis.scan_iter(match=match, count=2000)])


def admin_client(url: str) -> Redis:
    """The soak's own client: retries through killed connections and server restarts."""
    return Redis.from_url(
        url,
        client_name="chaos-admin",
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.02), 100),
        retry_on_error=[rexc.ConnectionError, rexc.TimeoutError],
    )


class Phases:
    """Wall-clock seconds per phase of a run, so a slow run shows where its time went."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        began = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.monotonic() - began

    def report(self) -> dict[str, float]:
        """Each phase, then ``total`` and ``unaccounted`` (total minus the phases)."""
        total = time.monotonic() - self.started
        out = {name: round(s, 1) for name, s in self.seconds.items()}
        out["total"] = round(total, 1)
        out["unaccounted"] = round(total - sum(self.seconds.values()), 1)
        return out


async def until_done(
    left: Callable[[], Awaitable[int]], *, stall: float, interval: float = 0.2
) -> int:
    """Poll ``left()`` (how much work remains) until it is 0, or until it has not gone down
    for ``stall`` seconds: a deadline that follows progress, so a slow (loaded) machine gets
    the time it needs while a stuck run still ends. Returns what was left."""
    best = await left()
    last_progress = time.monotonic()
    while best > 0:
        if time.monotonic() - last_progress > stall:
            return best
        await asyncio.sleep(interval)
        now = await left()
        if now < best:
            best, last_progress = now, time.monotonic()
    return 0


# ---------------------------------------------------------------------- the run
@dataclass(slots=True)
class _Counts:
    enqueue_retries: int = 0
    client_kill_rounds: int = 0
    connections_killed: int = 0
    server_restarts: int = 0
    server_crashes: int = 0
    restart_downtime_ms: list[str] = field(default_factory=list)  # "restart 412", "crash 530"
    longest_outage: float = 0.0  # seconds
    # (wall-clock ms the server went down, ms it answered again), per restart or crash
    outages: list[tuple[int, int]] = field(default_factory=list)
    peak_memory: int = 0
    # wall-clock ms each job's enqueue was acknowledged
    acked_ms: dict[str, int] = field(default_factory=dict)


async def _produce(
    apps: list[App], plans: list[JobPlan], cfg: SoakConfig, tracker: Tracker, counts: _Counts
) -> None:
    t0 = time.monotonic()
    queue = iter(plans)

    async def producer(app: App) -> None:
        for plan in queue:  # shared iterator: each plan goes to one producer
            wait = t0 + plan.at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            backoff = 0.02
            while True:
                try:
                    await app.queue().enqueue(
                        plan.task,
                        kwargs=plan.kwargs,
                        delay=plan.delay,
                        priority=plan.priority,
                        group=plan.group,
                        max_attempts=plan.max_attempts,
                        job_id=plan.id,  # idempotent: a retry after a lost reply is harmless
                    )
                    break
                except (AioQueueError, rexc.RedisError, OSError):
                    counts.enqueue_retries += 1
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 0.5)
            tracker.pending.add(plan.id)
            counts.acked_ms[plan.id] = time.time_ns() // 1_000_000

    await asyncio.gather(*(producer(apps[i % len(apps)]) for i in range(cfg.producers)))


async def _client_kill(admin: Redis, rng: random.Random, server: Any = None) -> int:
    """Kill about half of the workers' and producers' connections; how many."""
    if isinstance(server, ClusterServer):
        return await _client_kill_cluster(server, rng)
    clients = await admin.client_list()
    victims = [
        c["id"]
        for c in clients
        if c.get("name", "").startswith((WORKER_NAME, PRODUCER_NAME)) and rng.random() < 0.5
    ]
    killed = 0
    for cid in victims:
        with contextlib.suppress(rexc.ResponseError):  # it closed meanwhile
            await admin.execute_command("CLIENT", "KILL", "ID", cid)  # type: ignore[no-untyped-call]
            killed += 1
    return killed


async def _client_kill_cluster(server: ClusterServer, rng: random.Random) -> int:
    """``_client_kill`` on every node of a cluster."""
    clients = await asyncio.to_thread(server.client_list)
    killed = 0
    for c in clients:
        if c.get("name", "").startswith((WORKER_NAME, PRODUCER_NAME)) and rng.random() < 0.5:
            with contextlib.suppress(rexc.ResponseError, rexc.ConnectionError):
                await asyncio.to_thread(server.client_kill, c["port"], c["id"])
                killed += 1
    return killed


async def _chaos(
    cfg: SoakConfig,
    rng: random.Random,
    server: EmbeddedServer | ClusterServer,
    admin: Redis,
    pool: WorkerPool,
    counts: _Counts,
) -> None:
    """Run the faults at random times over ``cfg.seconds``, one at a time."""
    length = cfg.seconds
    events: list[tuple[float, str]] = []
    events += [(rng.uniform(0.05, 0.9) * length, "kill") for _ in range(cfg.worker_kills)]
    events += [(rng.uniform(0.05, 0.9) * length, "client") for _ in range(cfg.client_kill_rounds)]
    n_srv = cfg.server_restarts + cfg.server_crashes
    kinds = ["restart"] * cfg.server_restarts + ["crash"] * cfg.server_crashes
    rng.shuffle(kinds)
    for k, kind in enumerate(kinds):  # spread over the middle of the run
        events.append(((0.25 + 0.5 * (k + 0.5) / n_srv) * length, kind))
    events.sort()
    t0 = time.monotonic()
    for at, kind in events:
        wait = t0 + at - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        if kind == "kill":
            pool.kill_random(rng)
        elif kind == "client":
            counts.connections_killed += await _client_kill(admin, rng, server)
            counts.client_kill_rounds += 1
        else:
            began = time.monotonic()
            began_ms = time.time_ns() // 1_000_000
            if kind == "restart":
                await asyncio.to_thread(server.restart)
                counts.server_restarts += 1
            else:
                await asyncio.to_thread(server.kill_and_restart)
                counts.server_crashes += 1
            down = time.monotonic() - began
            counts.restart_downtime_ms.append(f"{kind} {down * 1000:.0f}")
            counts.longest_outage = max(counts.longest_outage, down)
            counts.outages.append((began_ms, time.time_ns() // 1_000_000))


@dataclass(slots=True)
class _Workflows:
    """The run's workflows: their producer, plans and monitors (one per queue)."""

    app: App | None = None
    plans: list[WfPlan] = field(default_factory=list)
    trackers: dict[str, Tracker] = field(default_factory=dict)
    signals_woke: int = 0
    signal_rounds: int = 0

    def finished(self) -> dict[str, tuple[str, bytes, str]]:
        out: dict[str, tuple[str, bytes, str]] = {}
        for t in self.trackers.values():
            out.update(t.finished)
        return out

    def left(self) -> int:
        return sum(len(t.pending) + len(t.expected) for t in self.trackers.values())

    async def poll(self, admin: Redis, prefix: str) -> None:
        for q, t in self.trackers.items():
            await t.poll(admin, QueueKeys(prefix, q))

    async def signal(self) -> None:
        """Until cancelled: signal the waiters not yet seen done (a task of its own, so that
        a signal held up by a server outage holds up nothing else)."""
        if self.app is None:
            return
        while True:
            self.signals_woke += await signal_waiters(self.app, self.plans, self.finished())
            self.signal_rounds += 1
            await asyncio.sleep(0.3)


async def _start_workflows(
    cfg: SoakConfig, url: str, prefix: str, stack: contextlib.AsyncExitStack
) -> _Workflows:
    """Store the run's workflows (before the faults) and start monitoring their jobs."""
    if not cfg.workflows:
        return _Workflows()
    app = await stack.enter_async_context(
        App(
            url,
            prefix=prefix,
            result_ttl=cfg.result_ttl,
            dead_ttl=cfg.dead_ttl,
            max_attempts=25,  # as the workers' App: a step may meet many kills
            redis_options={"client_name": f"{PRODUCER_NAME}-wf"},
        )
    )
    rng = random.Random(cfg.seed + 1)  # the plain jobs' and the faults' draws stay as they were
    plans = plan_workflows(cfg.workflows, cfg.seconds * 0.6, cfg.seed, rng)
    await enqueue_workflows(app, register_workflows(app), plans)
    trackers = {q: Tracker() for q in WF_QUEUES}
    for p in plans:
        children = set(p.child_ids)
        for jid, q in p.all_ids().items():
            (trackers[q].expected if jid in children else trackers[q].pending).add(jid)
    return _Workflows(app, plans, trackers)


async def _background(
    admin: Redis,
    keys: QueueKeys,
    tracker: Tracker,
    pool: WorkerPool,
    counts: _Counts,
    wf: _Workflows,
) -> None:
    """Supervise workers, poll job records and sample memory until cancelled."""
    last_poll = 0.0
    last_mem = 0.0
    while True:
        pool.supervise()
        now = time.monotonic()
        if now - last_poll >= 0.5:
            try:
                await tracker.poll(admin, keys)
                await wf.poll(admin, keys.prefix)
            except (rexc.RedisError, OSError):
                tracker.poll_errors += 1
            last_poll = time.monotonic()
        if now - last_mem >= 1.0 and not isinstance(admin, RedisCluster):
            with contextlib.suppress(rexc.RedisError, OSError):
                counts.peak_memory = max(counts.peak_memory, await used_memory(admin))
            last_mem = now
        await asyncio.sleep(0.05)


async def run_soak(cfg: SoakConfig, workdir: Path | None = None) -> dict[str, Any]:
    """Run one soak and return its summary (``summary["ok"]``, ``summary["failures"]``)."""
    own_dir = workdir is None
    base = Path(tempfile.mkdtemp(prefix="aioqueue-soak-")) if workdir is None else workdir
    log_dir = base / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(cfg.seed)
    plans = plan_jobs(cfg, rng)
    prefix = f"soak{cfg.seed}"
    phases = Phases()
    server: EmbeddedServer | ClusterServer
    with phases("server_start"):
        if cfg.cluster:
            server = ClusterServer(QueueKeys(prefix, "default").stats)
        else:
            server = EmbeddedServer(base / "valkey", appendonly=True)
        await asyncio.to_thread(server.start)
    pool = WorkerPool(cfg, server.url, prefix, log_dir)
    admin = server.admin() if isinstance(server, ClusterServer) else admin_client(server.url)
    summary: dict[str, Any] = {}
    try:
        summary = await _soak(cfg, rng, plans, server, admin, pool, prefix, phases)
    finally:
        with phases("teardown"):
            await asyncio.to_thread(pool.kill_all)
            await admin.aclose()
            await asyncio.to_thread(server.stop)
    summary["seconds"] = phases.report()
    if not summary["ok"]:
        summary["worker_logs"] = pool.log_tails(
            [u.split()[0] for u in pool.unexpected] or None, chars=1500
        )[-8000:]
        summary["workdir"] = str(base)
    elif own_dir:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    return summary


async def _soak(
    cfg: SoakConfig,
    rng: random.Random,
    plans: list[JobPlan],
    server: EmbeddedServer | ClusterServer,
    admin: Redis,
    pool: WorkerPool,
    prefix: str,
    phases: Phases,
) -> dict[str, Any]:
    keys = QueueKeys(prefix, "default")
    counts = _Counts()
    tracker = Tracker()
    failures: list[str] = []
    with phases("workers_start"):
        await load_scripts(admin)
        pool.start()
        await _wait_for_workers(admin, cfg, pool, server)

    names = [f"{PRODUCER_NAME}{i + 1}" for i in range(2)]
    async with contextlib.AsyncExitStack() as stack:
        apps = [
            await stack.enter_async_context(
                App(
                    server.url,
                    prefix=prefix,
                    max_connections=max(cfg.producers, 2),
                    redis_options={"client_name": name},
                )
            )
            for name in names
        ]
        with phases("warm_up"):
            warm_stats = await _warm_up(apps[0], admin, keys, min(cfg.jobs // 2, 4000), cfg, rng)
        with phases("baseline"):
            await load_scripts(admin)
            baseline = 0 if cfg.cluster else await settled_memory(admin)
            baseline_stats = {} if cfg.cluster else await memory_stats(admin)
        counts.peak_memory = baseline
        with phases("workflows_enqueue"):
            wf = await _start_workflows(cfg, server.url, prefix, stack)
        # the supervisor (and the record monitor) run until the memory is measured, so a
        # worker killed by the last fault is replaced, and every worker is idle and alive
        background = asyncio.ensure_future(
            asyncio.gather(_background(admin, keys, tracker, pool, counts, wf), wf.signal())
        )
        try:
            with phases("chaos_and_enqueue"):
                producing = asyncio.ensure_future(_produce(apps, plans, cfg, tracker, counts))
                try:
                    await _chaos(cfg, rng, server, admin, pool, counts)
                    await producing
                finally:
                    if not producing.done():
                        producing.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await producing
            with phases("drain"):

                async def unfinished() -> int:
                    return len(tracker.pending) + wf.left()

                await until_done(unfinished, stall=cfg.stall_timeout)
                await tracker.poll(admin, keys)
                await wf.poll(admin, prefix)

            with phases("checks"):
                # every job has an outcome and the workers are idle: the queue is quiescent
                invariants = "ok"
                try:
                    await check_invariants(admin, keys)
                except AssertionError as exc:
                    invariants = str(exc)
                    failures.append(f"I1: {exc}")
                leases_left = await admin.zcard(keys.active)
                group_slots_left = await admin.hlen(keys.gactive)
                for q in wf.trackers:
                    qk = QueueKeys(prefix, q)
                    try:
                        await check_invariants(admin, qk)
                    except AssertionError as exc:
                        invariants = str(exc)
                        failures.append(f"I1 on {q}: {exc}")
                    leases_left += await admin.zcard(qk.active)
                    if await admin.zcard(qk.waiting):
                        failures.append(
                            f"jobs left waiting on {q}: {await admin.zcard(qk.waiting)}"
                        )
                long_outages = [(a, b) for a, b in counts.outages if (b - a) / 1000 > cfg.lease / 3]
                wf_verdict = await check_workflows(
                    admin, prefix, wf.plans, wf.finished(), pool.dead_pids, long_outages
                )
                failures += wf_verdict.failures
                for t in wf.trackers.values():
                    if t.regressions or t.vanished:
                        failures.append(f"workflows: {t.regressions[:5]} {sorted(t.vanished)[:5]}")
                raw_stats = await admin.hgetall(keys.stats)
                stats = {text(k): int(v) - warm_stats.get(text(k), 0) for k, v in raw_stats.items()}
                started_runs = await _runs(admin, started_key(prefix))
                done_runs = await _runs(admin, done_key(prefix))

            with phases("retention"):
                # wait for every job record to expire and the dead set to be trimmed
                job_match = keys.base + "job:*"

                async def unexpired() -> int:
                    with contextlib.suppress(AioQueueError):  # on a connection killed earlier
                        await apps[0].queue().reap()
                    # SCAN also expires what it meets
                    return (
                        await count_keys(admin, job_match)
                        + await admin.zcard(keys.dead)
                        + (await _wf_records(admin, prefix, wf))
                    )

                await until_done(unexpired, stall=cfg.stall_timeout, interval=0.5)
                records_left = await count_keys(admin, job_match) + await _wf_records(
                    admin, prefix, wf
                )
                dead_left = await admin.zcard(keys.dead)
                await admin.delete(started_key(prefix))
                await admin.delete(done_key(prefix))
                await admin.delete(*WfKeys(prefix).all())
        finally:
            background.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await background
        with phases("settle"):
            await load_scripts(admin)
            after = 0 if cfg.cluster else await settled_memory(admin)
            keys_left = await _keys_left(admin, prefix)
            moved = {} if cfg.cluster else memory_diff(baseline_stats, await memory_stats(admin))
        with phases("stop_workers"):
            stop_problems = await pool.stop(timeout=cfg.stall_timeout)
        with phases("close_producers"):
            await stack.aclose()

    # ------------------------------------------------------------------ verdict
    expected = {p.id: p for p in plans}
    completed = {j for j, (s, _, _) in tracker.finished.items() if s == "completed"}
    dead = {j: r for j, (s, _, r) in tracker.finished.items() if s == "failed"}
    other = {j: s for j, (s, _, _) in tracker.finished.items() if s not in ("completed", "failed")}
    lost = sorted(set(expected) - set(tracker.finished))
    # on a cluster: an enqueue acknowledged between a failover's replication checkpoint and
    # the kill may be lost with the primary (asynchronous replication, docs/guarantees.md)
    windows = server.windows if isinstance(server, ClusterServer) else []
    lost_in_window = [
        j for j in lost if any(a <= counts.acked_ms.get(j, 0) <= b for a, b in windows)
    ]
    lost = [j for j in lost if j not in lost_in_window]
    started_on: dict[str, set[int]] = {}
    for run in started_runs:
        started_on.setdefault(run.job, set()).add(run.pid)

    def allowed_reasons(plan: JobPlan) -> set[str]:
        # a job whose last attempt ran on a worker that died is dead-lettered by its lease
        if started_on.get(plan.id, set()) & pool.dead_pids:
            return {plan.reason or "", "LeaseExpired"}
        return {plan.reason or ""}

    wrong_outcome = sorted(
        j
        for j, (s, _, r) in tracker.finished.items()
        if s != expected[j].expect or (s == "failed" and r not in allowed_reasons(expected[j]))
    )
    completed_twice_stats = max(stats.get("completed", 0) - len(completed), 0)
    completed_twice = completed_twice_stats + len(tracker.regressions)
    by_job: dict[str, list[Run]] = {}
    for run in done_runs:
        by_job.setdefault(run.job, []).append(run)
    dead_pids = pool.dead_pids
    duplicates = {j: sorted(runs) for j, runs in by_job.items() if len(runs) > 1}
    explained = {
        j for j, runs in duplicates.items() if sum(r.pid not in dead_pids for r in runs) <= 1
    }
    # A live worker renews its leases every lease/3 s, and retries a failed renewal only at its
    # next beat: a server down for longer than lease/3 can let a live lease expire (with at
    # least 2/3 of it left when the server went down, and up to another lease/3 before the
    # next renewal once it is back). The job then runs again on another worker: at-least-once
    # execution, not a double completion (I3 promises renewal while worker and server are up).
    # Such a duplicate is counted apart only when it fits one such outage: a run that began
    # under a lease taken before the outage ended (begun at most a lease after it), followed
    # by a run that began after the outage began. Real
    # double completions are counted from the store (completed_twice), never from these.
    by_outage = {
        j
        for j, runs in duplicates.items()
        if j not in explained and any(_fits(runs, o, round(cfg.lease * 1000)) for o in long_outages)
    }
    unexplained = sorted(set(duplicates) - explained - by_outage)
    starts = Counter(run.job for run in started_runs)
    missing_effect = sorted(j for j in completed if j not in by_job)

    if lost:
        failures.append(f"{len(lost)} jobs lost (no outcome seen): {lost[:10]}")
    if tracker.vanished:
        failures.append(f"{len(tracker.vanished)} records vanished before they finished")
    if completed_twice:
        failures.append(
            f"completed twice: {completed_twice_stats} by the counter, "
            f"regressions {tracker.regressions[:10]}"
        )
    if wrong_outcome:
        detail = [(j, tracker.finished[j], expected[j].expect) for j in wrong_outcome[:10]]
        failures.append(f"{len(wrong_outcome)} jobs with the wrong outcome: {detail}")
    if other:
        failures.append(f"jobs in unexpected final states: {list(other.items())[:10]}")
    if stats.get("enqueued") != cfg.jobs:
        failures.append(f"stats enqueued {stats.get('enqueued')} != {cfg.jobs}")
    if stats.get("failed", 0) != len(dead):
        failures.append(f"stats failed {stats.get('failed')} != {len(dead)} dead letters seen")
    if unexplained:
        failures.append(
            f"{len(unexplained)} duplicate side effects not explained by a dead worker or an "
            f"outage longer than lease/3 during the run (outages {counts.outages}): "
            f"{[(j, [(r.pid, r.started_ms) for r in duplicates[j]]) for j in unexplained[:10]]}"
        )
    if missing_effect:
        failures.append(f"{len(missing_effect)} completed jobs without a side effect")
    if leases_left or group_slots_left:
        failures.append(f"leases left: {leases_left}, group slots left: {group_slots_left}")
    if records_left or dead_left:
        failures.append(f"after retention: {records_left} job records, {dead_left} dead ids")
    if after > baseline + cfg.memory_tolerance:
        failures.append(f"memory {after} not back near the baseline {baseline}")
    if pool.unexpected:
        failures.append(f"workers died unexpectedly: {pool.unexpected}")
    failures += stop_problems
    if cfg.worker_kills and not pool.killed:
        failures.append("no worker was killed")

    return {
        "ok": not failures,
        "failures": failures,
        "config": asdict(cfg),
        "seed": cfg.seed,
        "jobs": cfg.jobs,
        "worker_kills": len(pool.killed),
        "poison_deaths": len(pool.poisoned),
        "worker_restarts": pool.restarts,
        "unexpected_worker_exits": len(pool.unexpected),
        "worker_start_failures": pool.start_failures,
        "client_kill_rounds": counts.client_kill_rounds,
        "connections_killed": counts.connections_killed,
        "server_restarts": counts.server_restarts,
        "server_crashes": counts.server_crashes,
        "restart_downtime_ms": counts.restart_downtime_ms,
        "enqueue_retries": counts.enqueue_retries,
        "completed": len(completed),
        "dead_lettered": len(dead),
        "dead_reasons": dict(Counter(dead.values())),
        "lost": len(lost),
        "lost_in_replication_window": len(lost_in_window),
        "cluster": cfg.cluster,
        "failovers": len(windows),
        "replication_windows_ms": [b - a for a, b in windows],
        "vanished": len(tracker.vanished),
        "completed_twice": completed_twice,
        "runs_started": sum(starts.values()),
        "jobs_started_more_than_once": sum(1 for n in starts.values() if n > 1),
        "side_effects": len(done_runs),
        "duplicate_side_effects": len(duplicates),
        "extra_side_effects": sum(len(r) - 1 for r in duplicates.values()),
        "duplicates_explained_by_kill": len(explained),
        "duplicates_explained_by_outage": len(by_outage),
        "longest_outage_s": round(counts.longest_outage, 2),
        "outages_beyond_a_third_of_the_lease": len(long_outages),
        "duplicates_unexplained": len(unexplained),
        "leases_left": leases_left,
        "invariants": invariants,
        "stats": stats,
        "memory": {
            "baseline": baseline,
            "peak": counts.peak_memory,
            "after_retention": after,
            "delta": after - baseline,
            "tolerance": cfg.memory_tolerance,
            "moved": moved,
        },
        "records_left_after_retention": records_left,
        "keys_left": keys_left,
        "monitor": {"polls": tracker.polls, "poll_errors": tracker.poll_errors},
        "workflows": {
            **wf_verdict.figures,
            "signals_woke": wf.signals_woke,
            "signal_rounds": wf.signal_rounds,
        },
    }


async def _warm_up(
    app: App, admin: Redis, keys: QueueKeys, n: int, cfg: SoakConfig, rng: random.Random
) -> dict[str, int]:
    """Run ``n`` quick jobs at once and let their records expire, before the baseline.

    The server keeps some memory after its keyspace first grows (measured: about 0.5 MB after
    the first few thousand jobs, then flat however many follow), so the baseline is taken
    after a first wave of the same kind; what the soak then checks is that memory does not
    grow with the jobs it runs. Returns the queue's counters after the warm-up.
    """

    async def one(i: int) -> None:
        await app.queue().enqueue(
            "work",
            kwargs={"i": i},
            job_id=f"warm-{i}",
            group=f"tenant-{i % 6}" if i % 4 == 0 else None,
            priority=rng.randint(-3, 3),
            result_ttl=0.2,
        )

    for start in range(0, n, 200):
        await asyncio.gather(*(one(i) for i in range(start, min(start + 200, n))))
    stats: dict[str, int] = {}

    async def left() -> int:
        nonlocal stats
        raw = await admin.hgetall(keys.stats)
        stats = {text(k): int(v) for k, v in raw.items()}
        unfinished = max(n - stats.get("completed", 0), 0)
        return unfinished + await count_keys(admin, keys.base + "job:*")

    if await until_done(left, stall=cfg.stall_timeout):
        raise RuntimeError(f"the warm-up stalled for {cfg.stall_timeout} s: {stats}")
    await admin.delete(started_key(keys.prefix), done_key(keys.prefix))
    return stats


@dataclass(frozen=True, slots=True, order=True)
class Run:
    """One run of a job body as ``chaosapp`` recorded it (ordered by its start)."""

    started_ms: int  # wall clock, the same host's as the soak's outage windows
    pid: int
    job: str


def _fits(runs: list[Run], outage: tuple[int, int], lease_ms: int) -> bool:
    """Whether an outage can have made the job run again: one run under a lease taken before
    the server answered again (so begun at most a lease after that: a job leased before or
    during the outage can start only once the server is back, as its worker's first write
    needs it), and a later run begun after the server went down."""
    down, up = outage
    return any(
        a.started_ms <= up + lease_ms and b.started_ms >= down for a, b in itertools.pairwise(runs)
    )


async def _runs(redis: Redis, key: str) -> list[Run]:
    raw = await redis.hgetall(key)
    out = []
    for k, v in raw.items():
        pid, _, started = text(v).partition(":")
        out.append(Run(int(started or 0), int(pid), text(k).split("|")[0]))
    return out


async def _wf_records(redis: Redis, prefix: str, wf: _Workflows) -> int:
    """Job records left on the workflows' queues (steps, children, workflow records)."""
    return sum([await count_keys(redis, QueueKeys(prefix, q).base + "job:*") for q in wf.trackers])


async def _keys_left(redis: Redis, prefix: str) -> dict[str, str]:
    """Every key of the run still there: its type and size (each must be small and fixed)."""
    out = {}
    async for raw in redis.scan_iter(match=prefix + ":*", count=1000):
        key = text(raw)
        kind = text(await redis.type(raw))
        size = {
            "hash": redis.hlen,
            "list": redis.llen,
            "zset": redis.zcard,
            "set": redis.scard,
        }.get(kind)
        out[key] = kind if size is None else f"{kind}[{await size(raw)}]"
    return dict(sorted(out.items()))


async def _wait_for_workers(
    admin: Redis, cfg: SoakConfig, pool: WorkerPool, server: Any = None
) -> None:
    """Until ``cfg.workers`` workers are blocked idle on the server (up and connected)."""

    async def missing() -> int:
        pool.supervise()
        if isinstance(server, ClusterServer):
            clients = await asyncio.to_thread(server.client_list)
        else:
            clients = await admin.client_list()
        idle = {
            c["name"]
            for c in clients
            if c.get("name", "").startswith(WORKER_NAME) and "b" in c["flags"]
        }
        return max(cfg.workers - len(idle), 0)

    if await until_done(missing, stall=cfg.stall_timeout, interval=0.1):
        raise RuntimeError("the workers did not start:\n" + pool.log_tails())


# ---------------------------------------------------------------------- command line
def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tests.chaos.soak", description=__doc__.split("\n")[0]
    )
    p.add_argument("--long", action="store_true", help="40,000 jobs over about 3 minutes")
    p.add_argument("--jobs", type=int)
    p.add_argument("--seconds", type=float, help="length of the chaos phase")
    p.add_argument("--workers", type=int)
    p.add_argument("--concurrency", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--worker-kills", type=int)
    p.add_argument("--client-kill-rounds", type=int)
    p.add_argument("--server-restarts", type=int)
    p.add_argument("--server-crashes", type=int)
    p.add_argument("--workflows", type=int, help="DAG workflows among the jobs (wfsoak.py)")
    p.add_argument("--workdir", type=Path, help="keep logs and the AOF here")
    p.add_argument(
        "--cluster",
        action="store_true",
        help="on a local cluster; the server crash is a failover of the queue's primary",
    )
    args = p.parse_args(argv)
    overrides = {
        k: v
        for k, v in vars(args).items()
        if v is not None and k not in ("long", "workdir", "cluster")
    }
    if args.cluster:  # one failover in the middle, in place of the server restart
        overrides.update(cluster=True)
        overrides.setdefault("server_restarts", 0)
        overrides.setdefault("server_crashes", 1)
    overrides.setdefault("seed", random.randrange(1, 1_000_000))  # printed in the summary
    cfg = SoakConfig.long(**overrides) if args.long else replace(SoakConfig(), **overrides)
    summary = asyncio.run(run_soak(cfg, args.workdir))
    print(json.dumps(summary, indent=2))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
