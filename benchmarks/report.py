"""The tables a run prints and the JSON it writes.

    peers_table    the harness's medians per library (W1, W1b, W1c, W2, W3, W4), then the rows
                   "best peer", "aioqueue / best peer" and "aioqueue / raw" (the ratios)
    extras_table   our workloads' medians, with their client / server CPU per job
    scale_table    S1: cost per job and memory per queued job at each depth
    targets_table  DESIGN.md section 6's targets, checked against this run (PASS / FAIL)
    write_results  prints the tables; writes results/<timestamp>.json and results/latest.json

Stdlib-only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from _common import RESULTS_DIR
from peers import REFERENCE_LIBS
from workloads import WORKLOADS


class Column(NamedTuple):
    """A column of the peers' table: a median of the harness's results for one workload."""

    title: str
    workload: str
    key: str
    digits: int
    higher_is_better: bool


PEER_COLUMNS = (
    Column("W1 enq/s", "w1", "median_jobs_per_s", 0, True),
    Column("W1b bulk/s", "w1b", "median_jobs_per_s", 0, True),
    Column("W1c conc/s", "w1c", "median_jobs_per_s", 0, True),
    Column("W2 drain/s", "w2", "median_jobs_per_s", 0, True),
    Column("W2 steady/s", "w2", "median_jobs_per_s_steady", 0, True),
    Column("W3 p50 ms", "w3", "median_p50_ms", 2, False),
    Column("W3 p99 ms", "w3", "median_p99_ms", 2, False),
    Column("W4 steady/s", "w4", "median_jobs_per_s_steady", 0, True),
)
#: workloads whose runs count duplicate executions (they run a worker)
WORKER_WORKLOADS = ("w2", "w3", "w4")
TITLES = {
    "peers": "Peers' harness (medians; one worker process, concurrency 100)",
    "extra": "aioqueue extra workloads (medians)",
    "scale": "S1 scale: cost per job and memory per queued job",
    "targets": "DESIGN.md section 6 targets",
}


# --------------------------------------------------------------------------- #
# Formatting                                                                   #
# --------------------------------------------------------------------------- #
def last_line(text: str, limit: int = 200) -> str:
    """The last non-empty line of an error (the exception itself, not its traceback)."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return (lines[-1] if lines else text)[:limit]


