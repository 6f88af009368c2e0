"""What a run records about where it ran: the host, the repository's state, and the CPU that
other processes took meanwhile (``ForeignCpu``).  Stdlib-only."""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from _common import REPO


def git_info() -> dict[str, Any]:
    """The repository's commit, branch, and whether (and how) the working tree differs."""

    def git(*args: str) -> str:
        cp = subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30
        )
        return cp.stdout.strip() if cp.returncode == 0 else ""

    status = git("status", "--porcelain")
    diff = subprocess.run(
        ["git", "-C", str(REPO), "diff", "HEAD"], capture_output=True, timeout=30
    ).stdout
    return {
        "diff_sha1": hashlib.sha1(diff).hexdigest() if diff else None,  # identifies a dirty tree
        "commit": git("rev-parse", "HEAD") or None,
        "branch": git("rev-parse", "--abbrev-ref", "HEAD") or None,
        "dirty": bool([x for x in status.splitlines() if not x.startswith("??")]),
        "untracked": len([x for x in status.splitlines() if x.startswith("??")]),
    }


def host_info() -> dict[str, Any]:
    """Platform, CPUs, memory and the orchestrator's Python."""
    mem = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    cpu = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "mem_total_bytes": mem,
        "orchestrator_python": platform.python_version(),
    }


class ForeignCpu:
    """Measures the CPU time used during a phase by processes that are NOT descendants of this
    one (someone's test suite, a build): the benchmark's cores are shared, so figures taken
    while others use them are not comparable with a quiet machine's.  Samples /proc twice a
    second (Linux; elsewhere it reports nothing); a process that ends between two samples loses
    its last half second, so the figures are lower bounds."""

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self.ticks = 0
        self.own_ticks = 0
        self.busiest: dict[str, int] = {}
        self._ours = {os.getpid()}  # every descendant ever seen: an orphan stays ours
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = 0.0

    def __enter__(self) -> ForeignCpu:
        self._t0 = time.time()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    @staticmethod
    def _snapshot() -> dict[int, tuple[int, int, str]]:
        """pid -> (ppid, utime + stime ticks, command name)"""
        out: dict[int, tuple[int, int, str]] = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                st = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            name = st[st.find("(") + 1 : st.rfind(")")]
            f = st[st.rfind(")") + 2 :].split()
            out[int(d)] = (int(f[1]), int(f[11]) + int(f[12]), name)
        return out

    def _sample(self) -> dict[int, tuple[int, str, bool]]:
        """pid -> (CPU ticks, name, ours)"""
        snap = self._snapshot()
        grew = True
        while grew:  # descendants: children of ours, until no more are found
            new = {pid for pid, (ppid, _, _) in snap.items() if ppid in self._ours}
            new -= self._ours
            self._ours |= new
            grew = bool(new)
        return {pid: (t, name, pid in self._ours) for pid, (_, t, name) in snap.items()}

    def _run(self) -> None:
        if not Path("/proc/self/stat").exists():
            return
        prev = self._sample()
        stopped = False
        while not stopped:
            stopped = self._stop.wait(self.interval)  # then one last sample for the tail
            cur = self._sample()
            for pid, (t, name, ours) in cur.items():
                delta = t - prev[pid][0] if pid in prev else t  # new since the last sample
                if delta <= 0:
                    continue
                if ours:
                    self.own_ticks += delta
                else:
                    self.ticks += delta
                    self.busiest[name] = self.busiest.get(name, 0) + delta
            prev = cur

    def report(self) -> dict[str, Any]:
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        wall = max(time.time() - self._t0, 1e-9)
        top = sorted(self.busiest.items(), key=lambda kv: -kv[1])[:5]
        return {
            "cpu_s": round(self.ticks / hz, 2),
            "wall_s": round(wall, 1),
            "util": round(self.ticks / hz / wall, 3),  # 1.0 = one core busy all the time
            "own_util": round(self.own_ticks / hz / wall, 3),  # the benchmark's own processes
            "top": {name: round(t / hz, 2) for name, t in top},
        }


def foreign_note(phase: str, rep: dict[str, Any]) -> str | None:
    """A warning when other processes used more than 10 % of a core during a phase."""
    if rep.get("util", 0) <= 0.1:
        return None
    top = ", ".join(f"{k} {v:.0f}s" for k, v in rep["top"].items())
    return (
        f"WARNING: other processes used {rep['util']:.2f} cores on average during {phase} "
        f"({top}): figures are not comparable with a quiet machine's"
    )
