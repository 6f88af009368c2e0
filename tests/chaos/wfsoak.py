"""Workflows in the chaos soak (issue 27, Proof): DAGs with fan-out and fan-in, durable steps,
parked sleeps, waits woken by the soak's signals and parents waiting for children, run by
the soak's worker processes while it kills them (``soak.py``).

Each workflow ``k`` (``plan_workflows``), on the queues ``WF_QUEUES`` of ``chaosapp``::

    start (step, durable sleep, step) -> node_0 .. node_n (two steps each; some on "wf2")
                                      -> waiter (step, wait for the event, step)
                                      -> parent (children with derived ids, parked) -> sink

The first steps' sleeps spread the workflows over the chaos phase; the sink's callback is a
durable step that counts the results it got. The workflows are stored before the faults
begin (a graph whose enqueue dies midway stays closed, by design: docs/workflows.md), so
what the soak tests is how they run through the faults.

The checks (``check_workflows``), from what the tasks recorded (``WfKeys``) and the job
records the soak's monitor saw:

- every step of every workflow, and every child, completed;
- no durable step's function began after a moment its result was known to be recorded (a
  run that returned from that ``ctx.step``): a completed step never runs again. A run that
  kept going after its lease ran out during a server outage longer than a third of the
  lease is counted apart, as the soak counts its duplicate side effects;
- no step's run began before every step it waits for completed (its record's finish time
  ``f``, the server's clock on the same host), and no parent's wait returned before all its
  children completed;
- every sink's callback saw every result it waited for, and ran once, or again only in the
  gap docs/workflows.md names (its function ran, its record was not written).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis.exceptions as rexc
from redis.asyncio import Redis

from aioqueue import AioQueueError, App

from ..support.server import text
from .chaosapp import WF_QUEUES, WF_RESULT_TTL, WfKeys, WfTasks

#: how long a workflow job's result is kept (seconds): a dependent reads its dependencies'
#: results when it runs, which a worker killed under a sibling can put off by a few leases;
#: an expired one fails the read (docs/known-issues.md), so it must outlive that wait
RESULT_TTL = WF_RESULT_TTL


@dataclass(frozen=True, slots=True)
class WfPlan:
    """One workflow of a run: its steps' job ids and queues, its edges, its event."""

    k: int
    sleep_s: float  # the first step's durable sleep
    fanout: int
    children: int
    event: str
    ids: dict[str, str]  # step name -> job id
    queues: dict[str, str]  # step name -> queue
    after: dict[str, tuple[str, ...]]  # step name -> the steps it waits for
    node_ms: dict[str, int] = field(default_factory=dict)

    @property
    def sink(self) -> str:
        return self.ids["sink"]

    @property
    def child_ids(self) -> list[str]:
        return [f"{self.ids['parent']}.c{i}" for i in range(self.children)]

    def all_ids(self) -> dict[str, str]:
        """Every job of the workflow (its steps and the parent's children) -> its queue."""
        out = {self.ids[n]: self.queues[n] for n in self.ids}
        out.update(dict.fromkeys(self.child_ids, self.queues["parent"]))
        return out


def plan_workflows(n: int, spread: float, seed: int, rng: random.Random) -> list[WfPlan]:
    """``n`` workflows whose first steps wake over ``spread`` seconds."""
    plans = []
    for k in range(n):
        fanout = rng.randint(2, 6)
        names = ["start", *(f"node{i}" for i in range(fanout)), "waiter", "parent", "sink"]
        ids = {name: f"w{seed}-{k:03d}-{name}" for name in names}
        queues = dict.fromkeys(names, WF_QUEUES[0])
        for i in range(fanout):
            if rng.random() < 0.35:
                queues[f"node{i}"] = WF_QUEUES[1]
        fed = tuple(n for n in names if n not in ("start", "sink"))
        after: dict[str, tuple[str, ...]] = {"start": ()}
        after.update(dict.fromkeys(fed, ("start",)))
        after["sink"] = fed
        node_ms = {f"node{i}": rng.choice([0, 50, 300, 800, 1500]) for i in range(fanout)}
        plans.append(
            WfPlan(
                k,
                round(0.05 + spread * k / max(n, 1), 3),
                fanout,
                rng.randint(1, 4),
                f"go-{seed}-{k}",
                ids,
                queues,
                after,
                node_ms,
            )
        )
    return plans


async def enqueue_workflows(app: App, tasks: WfTasks, plans: Iterable[WfPlan]) -> list[str]:
    """Store every workflow (their ids)."""
    out = []
    for p in plans:
        wf = app.workflow(f"soak-{p.k}")

        def opts(name: str, p: WfPlan = p) -> dict[str, Any]:
            return {"job_id": p.ids[name], "queue": p.queues[name], "result_ttl": RESULT_TTL}

        calls: dict[str, Any] = {
            "start": tasks.start.options(**opts("start")).call(p.k, p.sleep_s),
            "waiter": tasks.waiter.options(**opts("waiter")).call(p.k, p.event),
            "parent": tasks.parent.options(**opts("parent")).call(p.k, p.children),
            "sink": tasks.sink.options(**opts("sink")).call(p.k),
        }
        for i in range(p.fanout):
            name = f"node{i}"
            calls[name] = tasks.node.options(**opts(name)).call(p.k, i, p.node_ms[name])
        for name, call in calls.items():
            wf.step(name, call, after=p.after[name])
        out.append((await wf.enqueue(queue=WF_QUEUES[0])).id)
    return out


