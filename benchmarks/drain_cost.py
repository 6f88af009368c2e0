"""What one W2 drain costs, in figures that machine load does not change: commands and round
trips per job, the server's µs per job (``INFO commandstats``), the worker process's CPU µs per
job (its rusage), bytes per queued job, and the startup's round trips and wall time; plus the
wall-clock drain (jobs/s), which load does change. Used to bisect the drain across commits.

Each source (the working tree, or an export of an older commit: ``git worktree add /tmp/aq-X X``)
runs as the harness runs it: N no-op jobs queued with ``enqueue_many``, then ``python -m
aioqueue worker drainapp:app --concurrency 100 --burst`` spawned as a process of its own. The
worker's round trips are counted by a ``sitecustomize`` put first on its path that counts
redis-py's ``send_packed_command`` calls (a pipeline is one). Sources alternate round by round
(A B C, C B A, ...) on one embedded Valkey; each figure is the median of the rounds, wall-clock
also the best.

    .venv/bin/python -m benchmarks.drain_cost [--jobs N] [--rounds R] [--json FILE] SRC [SRC ...]

``SRC`` is a directory holding an ``aioqueue`` package (``.`` for the working tree); ``NAME=SRC``
names it in the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: the worker's app module (the harness's shape: an App from a URL, one no-op task)
APP_MODULE = """
import os
from aioqueue import App

app = App(os.environ["DRAIN_URL"], prefix=os.environ["DRAIN_PREFIX"])


@app.task(name="noop")
async def noop(i: int) -> None:
    return None
"""

#: counts the worker's round trips (each send of a command or a pipeline) and writes them at exit
SITECUSTOMIZE = """
import atexit, json, os
try:
    from redis.asyncio import connection as _c
    _n = [0]
    _send = _c.AbstractConnection.send_packed_command
    async def send_packed_command(self, command, check_health=True):
        _n[0] += 1
        return await _send(self, command, check_health)
    _c.AbstractConnection.send_packed_command = send_packed_command
    def _write():
        if "DRAIN_RT_FILE" in os.environ:
            with open(os.environ["DRAIN_RT_FILE"], "w") as f:
                json.dump({"round_trips": _n[0]}, f)
    atexit.register(_write)
except Exception:  # an old redis-py: no counts, the rest still measured
    pass
