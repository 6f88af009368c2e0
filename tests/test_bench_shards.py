"""``benchmarks/shards.py`` runs against a given server and writes its table and JSON (a
smoke run: a few hundred jobs, not a measurement)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_shards_benchmark_runs_against_a_url(redis_url: str, tmp_path: Path) -> None:
    out = tmp_path / "shards.json"
    args = [sys.executable, "shards.py", "--url", redis_url, "--jobs", "300", "--repeats", "1"]
    args += ["--shards", "1,3", "--out", str(out), "--no-uvloop"]
    proc = subprocess.run(
        args, cwd=ROOT / "benchmarks", capture_output=True, text=True, timeout=100, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "drain/s" in proc.stdout
    report = json.loads(out.read_text())
    assert [row["shards"] for row in report["rows"]] == [1, 3]
    for row in report["rows"]:
        best = row["best"]
        assert best["drain_per_s"] > 0
        assert best["enqueue_per_s"] > 0
        assert best["drain_cpu_us"] > 0
        assert len(best["per_node_cpu_us"]) == 1  # a standalone server: one node
