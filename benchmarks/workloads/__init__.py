"""Our own workloads (beside the peers' w1..w4): the registry ``WORKLOADS``.

    enqueue.py  e1, e1b, e1c   enqueue one by one / enqueue_many / from 100 coroutines
    pull.py     p1, p1raw      the pull API (reserve + complete) and its bare redis-py floor
                s1             (``--scale``) cost per job, memory per queued job, 10k..1M
    worker.py   q1..q5         W2 with QoS in use (the scenarios of ``groups.py``)
                c4             W4's ceiling: the sleeps with no queue at all
    common.py   what the bodies share (empty server, CPU marks, prefill, pull loop)

A body runs in the aioqueue venv, one trial per subprocess (``run.py --role extra``, see
``run_trial``), against the private server ``extras.py`` started, and returns a dict holding
its ``headline``; each that uses the server empties it first.  The package is stdlib-only at import:
aioqueue and redis-py are imported inside the bodies, so the orchestrator can read the registry.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from _common import RESULT_MARK
from _loop import has_uvloop
from _loop import run as run_on_loop

from .enqueue import wl_e1, wl_e1b, wl_e1c
from .pull import wl_p1, wl_p1raw, wl_s1
from .worker import wl_c4, wl_q

Runner = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Workload:
    """One of our workloads.

    ``group``: "extra" runs by default, "scale" only with ``--scale``.  ``run`` executes in the
    aioqueue venv (``--role extra``) and returns a dict holding ``headline``.
    """

    name: str
    title: str
    what: str
    group: str
    headline: str = "jobs_per_s"
    unit: str = "jobs/s"
    loop: str = "asyncio"  # "asyncio" (like the peers' producer) or "uvloop" (like the worker)
    params: dict[str, Any] = field(default_factory=dict)
    quick: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 180.0
    run: Runner | None = None


# --------------------------------------------------------------------------- #
# The registry                                                                 #
# --------------------------------------------------------------------------- #
_PULL = {"concurrency": 50, "batch": 10}
#: the scenarios of benchmarks/groups.py: name, scenario, title, what is in use
_QOS = (
    ("q1", "none", "Q1 no groups", "no groups, priority 0: the plain FIFO lane (Q2-Q5's baseline)"),
    ("q2", "none+prio", "Q2 priorities", "no groups, five priority levels (-50, -10, 0, 10, 50)"),
    ("q3", "groups", "Q3 fair groups", "1,000 groups of 20 jobs, served round-robin"),
    ("q4", "groups+prio", "Q4 groups + priorities", "1,000 groups, priorities within each"),
    ("q5", "groups+limit", "Q5 groups + limits", "1,000 groups, each limited to 5 running"),
)
_Q_WHAT = (
    "20,000 pre-queued no-op jobs drained by one in-process Worker (concurrency 100); "
    "jobs/s = N / (worker start -> last ack); benchmarks/groups.py runs the same alone"
)
_ENQUEUE = (
    Workload(
        "e1",
        "E1 enqueue one by one",
        "N no-op jobs, `await task.enqueue()` one at a time from one process (the peers' "
        "W1, measured in-process); jobs/s = N / total time",
        "extra",
        params={"n": 20000},
        quick={"n": 2000},
        run=wl_e1,
    ),
    Workload(
        "e1b",
        "E1b enqueue_many",
        "N no-op jobs in one `await task.enqueue_many([...])` call (the peers' W1b, measured "
        "in-process); jobs/s = N / call time",
        "extra",
        params={"n": 20000},
        quick={"n": 2000},
        run=wl_e1b,
    ),
    Workload(
        "e1c",
        "E1c concurrent enqueue",
        "N no-op jobs from P concurrent coroutines of one process, each `await task.enqueue()` "
        "one at a time (the peers' W1c, measured in-process); jobs/s = N / time until all done",
        "extra",
        params={"n": 20000, "producers": 100},
        quick={"n": 2000},
        run=wl_e1c,
    ),
)
_PULL_AND_SCALE = (
    Workload(
        "p1",
        "P1 pull claim+complete",
        "N jobs prefilled with enqueue_many; then ONE process runs C coroutines, each "
        "`rs = await q.reserve(batch, lease=120)` then `await q.complete(r)` per job until "
        "the queue is empty; jobs/s = N / drain time",
        "extra",
        loop="uvloop",
        params={"n": 20000, "chunk": 10000, **_PULL},
        quick={"n": 2000},
        run=wl_p1,
    ),
    Workload(
        "p1raw",
        "P1raw pull floor",
        "P1's work with bare redis-py: the same C coroutines, claim = one Lua LPOP n + ZADD "
        "lease (the peers' raw claim), complete = one ZREM round trip per job; no records, "
        "results or retries (a floor, not a product)",
        "extra",
        loop="uvloop",
        params={"n": 20000, "chunk": 10000, **_PULL},
        quick={"n": 2000},
        run=wl_p1raw,
    ),
    Workload(
        "s1",
        "S1 scale",
        "for each size (10k, 100k, 1M queued jobs): queue them with enqueue_many in chunks, "
        "INFO used_memory delta / jobs (bytes per queued job, and the raw floor's RPUSHed "
        "payload for comparison); then, at that depth, enqueue 7 probes of 2,000 jobs "
        "(median us per job) and drain a sample with P1's pull loop (us per job); flat "
        "cost = same us/job at every depth",
        "scale",
        headline="enqueue_us_per_job",
        unit="us/job",
        loop="uvloop",
        params={
            "sizes": [10_000, 100_000, 1_000_000],
            "chunk": 10000,
            "sample": 20000,
            "probe": 2000,
            "probes": 7,
            **_PULL,
        },
        quick={"sizes": [2000, 20000], "sample": 2000, "probe": 500},
        timeout_s=420.0,
        run=wl_s1,
    ),
)
_QOS_AND_CEILING = (
    *(
        Workload(
            name,
            title,
            f"W2 with QoS: {what}; " + _Q_WHAT,
            "extra",
            loop="uvloop",
            params={"scenario": scenario, "jobs": 20000, "groups": 1000, "limit": 5},
            quick={"jobs": 2000, "groups": 100},
            run=wl_q,
        )
        for name, scenario, title, what in _QOS
    ),
    Workload(
        "c4",
        "C4 W4's ceiling",
        "W4 without any queue: 2,000 jobs of asyncio.sleep(0.01) on 100 slots, each slot "
        "starting its next job the moment the last one ends (uvloop, as the worker); "
        "jobs/s = N / (first start -> last end), W4's steady definition",
        "extra",
        loop="uvloop",
        params={"n": 2000, "concurrency": 100},
        run=wl_c4,
    ),
)
WORKLOADS: dict[str, Workload] = {
    w.name: w for w in (*_ENQUEUE, *_PULL_AND_SCALE, *_QOS_AND_CEILING)
}


def workload_params(wl: Workload, quick: bool, overrides: dict[str, Any]) -> dict[str, Any]:
    """``wl``'s parameters for this run: defaults, then ``--quick``'s, then ``--set``'s."""
    p = dict(wl.params)
    if quick:
        p.update(wl.quick)
    p.update(overrides.get(wl.name, {}))
    return p