"""


#: the commands that run a script: their usec includes the commands the script calls
SCRIPT_COMMANDS = ("evalsha", "eval", "fcall", "evalsha_ro", "fcall_ro")


def _server_cpu(r: Any) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _commandstats(info: dict[str, Any]) -> dict[str, tuple[int, float]]:
    return {
        k.removeprefix("cmdstat_"): (int(v["calls"]), float(v["usec"]))
        for k, v in info.items()
        if k.startswith("cmdstat_")
    }


def _delta(
    a: dict[str, tuple[int, float]], b: dict[str, tuple[int, float]]
) -> dict[str, tuple[int, float]]:
    out = {}
    for k, (calls, usec) in b.items():
        c0, u0 = a.get(k, (0, 0.0))
        if calls - c0:
            out[k] = (calls - c0, usec - u0)
    return out


def _run_worker(src: Path, work: Path, env: dict[str, str]) -> tuple[float, float, int]:
    """Spawn the worker in burst mode; (wall s, CPU s of the process, its round trips)."""
    rt_file = work / "rt.json"
    env = {**env, "DRAIN_RT_FILE": str(rt_file)}
    env["PYTHONPATH"] = os.pathsep.join([str(work), str(src)])
    argv = [sys.executable, "-m", "aioqueue", "worker", "drainapp:app", "--concurrency", "100"]
    argv += ["--burst", "--log-level", "WARNING"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"the worker of {src} failed (exit {status})")
    rts = json.loads(rt_file.read_text()).get("round_trips", 0) if rt_file.exists() else 0
    return wall, usage.ru_utime + usage.ru_stime, rts


def one_round(src: Path, url: str, n: int, tag: str) -> dict[str, Any]:
    """One drain of ``n`` jobs on the code in ``src`` (a process of its own enqueues)."""
    import redis

    r = redis.Redis.from_url(url)
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        (work / "drainapp.py").write_text(APP_MODULE)
        (work / "sitecustomize.py").write_text(SITECUSTOMIZE)
        env = dict(os.environ, DRAIN_URL=url, DRAIN_PREFIX=f"d{tag}")
        r.flushall()
        r.config_resetstat()
        # startup and shutdown on an empty queue
        s_wall, s_cpu, s_rt = _run_worker(src, work, env)
        s_calls = sum(c for c, _ in _commandstats(r.info("commandstats")).values())
        mem0 = int(r.info("memory")["used_memory"])
        enq = (
            "import asyncio, drainapp\n"
            "async def main():\n"
            "    async with drainapp.app:\n"
            f"        for s in range(0, {n}, 5000):\n"
            f"            kw = [{{'i': i}} for i in range(s, min(s + 5000, {n}))]\n"
            "            await drainapp.noop.enqueue_many(kw)\n"
            "asyncio.run(main())\n"
        )
        penv = {**env, "PYTHONPATH": os.pathsep.join([str(work), str(src)])}
        penv.pop("DRAIN_RT_FILE", None)
        subprocess.run([sys.executable, "-c", enq], cwd=work, env=penv, check=True)
        mem1 = int(r.info("memory")["used_memory"])
        before, cpu0 = _commandstats(r.info("commandstats")), _server_cpu(r)
        wall, cpu, rts = _run_worker(src, work, env)
        spent = _delta(before, _commandstats(r.info("commandstats")))
        server_cpu = _server_cpu(r) - cpu0
        left = r.dbsize()
    calls = sum(c for c, _ in spent.values())
    scripts = [spent.get(k, (0, 0.0)) for k in SCRIPT_COMMANDS]
    return {
        "drain_jobs_s": n / wall,
        "commands_per_job": calls / n,
        "round_trips_per_job": (rts - s_rt) / n,
        "script_calls_per_job": sum(c for c, _ in scripts) / n,
        "script_us_per_job": sum(u for _, u in scripts) / n,
        "server_cpu_us_per_job": server_cpu / n * 1e6,
        "worker_cpu_us_per_job": (cpu - s_cpu) / n * 1e6,
        "startup_ms": s_wall * 1e3,
        "startup_round_trips": s_rt,
        "startup_commands": s_calls,
        "bytes_per_queued_job": (mem1 - mem0) / n,
        "keys_left": left,
        "by_command": {k: round(c / n, 3) for k, (c, _) in sorted(spent.items())},
        "by_command_us": {k: round(u / n, 3) for k, (_, u) in sorted(spent.items())},
    }


def script_split(rs: list[dict[str, Any]]) -> dict[str, float]:
    """The scripts' µs per job split into the commands they ran (each command's own usec, the
    ones of more than 0.5 µs/job by name) and the rest: the Lua around them (argument
    handling, tables, the repairing call), which ``INFO commandstats`` cannot see inside."""
    med: dict[str, float] = {}
    for k in rs[0]["by_command_us"]:
        med[k] = statistics.median(r["by_command_us"].get(k, 0.0) for r in rs)
    scripts = sum(med.get(k, 0.0) for k in SCRIPT_COMMANDS)
    inner = {k: u for k, u in med.items() if k not in SCRIPT_COMMANDS and k != "info"}
    out = {k: round(u, 2) for k, u in sorted(inner.items(), key=lambda x: -x[1]) if u > 0.5}
    out["other commands"] = round(sum(u for k, u in inner.items() if k not in out), 2)
    out["lua (scripts less their commands)"] = round(scripts - sum(inner.values()), 2)
    out["scripts in all"] = round(scripts, 2)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sources", nargs="+", help="NAME=DIR or DIR holding an aioqueue package")
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", help="also write every round here")
    p.add_argument("--url", help="a running server (default: an embedded Valkey of our own)")
    a = p.parse_args()
    srcs: dict[str, Path] = {}
    for s in a.sources:
        name, _, d = s.rpartition("=")
        srcs[name or d] = Path(d).resolve()
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in srcs}

    def go(url: str) -> None:
        names = list(srcs)
        for rnd in range(a.rounds):
            for k in names if rnd % 2 == 0 else names[::-1]:
                res = one_round(srcs[k], url, a.jobs, f"{rnd}")
                runs[k].append(res)
                print(k, rnd, f"{res['drain_jobs_s']:.0f} jobs/s", flush=True, file=sys.stderr)

    if a.url:
        go(a.url)
    else:
        from aioqueue import EmbeddedServer

        with EmbeddedServer() as server:
            go(server.url)
    cols = [c for c in runs[next(iter(runs))][0] if not c.startswith(("by_", "keys_"))]
    print(f"drain of {a.jobs:,} no-op jobs, {a.rounds} rounds alternated; medians (best jobs/s)")
    print(f"{'source':<14}" + "".join(f"{c[:18]:>19}" for c in cols))
    for k, rs in runs.items():
        row = "".join(f"{statistics.median(r[c] for r in rs):>19.3g}" for c in cols)
        best = max(r["drain_jobs_s"] for r in rs)
        print(f"{k:<14}{row}  (best {best:.0f})")
    for k, rs in runs.items():
        print(k, "commands/job:", rs[-1]["by_command"])
    for k, rs in runs.items():
        print(k, "where the script time goes (µs/job, median):", script_split(rs))
    if a.json:
        Path(a.json).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