def fmt(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def render(rows: list[list[str]], notes: Sequence[str] = (), left: Sequence[int] = (0,)) -> str:
    """Aligned text table: the first row is the header; columns in ``left`` are left-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for j, r in enumerate(rows):
        cells = (
            c.ljust(w) if i in left else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        lines.append("  ".join(cells).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines + ([""] if notes else []) + list(notes))


# --------------------------------------------------------------------------- #
# Table 1: the peers' harness                                                  #
# --------------------------------------------------------------------------- #
def peer_value(libs: dict[str, Any], lib: str, w: str, key: str) -> float | None:
    """``lib``'s median ``key`` of workload ``w``; None unless a run of it succeeded."""
    s = libs.get(lib, {}).get("results", {}).get(w)
    if not s or not s.get("runs_ok"):
        return None
    v = s.get(key)
    return float(v) if isinstance(v, int | float) else None


def _cell(lib: str, col: Column, s: dict[str, Any] | None, notes: list[str]) -> str:
    if not s:
        return "-"
    if s["runs_ok"] == 0:
        if any("skipped" in r for r in s["runs"]):
            return "n/a"
        errs = {last_line(str(r.get("error", ""))) for r in s["runs"]}
        notes.append(f"{lib} {col.workload} failed: {'; '.join(sorted(errs))}")
        return "FAILED"
    cell = fmt(s.get(col.key), col.digits)
    if s["runs_ok"] < len(s["runs"]):
        cell += f" ({s['runs_ok']}/{len(s['runs'])})"
    return cell


def _lib_row(
    lib: str, entry: dict[str, Any] | None, cols: list[Column], dups: bool, notes: list[str]
) -> list[str]:
    """``lib``'s row of table 1 (with "dup execs" if ``dups``); why a cell is empty in notes."""
    if entry is None or "error" in entry or "skipped" in entry:
        if entry is None:
            notes.append(f"{lib}: no results")
        else:
            why = entry.get("skipped") or entry.get("error")
            notes.append(f"{lib}: {'skipped' if 'skipped' in entry else 'error'}, {why}")
        return [lib] + ["-"] * (len(cols) + dups)
    results = entry.get("results", {})
    row = [lib] + [_cell(lib, c, results.get(c.workload), notes) for c in cols]
    if dups:
        total = sum(
            int(r.get("duplicate_executions", 0))
            for wl in WORKER_WORKLOADS
            for r in results.get(wl, {}).get("runs", [])
        )
        row.append(str(total))
    return row


def _ratios(data: dict[str, Any], libs: list[str], col: Column) -> dict[str, Any]:
    """aioqueue's figure for ``col`` against the best peer's (never raw's) and raw's."""
    aq = peer_value(data, "aioqueue", col.workload, col.key)
    peer_vals = {
        p: v
        for p in libs
        if p not in REFERENCE_LIBS and (v := peer_value(data, p, col.workload, col.key)) is not None
    }
    pick = max if col.higher_is_better else min
    best = pick(peer_vals, key=lambda p: peer_vals[p]) if peer_vals else None
    raw = peer_value(data, "raw", col.workload, col.key)
    return {
        "aioqueue": aq,
        "best_peer": best,
        "best_peer_value": peer_vals.get(best) if best else None,
        "raw": raw,
        "aioqueue_over_best_peer": aq / peer_vals[best] if aq is not None and best else None,
        "aioqueue_over_raw": aq / raw if aq is not None and raw else None,
        "higher_is_better": col.higher_is_better,
    }


def _times(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def peers_table(peers: dict[str, Any], libs: list[str]) -> tuple[str, dict[str, Any]]:
    """Table 1 and the ratios (also returned for the JSON)."""
    data = peers["libraries"]
    ran = {w for part in peers["parts"] for w in part["workloads"]}
    cols = [c for c in PEER_COLUMNS if c.workload in ran]
    header = ["lib", *(c.title for c in cols)]
    show_dups = bool(ran & set(WORKER_WORKLOADS))
    if show_dups:
        header.append("dup execs")
    notes: list[str] = []
    rows = [header] + [_lib_row(lib, data.get(lib), cols, show_dups, notes) for lib in libs]

    ratios: dict[str, Any] = {}
    if "aioqueue" in libs:
        ratios = {c.title: _ratios(data, libs, c) for c in cols}
        tail = [""] if show_dups else []
        rs = list(ratios.values())
        rows.append(["best peer", *(r["best_peer"] or "-" for r in rs), *tail])
        vs_best = [_times(r["aioqueue_over_best_peer"]) for r in rs]
        rows.append(["aioqueue / best peer", *vs_best, *tail])
        rows.append(["aioqueue / raw", *(_times(r["aioqueue_over_raw"]) for r in rs), *tail])
        notes.insert(
            0,
            "ratios = aioqueue / reference: higher is better for jobs/s, LOWER is better for the "
            "W3 latency columns (ms); best peer excludes raw",
        )
    notes = list(peers.get("notes", [])) + notes
    return render(rows, notes), ratios


# --------------------------------------------------------------------------- #
# Tables 2 and 3: our workloads, the scale run                                 #
# --------------------------------------------------------------------------- #
#: our in-process workload -> the harness's workload (and column) making the same calls
_SAME_CALLS = {"e1": ("w1", "W1"), "e1b": ("w1b", "W1b"), "e1c": ("w1c", "W1c")}


def _extra_note(name: str, res: dict[str, Any], ws: dict[str, Any], plibs: dict[str, Any]) -> str:
    """The note column of ``name``'s row: its size and its comparisons within this run."""
    med = res.get("median_jobs_per_s")
    note = f"{res['params'].get('n', res['params'].get('jobs', ''))} jobs"
    if name.startswith("q") and med is not None:
        base = ws.get("q1", {}).get("median_jobs_per_s")
        us = res.get("median_server_us_per_job")
        note += f"; script {us:.1f} us/job" if us is not None else ""
        note += f"; vs Q1 {med / base:.2f}" if base and name != "q1" else ""
    if name == "c4" and med is not None:
        wv = peer_value(plibs, "aioqueue", "w4", "median_jobs_per_s_steady")
        if wv:
            note += f"; W4 aioqueue {wv:,.0f}/s = {wv / med:.2f} of this ceiling"
    if name in ("p1", "p1raw"):
        p = res["params"]
        note += f", C={p['concurrency']} batch={p['batch']}, {WORKLOADS[name].loop}"
    if name in _SAME_CALLS and med is not None:
        w, title = _SAME_CALLS[name]
        wv = peer_value(plibs, "aioqueue", w, "median_jobs_per_s")
        if wv:
            note += f"; {title} aioqueue {wv:,.0f}/s (ratio {med / wv:.2f})"
    if name == "p1" and med is not None and "p1raw" in ws:
        raw = ws["p1raw"].get("median_jobs_per_s")
        if raw:
            note += f"; P1/P1raw = {med / raw:.2f}"
    errs = [r["error"] for r in res["runs"] if "error" in r]
    if errs:
        note += f"; {len(errs)} failed: {last_line(errs[0], 120)}"
    return note


def extras_table(extra: dict[str, Any], peers: dict[str, Any] | None) -> str:
    """Table 2: one row per workload we ran (S1 has its own table)."""
    rows = [
        ["workload", "median", "unit", "min-max", "runs", "client us/job", "server us/job", "note"]
    ]
    ws = extra["workloads"]
    plibs = (peers or {}).get("libraries", {})
    for name, res in ws.items():
        if name == "s1":
            continue
        wl = WORKLOADS[name]
        k = wl.headline
        med = res.get(f"median_{k}")
        spread = f"{fmt(res.get(f'min_{k}'))}-{fmt(res.get(f'max_{k}'))}"
        rows.append(
            [
                wl.title,
                fmt(med),
                wl.unit,
                spread if med is not None else "-",
                f"{res['runs_ok']}/{len(res['runs'])}",
                fmt(res.get("median_client_cpu_us_per_job"), 1),
                fmt(res.get("median_server_cpu_us_per_job"), 1),
                _extra_note(name, res, ws, plibs),
            ]
        )
    return render(rows, extra.get("notes", []), left=(0, 7)) if len(rows) > 1 else ""


def _scale_notes(s: dict[str, Any], ok: list[dict[str, Any]]) -> list[str]:
    p = s["params"]
    notes = [
        f"at each depth: enqueue = median of {p['probes']} enqueue_many probes of "
        f"{p['probe']:,} jobs; fill = queueing the size itself (chunks of {p['chunk']:,}); "
        f"drain = pull API on a sample of {p['sample']:,} jobs of the full queue "
        f"(C={p['concurrency']} batch={p['batch']}); "
        "(server) = valkey CPU us per job (INFO cpu)"
    ]
    if len(ok) >= 2:
        lo, hi = ok[0], ok[-1]
        notes.append(
            f"cost per job {hi['size']:,} vs {lo['size']:,}: enqueue "
            f"{hi['enqueue_us_per_job'] / lo['enqueue_us_per_job']:.2f}x, drain "
            f"{hi['drain_us_per_job'] / lo['drain_us_per_job']:.2f}x (1.00 = flat)"
        )
    return notes


def scale_table(extra: dict[str, Any]) -> str:
    """Table 3: S1, one row per depth."""
    s = extra["workloads"].get("s1")
    if not s:
        return ""
    rows = [
        [
            "queued jobs",
            "fill us/job",
            "enqueue us/job",
            "(server)",
            "drain us/job",
            "(server)",
            "bytes/job",
            "raw bytes/job",
            "wall s",
        ]
    ]
    for r in s["runs"]:
        if "error" in r:
            rows.append([f"{r.get('size', '?')}", "ERROR: " + r["error"][:80], *[""] * 7])
            continue
        rows.append(
            [
                f"{r['size']:,}",
                fmt(r.get("fill_us_per_job"), 1),
                f"{r['enqueue_us_per_job']:.1f}",
                fmt(r.get("enqueue_server_cpu_us_per_job"), 1),
                f"{r['drain_us_per_job']:.1f}",
                fmt(r.get("drain_server_cpu_us_per_job"), 1),
                fmt(r["bytes_per_job"]),
                fmt(r["raw_bytes_per_job"]),
                fmt(r.get("wall_s"), 1),
            ]
        )
    return render(rows, _scale_notes(s, [r for r in s["runs"] if "error" not in r]))


# --------------------------------------------------------------------------- #
# Table 4: DESIGN.md section 6                                                 #
# --------------------------------------------------------------------------- #
def _peer_targets(ratios: dict[str, Any]) -> list[tuple[str, float | None, str, bool]]:
    """(target, measured value or None, shown, met) for the targets on the harness's figures."""

    def get(title: str, key: str) -> float | None:
        v = ratios.get(title, {}).get(key)
        return float(v) if isinstance(v, int | float) else None

    out: list[tuple[str, float | None, str, bool]] = []
    for title, need in (
        ("W2 drain/s", 5.0),
        ("W2 steady/s", 5.0),
        ("W1 enq/s", 1.3),
        ("W1c conc/s", 5.0),
    ):
        v = get(title, "aioqueue_over_best_peer")
        out.append((f"{title} >= {need:g}x best peer", v, _times(v), (v or 0) >= need))
    for title in ("W2 drain/s", "W2 steady/s"):
        v = get(title, "aioqueue_over_raw")
        out.append((f"{title} >= 0.6x raw", v, _times(v), (v or 0) >= 0.6))
    bulk = get("W1b bulk/s", "aioqueue")
    out.append(("W1b bulk >= 100,000 jobs/s", bulk, f"{fmt(bulk)}/s", (bulk or 0) >= 100_000))
    p50, raw50 = get("W3 p50 ms", "aioqueue"), get("W3 p50 ms", "raw")
    gap = p50 - raw50 if p50 is not None and raw50 is not None else None
    shown = f"{fmt(p50, 2)} ms (raw {fmt(raw50, 2)}: {fmt(gap, 2)} more)"
    out.append(("W3 p50 <= raw's + 0.1 ms", gap, shown, gap is not None and gap <= 0.1))
    p99 = get("W3 p99 ms", "aioqueue")
    out.append(("W3 p99 <= 2 ms", p99, f"{fmt(p99, 2)} ms", p99 is not None and p99 <= 2.0))
    return out


def _extra_targets(extra: dict[str, Any]) -> list[tuple[str, float | None, str, bool]]:
    """The targets on our own workloads' figures: fair groups' cost, S1's flat cost, memory."""
    ws = extra.get("workloads", {})
    q1, q3 = (ws.get(q, {}).get("median_jobs_per_s") for q in ("q1", "q3"))
    v = q3 / q1 if q1 and q3 else None
    out = [("Q3 fair groups >= 0.8x Q1 (W2 drain, in-process)", v, _times(v), (v or 0) >= 0.8)]
    ok = [r for r in ws.get("s1", {}).get("runs", []) if "error" not in r]
    if len(ok) >= 2:
        lo, hi = ok[0], ok[-1]
        worst = max(
            hi["enqueue_us_per_job"] / lo["enqueue_us_per_job"],
            hi["drain_us_per_job"] / lo["drain_us_per_job"],
        )
        label = f"flat cost/job {lo['size']:,} -> {hi['size']:,} (<= 1.25x)"
        out.append((label, worst, _times(worst), worst <= 1.25))
    if ok:
        b = float(ok[-1]["bytes_per_job"])
        label = f"memory per queued job at {ok[-1]['size']:,} <= 150 bytes"
        out.append((label, b, f"{b:,.0f} B", b <= 150))
    return out


def targets_table(ratios: dict[str, Any], extra: dict[str, Any] | None) -> str:
    """DESIGN.md section 6, checked against this run (a target this run measured no figure
    for is left out; "a feature not in use costs <= 5% of W2" has no workload of its own)."""
    checks = _peer_targets(ratios) + (_extra_targets(extra) if extra else [])
    rows = [["target (DESIGN.md 6)", "measured", "verdict"]]
    rows += [
        [label, shown, "PASS" if met else "FAIL"]
        for label, v, shown, met in checks
        if v is not None
    ]
    return render(rows) if len(rows) > 1 else ""


# --------------------------------------------------------------------------- #
# Output                                                                       #
# --------------------------------------------------------------------------- #
def write_results(results: dict[str, Any], out: Path | None, stamp: str, quick: bool) -> None:
    """Print the tables; write the JSON to ``out`` (default results/<stamp>[-quick].json)
    and to results/latest.json."""
    for key, text in results["tables"].items():
        print(f"\n== {TITLES[key]}\n{text}")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = out or RESULTS_DIR / f"{stamp}{'-quick' if quick else ''}.json"
    blob = json.dumps(results, indent=1, default=str)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(blob)
    (RESULTS_DIR / "latest.json").write_text(blob)
    print(f"\nwrote {out} and {RESULTS_DIR / 'latest.json'} ({results['elapsed_s']:.0f}s)")
    if not quick and not results.get("interrupted") and results.get("ratios"):
        line = history_line(results)
        with HISTORY.open("a") as f:
            f.write(json.dumps(line, sort_keys=True) + "\n")
        print(f"appended this run to {HISTORY}")


#: one line per full run (not --quick, not interrupted, with the peers): commit, date, load
#: and figures, so that a regression shows as a line (committed, unlike results/)
HISTORY = Path(__file__).resolve().parent / "history.jsonl"


def history_line(results: dict[str, Any]) -> dict[str, Any]:
    """The history's line for one full run: which code, when, how loaded the machine was,
    and aioqueue's figure, raw's and the best peer's of each column of table 1."""
    src = results.get("aioqueue_src") or {}
    repo = results.get("repo") or {}
    peers = results.get("peers") or {}
    return {
        "date": results.get("date"),
        "commit": src.get("commit") or repo.get("commit"),
        "dirty": bool(src.get("dirty", repo.get("dirty"))),
        "host": (results.get("host") or {}).get("cpu_model"),
        "cpus": (results.get("host") or {}).get("cpus"),
        # other processes' CPU during the harness (1.0 = a core) and the load at the end
        "load": {
            "foreign_util": (peers.get("foreign_cpu") or {}).get("util"),
            "loadavg_1m": round(os.getloadavg()[0], 2),
        },
        "repeats": (results.get("config") or {}).get("repeats"),
        "libs": (results.get("config") or {}).get("libs"),
        "workloads": (results.get("config") or {}).get("peer_workloads"),
        "figures": {
            col: {
                k: r.get(k)
                for k in ("aioqueue", "raw", "best_peer", "best_peer_value")
                if r.get(k) is not None
            }
            for col, r in results["ratios"].items()
        },
    }