# --------------------------------------------------------------------------- #
# --role extra: ONE trial of one workload (inside the aioqueue venv)           #
# --------------------------------------------------------------------------- #
def _run_loop(loop: str, coro: Awaitable[dict[str, Any]]) -> tuple[dict[str, Any], str]:
    async def main() -> dict[str, Any]:
        return await coro

    use = loop == "uvloop" and has_uvloop()
    name = "uvloop" if use else "asyncio (uvloop missing)" if loop == "uvloop" else "asyncio"
    return run_on_loop(main(), use), name


def env_info() -> dict[str, Any]:
    """Versions in the interpreter running the extra workloads."""
    from importlib.metadata import PackageNotFoundError, version

    vers: dict[str, str | None] = {}
    for d in ("aioqueue", "redis", "hiredis", "uvloop", "orjson", "anyio"):
        try:
            vers[d] = version(d)
        except PackageNotFoundError:
            vers[d] = None
    return {"python": platform.python_version(), "versions": vers}


def run_trial(name: str, url: str, params: dict[str, Any]) -> int:
    """Run one trial of ``name`` (or, for "env", report the versions) and print the result
    on one line marked ``RESULT_MARK`` for the orchestrator."""
    if name == "env":
        print(RESULT_MARK + json.dumps(env_info()), flush=True)
        return 0
    wl = WORKLOADS[name]
    assert wl.run is not None
    res, loop = _run_loop(wl.loop, wl.run(url, params))
    res["loop"] = loop
    print(RESULT_MARK + json.dumps(res), flush=True)
    return 0
