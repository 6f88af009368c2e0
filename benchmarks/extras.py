"""Running our own workloads from the orchestrator: one private server for the whole phase,
one subprocess per trial in the aioqueue venv (``run.py --role extra``, so the trial measures
exactly the code the peers' harness measured), medians over the repeats.  Stdlib-only."""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from _common import BENCH_DIR, REPO, RESULT_MARK, log
from peers import venv_python
from report import fmt
from server import Server
from workloads import WORKLOADS, Workload, workload_params

RUN_PY = BENCH_DIR / "run.py"


def extra_trial(
    py: Path, name: str, url: str, params: dict[str, Any], timeout: float
) -> dict[str, Any]:
    """One trial of ``name`` in a fresh ``py`` process; its result, or ``{"error": ...}``."""
    argv = [str(py), str(RUN_PY), "--role", "extra", "--workload", name, "--url", url]
    argv += ["--params", json.dumps(params)]
    t0 = time.time()
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=BENCH_DIR)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f}s"}
    lines = [x for x in cp.stdout.splitlines() if x.startswith(RESULT_MARK)]
    if cp.returncode != 0 or not lines:
        lines = (cp.stderr or cp.stdout).strip().splitlines()
        return {"error": f"rc={cp.returncode}: {lines[-1] if lines else ''}", "stderr": lines[-25:]}
    res: dict[str, Any] = json.loads(lines[-1][len(RESULT_MARK) :])
    res["wall_s"] = round(time.time() - t0, 2)
    return res


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs, how many succeeded, and median/min/max of every numeric figure."""
    ok = [r for r in runs if "error" not in r]
    out: dict[str, Any] = {"runs_ok": len(ok), "runs": runs}
    for k in ok[0] if ok else {}:
        vals = [r.get(k) for r in ok]
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in vals):
            nums = [float(v) for v in vals if isinstance(v, int | float)]
            out[f"median_{k}"] = statistics.median(nums)
            out[f"min_{k}"], out[f"max_{k}"] = min(nums), max(nums)
    return out


def _repeated(py: Path, wl: Workload, url: str, p: dict[str, Any], repeats: int) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for rep in range(1, repeats + 1):
        r = extra_trial(py, wl.name, url, p, wl.timeout_s)
        r["rep"] = rep
        runs.append(r)
        shown = r.get("error") or f"{fmt(r.get(wl.headline))} {wl.unit}"
        log(f"  {wl.name} r{rep}: {shown}")
    return {"params": p, "loop": wl.loop, **summarize(runs)}


def run_scale(py: Path, wl: Workload, url: str, p: dict[str, Any]) -> dict[str, Any]:
    """S1: one trial per size, in the order given."""
    runs = []
    for size in (int(x) for x in p["sizes"]):
        q = {k: v for k, v in p.items() if k != "sizes"} | {"size": size}
        r = extra_trial(py, "s1", url, q, wl.timeout_s)
        runs.append(r)
        if "error" in r:
            log(f"  s1 {size:,}: {r['error']}")
        else:
            log(
                f"  s1 {size:,}: enqueue {r['enqueue_us_per_job']:.1f} us/job, "
                f"{r['bytes_per_job']:.0f} B/job, drain {r['drain_us_per_job']:.1f} us/job"
            )
    return {"params": p, "loop": wl.loop, "runs": runs}


def run_extras(
    names: list[str], overrides: dict[str, Any], *, quick: bool, repeats: int
) -> dict[str, Any]:
    """Run ``names`` (``repeats`` trials each; one with ``quick``) on a private server."""
    py = venv_python("aioqueue")
    if not py.exists():
        py = REPO / ".venv" / "bin" / "python"
    server = Server()
    out: dict[str, Any] = {"interpreter": str(py.relative_to(REPO)), "workloads": {}}
    try:
        out["server"] = server.start()
        log(f"extra workloads on {out['server']['valkey_version']} at {server.url}: {names}")
        out["env"] = extra_trial(py, "env", server.url, {}, 60)
        for name in names:
            wl = WORKLOADS[name]
            p = workload_params(wl, quick, overrides)
            if name == "s1":
                out["workloads"][name] = run_scale(py, wl, server.url, p)
            else:
                n = 1 if quick else repeats
                out["workloads"][name] = _repeated(py, wl, server.url, p, n)
    finally:
        server.stop()
    return out
