"""``benchmarks/guard.py``, the CI step that fails on a slower drain: its trials run against a
real server and report what the verdict reads, and the verdict fails exactly the floors that
are broken (figures given, since a measured ratio on a loaded machine is what the guard's
own floors are for, not a test)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _guard() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_guard", ROOT / "benchmarks" / "guard.py")
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _best(
    aq_cpu: float, aq_w2: float, aq_w1: float, commands: float
) -> dict[str, dict[str, float]]:
    return {
        "raw": {"w1_jobs_s": 5000.0, "w2_jobs_s": 50_000.0, "w2_cpu_us": 15.0},
        "aioqueue": {
            "w1_jobs_s": aq_w1,
            "w2_jobs_s": aq_w2,
            "w2_cpu_us": aq_cpu,
            "commands_per_job": commands,
        },
    }


def test_the_verdict_passes_figures_above_every_floor() -> None:
    g = _guard()
    assert g.verdict(_best(60.0, 15_000.0, 4000.0, 5.7), g.FLOORS, g.MAX_COMMANDS_PER_JOB) == []


def test_the_verdict_names_each_broken_floor() -> None:
    g = _guard()
    # twice the CPU per job of today's (a drain half as fast): the cost ratio breaks alone
    broken = g.verdict(_best(140.0, 15_000.0, 4000.0, 5.7), g.FLOORS, g.MAX_COMMANDS_PER_JOB)
    assert len(broken) == 1
    assert broken[0].startswith("w2_cost_ratio = 0.107 < floor 0.125")
    # one more command per job breaks the ceiling, whatever the timings
    broken = g.verdict(_best(60.0, 15_000.0, 4000.0, 6.7), g.FLOORS, g.MAX_COMMANDS_PER_JOB)
    assert [b.split(" = ")[0] for b in broken] == ["W2 server commands per job"]
    # a wall-clock collapse of W2 and W1
    broken = g.verdict(_best(60.0, 1000.0, 100.0, 5.7), g.FLOORS, g.MAX_COMMANDS_PER_JOB)
    assert sorted(b.split(" = ")[0] for b in broken) == ["w1_ratio", "w2_ratio"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["raw", "aioqueue"])
def test_a_guard_trial_drains_every_job_and_reports_its_figures(kind: str, redis_url: str) -> None:
    args = [sys.executable, str(ROOT / "benchmarks" / "guard.py"), "--child", kind]
    args += ["--url", redis_url, "--jobs", "300", "--w1-jobs", "50"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=100, check=False)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["w1_jobs_s"] > 0
    assert got["w2_jobs_s"] > 0
    assert got["w2_cpu_us"] > 0
    if kind == "aioqueue":  # the trial itself checks that all 300 completed
        assert 4.0 < got["commands_per_job"] < 10.0
