"""Paths and the log line shared by the benchmark modules.  Stdlib-only, like every module the
orchestrator (``run.py``) imports."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO / "benchmarks"
#: the writable copy of the shared peers harness, with its virtualenvs (gitignored)
PEERS_COPY = BENCH_DIR / ".peers"
RESULTS_DIR = BENCH_DIR / "results"
DEFAULT_PEERS_SRC = REPO.parent / "shared" / "peers-bench"
#: prefix of the one stdout line by which a trial subprocess hands its result (JSON) back
RESULT_MARK = "AQBENCH_RESULT "


def log(msg: str) -> None:
    print(f"[run.py] {msg}", flush=True)