async def signal_waiters(app: App, plans: Iterable[WfPlan], finished: Mapping[str, Any]) -> int:
    """Signal the event of every workflow whose waiter has not finished (a signal reaches
    only jobs already waiting: the soak sends it again until the waiter is seen done).
    Returns how many jobs the signals woke; faults (a killed connection, the server down)
    are left to the next round."""
    woken = 0
    for p in plans:
        if p.ids["waiter"] in finished:
            continue
        with contextlib.suppress(AioQueueError, rexc.RedisError, OSError):
            woken += await app.signal(p.event, {"k": p.k}, queue=WF_QUEUES[0])
    return woken


# ---------------------------------------------------------------------- the checks
@dataclass(frozen=True, slots=True, order=True)
class _Mark:
    ms: int
    pid: int


async def _marks(redis: Redis, key: str, parts: int) -> dict[tuple[str, ...], list[_Mark]]:
    """A ``WfKeys`` hash by its field's first ``parts`` parts (the nonce dropped)."""
    out: dict[tuple[str, ...], list[_Mark]] = {}
    for k, v in (await redis.hgetall(key)).items():
        pid, _, ms = text(v).partition(":")
        where = tuple(text(k).split("|")[:parts])
        out.setdefault(where, []).append(_Mark(int(ms or 0), int(pid)))
    return {w: sorted(m) for w, m in out.items()}


#: the durable steps each task records, by the plan's step name (children: "c")
_STEPS = {"start": ("plan", "go"), "waiter": ("before", "after"), "sink": ("callback",)}


def _steps_of(name: str) -> tuple[str, ...]:
    return ("a", "b") if name.startswith("node") else _STEPS.get(name, ())


@dataclass(slots=True)
class WfVerdict:
    failures: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)


async def check_workflows(
    redis: Redis,
    prefix: str,
    plans: list[WfPlan],
    finished: Mapping[str, tuple[str, bytes, str]],
    dead_pids: set[int],
    long_outages: list[tuple[int, int]],
) -> WfVerdict:
    """The workflow checks (see the module's docstring)."""
    keys = WfKeys(prefix)
    runs = await _marks(redis, keys.run, 1)
    execd = await _marks(redis, keys.execd, 2)
    recorded = await _marks(redis, keys.recorded, 2)
    passed = await _marks(redis, keys.passed, 1)
    sinks = await _marks(redis, keys.sink, 2)
    v = WfVerdict()
    f_of = {j: int(f or 0) for j, (s, f, _) in finished.items() if s == "completed"}

    # every step and child completed
    expected = {j for p in plans for j in p.all_ids()}
    not_done = sorted(expected - set(f_of))
    if not_done:
        states = [(j, *finished.get(j, ("unfinished", b"", ""))[::2]) for j in not_done[:10]]
        v.failures.append(f"workflows: {len(not_done)} steps or children not completed: {states}")

    # a completed step never runs again
    again, in_outage, never_ran = [], [], []
    steps = [(p.ids[n], s) for p in plans for n in p.ids for s in _steps_of(n)]
    steps += [(c, "c") for p in plans for c in p.child_ids]
    for job, step in steps:
        ex = execd.get((job, step), [])
        if job in f_of and not ex:
            never_ran.append((job, step))
        rec = recorded.get((job, step))
        if not rec:
            continue
        late = [e for e in ex if e.ms > rec[0].ms]
        if not late:
            continue
        if all(any(a <= e.ms and rec[0].ms <= b for a, b in long_outages) for e in late):
            in_outage.append((job, step))
        else:
            again.append((job, step, [(e.pid, e.ms) for e in ex], rec[0].ms))
    if again:
        v.failures.append(f"workflows: {len(again)} recorded steps ran again: {again[:10]}")
    if never_ran:
        v.failures.append(f"workflows: completed without running a step: {never_ran[:10]}")

    # no step ran before the steps it waits for completed; no parent resumed early
    early = []
    for p in plans:
        for name, deps in p.after.items():
            if not deps or any(p.ids[d] not in f_of for d in deps):
                continue
            ready = max(f_of[p.ids[d]] for d in deps)
            early += [
                (p.ids[name], m.ms, ready) for m in runs.get((p.ids[name],), []) if m.ms < ready
            ]
        kids = [c for c in p.child_ids if c in f_of]
        if len(kids) == len(p.child_ids):
            ready = max(f_of[c] for c in kids)
            early += [
                (p.ids["parent"], m.ms, ready)
                for m in passed.get((p.ids["parent"],), [])
                if m.ms < ready
            ]
    if early:
        v.failures.append(
            f"workflows: {len(early)} runs began before their dependencies ended: {early[:10]}"
        )

    # every sink's callback saw every result it waited for
    wrong, callbacks = [], 0
    for p in plans:
        want = str(len(p.after["sink"]))
        seen = [n for (job, n) in sinks if job == p.sink]
        if p.sink in f_of and (not seen or any(n != want for n in seen)):
            wrong.append((p.sink, seen, want))
        callbacks += len(execd.get((p.sink, "callback"), []))
    if wrong:
        v.failures.append(f"workflows: sinks whose callback missed results: {wrong[:10]}")

    repeated = {k: m for k, m in execd.items() if len(m) > 1}
    v.figures = {
        "workflows": len(plans),
        "steps_and_children": len(expected),
        "completed": len(expected) - len(not_done),
        "runs": sum(len(m) for m in runs.values()),
        "step_functions_run": sum(len(m) for m in execd.values()),
        "step_functions_run_again_in_the_gap": len(repeated),
        "of_which_on_a_killed_worker": sum(
            1 for m in repeated.values() if any(x.pid in dead_pids for x in m[:-1])
        ),
        "recorded_steps_run_again": len(again),
        "recorded_steps_run_again_by_a_stale_run_in_an_outage": len(in_outage),
        "runs_before_dependencies": len(early),
        "sink_callbacks_run": callbacks,
        "parents_resumed": sum(len(m) for m in passed.values()),
    }
    return v
