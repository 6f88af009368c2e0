#!/usr/bin/env python3
"""aioqueue benchmarks: the peers' harness plus our own workloads, in one command.

    python benchmarks/run.py                 # peers (w1..w4, 3 repeats) + our workloads
    python benchmarks/run.py --quick         # smoke test: small N, 1 repeat
    python benchmarks/run.py --libs aioqueue,raw --quick   # only aioqueue and the raw floor
    python benchmarks/run.py --scale         # also the 10k / 100k / 1M queued-jobs run
    python benchmarks/run.py --commit HEAD   # measure a commit, not the working tree
    python benchmarks/run.py --list          # the workload registry

This file is the entry: the arguments and the order of the phases (see benchmarks/README.md).

1. ``peers.py`` refreshes a writable copy of the shared peers harness in ``benchmarks/.peers/``
   (the aioqueue adapter switched on by text substitution) and creates missing virtualenvs
   with its ``setup.sh``; ``.venv-aioqueue`` gets this checkout (or ``--commit``'s export).
2. ``peers.py`` runs the harness's ``bench.py`` once for every library (arq, saq, streaq,
   taskiq, bullmq, raw, aioqueue; ``--libs``) on w1, w1b, w1c, w2, w3, w4.
3. ``extras.py`` runs our workloads (``workloads.py``: E1/E1b/E1c enqueue, P1/P1raw pull,
   Q1-Q5 QoS, C4 W4's ceiling, and with ``--scale`` S1) in the aioqueue venv against a
   private valkey-server (``server.py``), one subprocess per trial (``--role extra``).
4. ``report.py`` prints the tables (peers with ratios, ours, scale, DESIGN.md section 6
   targets) and writes ``benchmarks/results/<timestamp>.json`` and ``results/latest.json``;
   ``machine.py`` records the host, the repository's state and other processes' CPU use.

Every module the orchestrator imports is stdlib-only, so it runs on any Python >= 3.11; the
workload bodies import aioqueue and redis-py only in the ``--role extra`` process, started with
the aioqueue venv's interpreter.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import DEFAULT_PEERS_SRC, PEERS_COPY, REPO, log
from extras import run_extras
from machine import ForeignCpu, foreign_note, git_info, host_info
from peers import (
    ALL_LIBS,
    LIB_VENV,
    PEER_WORKLOADS,
    export_commit,
    precompile,
    prepare_peers,
    run_peers,
    run_setup,
)
from report import extras_table, peers_table, scale_table, targets_table, write_results
from workloads import WORKLOADS, run_trial


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``--set p1.batch=1`` -> {"p1": {"batch": 1}} (values parsed as JSON when they can be)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        name, dot, param = key.partition(".")
        if not sep or not dot or name not in WORKLOADS:
            raise SystemExit(f"--set wants WORKLOAD.PARAM=VALUE, got {item!r}")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out.setdefault(name, {})[param] = value
    return out


def list_workloads() -> None:
    print("peers' harness (bench.py): " + ", ".join(PEER_WORKLOADS))
    for wl in WORKLOADS.values():
        print(f"\n{wl.name:6s} [{wl.group}] {wl.title}  ({wl.unit}, loop {wl.loop})\n    {wl.what}")
        if wl.params:
            print(f"    params {wl.params}  quick {wl.quick}")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description="aioqueue benchmarks: peers' harness + our workloads (see benchmarks/README.md)"
    )
    ap.add_argument("--quick", action="store_true", help="small N, 1 repeat (smoke test)")
    ap.add_argument("--repeats", type=int, default=3, help="repeats per workload (default 3)")
    ap.add_argument(
        "--libs",
        default=",".join(ALL_LIBS),
        help=f"libraries for the peers' harness (default {','.join(ALL_LIBS)}; "
        f"known: {','.join(LIB_VENV)})",
    )
    ours = ",".join(n for n, w in WORKLOADS.items() if w.group == "extra")
    ap.add_argument(
        "--workloads",
        default=None,
        help=f"comma list of peers' ({','.join(PEER_WORKLOADS)}) and/or our ({ours}) "
        "workloads; default: all of both",
    )
    ap.add_argument("--skip-peers", action="store_true", help="do not run the peers' harness")
    ap.add_argument("--skip-extra", action="store_true", help="do not run our extra workloads")
    ap.add_argument("--scale", action="store_true", help="also S1: 10k / 100k / 1M queued jobs")
    ap.add_argument("--out", default=None, help="JSON file (default results/<timestamp>.json)")
    ap.add_argument("--peers-dir", default=str(DEFAULT_PEERS_SRC), help="the shared harness")
    ap.add_argument(
        "--reinstall-aioqueue",
        action="store_true",
        help="reinstall this checkout into the harness's .venv-aioqueue first",
    )
    ap.add_argument(
        "--commit",
        default=None,
        metavar="REF",
        help="measure aioqueue at this commit (git archive into .peers/src/, installed into "
        ".venv-aioqueue) instead of the working tree",
    )
    ap.add_argument(
        "--set", action="append", default=[], metavar="W.PARAM=V", help="override a param"
    )
    ap.add_argument("--peers-timeout", type=float, default=3000, help="seconds per harness run")
    ap.add_argument("--setup-timeout", type=float, default=1200, help="seconds for setup.sh")
    ap.add_argument("--list", action="store_true", help="list the workloads and exit")
    # internal: one trial of one of our workloads, inside the aioqueue venv (extras.py)
    ap.add_argument("--role", default="orchestrator", help=argparse.SUPPRESS)
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--params", default="{}", help=argparse.SUPPRESS)
    return ap


def select(a: argparse.Namespace) -> tuple[list[str], list[str], list[str]]:
    """(libs, peers' workloads, our workloads) chosen by the arguments."""
    libs = [x.strip() for x in a.libs.split(",") if x.strip()]
    for lib in libs:
        if lib not in LIB_VENV:
            raise SystemExit(f"unknown lib {lib!r}; known: {', '.join(LIB_VENV)}")
    runnable = [n for n, w in WORKLOADS.items() if w.group == "extra"]
    if a.workloads is None:
        peer_wl, extra_wl = list(PEER_WORKLOADS), list(runnable)
    else:
        chosen = [x.strip().lower() for x in a.workloads.split(",") if x.strip()]
        bad = [x for x in chosen if x not in PEER_WORKLOADS and x not in WORKLOADS]
        if bad:
            raise SystemExit(f"unknown workloads {bad}; see --list")
        peer_wl = [x for x in PEER_WORKLOADS if x in chosen]
        extra_wl = [x for x in runnable if x in chosen]
    if a.scale:
        extra_wl.append("s1")
    return libs, peer_wl, extra_wl


def prepare(a: argparse.Namespace, results: dict[str, Any], setup_libs: list[str]) -> None:
    """The harness copy, its venvs, and aioqueue's source in .venv-aioqueue (recorded)."""
    results["harness_patches"] = prepare_peers(Path(a.peers_dir).resolve(), PEERS_COPY)
    src: Path | None = None
    if "aioqueue" in setup_libs:
        if a.commit:
            src, sha = export_commit(a.commit)
            results["aioqueue_src"] = {"commit": sha, "from": f"git archive {a.commit}"}
        else:
            src, repo = REPO, results["repo"]
            results["aioqueue_src"] = {
                "commit": repo["commit"],
                "from": "working tree",
                "dirty": repo["dirty"],
            }
    run_setup(setup_libs, src, a.reinstall_aioqueue, a.setup_timeout)
    if src is not None:
        results["aioqueue_src"]["bytecode"] = precompile(src)


def peers_phase(
    a: argparse.Namespace, results: dict[str, Any], libs: list[str], wl: list[str], stamp: str
) -> str:
    """Run the harness; its results, ratios and versions into ``results``; its table."""
    with ForeignCpu() as fc:
        peers = run_peers(
            libs,
            wl,
            stamp,
            repeats=a.repeats,
            quick=a.quick,
            timeout=a.peers_timeout,
        )
    peers["foreign_cpu"] = fc.report()
    if note := foreign_note("the peers' harness", peers["foreign_cpu"]):
        peers["notes"].append(note)
    results["peers"] = peers
    results["versions"] = {lib: e.get("versions") for lib, e in peers["libraries"].items()}
    table, results["ratios"] = peers_table(peers, libs)
    return table


def extras_phase(
    a: argparse.Namespace, results: dict[str, Any], wl: list[str], overrides: dict[str, Any]
) -> tuple[str, str]:
    """Run our workloads; their results into ``results``; their table and the scale table."""
    with ForeignCpu() as fc:
        extra = run_extras(wl, overrides, quick=a.quick, repeats=a.repeats)
    extra["foreign_cpu"] = fc.report()
    if note := foreign_note("the extra workloads", extra["foreign_cpu"]):
        extra["notes"] = [note]
    results["extra"] = extra
    return extras_table(extra, results.get("peers")), scale_table(extra)


def record(
    a: argparse.Namespace,
    argv: Sequence[str] | None,
    libs: list[str],
    peer_wl: list[str],
    extra_wl: list[str],
    overrides: dict[str, Any],
) -> dict[str, Any]:
    """The start of the JSON: when, where, which code, with which configuration."""
    config = {
        "quick": a.quick,
        "repeats": 1 if a.quick else a.repeats,
        "libs": libs,
        "peer_workloads": peer_wl if not a.skip_peers else [],
        "extra_workloads": extra_wl if not a.skip_extra else [],
        "scale": a.scale,
        "overrides": overrides,
        "argv": sys.argv[1:] if argv is None else list(argv),
    }
    return {
        "schema": 1,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "host": host_info(),
        "repo": git_info(),
        "config": config,
        "definitions": {n: w.what for n, w in WORKLOADS.items()},
    }


def main(argv: Sequence[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if a.role == "extra":
        return run_trial(a.workload, a.url, json.loads(a.params))
    if a.list:
        list_workloads()
        return 0

    def on_term(_sig: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    t_start = time.time()
    libs, peer_wl, extra_wl = select(a)
    overrides = parse_sets(a.set)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    results = record(a, argv, libs, peer_wl, extra_wl, overrides)
    need_peers = not a.skip_peers and bool(peer_wl)
    need_extra = not a.skip_extra and bool(extra_wl)
    tables: dict[str, str] = {}
    try:
        if need_peers or need_extra:
            setup_libs = (libs if need_peers else []) + (["aioqueue"] if need_extra else [])
            prepare(a, results, setup_libs)
        if need_peers:
            tables["peers"] = peers_phase(a, results, libs, peer_wl, stamp)
        if need_extra:
            tables["extra"], tables["scale"] = extras_phase(a, results, extra_wl, overrides)
        tables["targets"] = targets_table(results.get("ratios", {}), results.get("extra"))
    except KeyboardInterrupt:
        log("interrupted; writing partial results")
        results["interrupted"] = True
    results["elapsed_s"] = round(time.time() - t_start, 1)
    results["tables"] = {k: v for k, v in tables.items() if v}
    write_results(results, Path(a.out) if a.out else None, stamp, a.quick)
    return 130 if results.get("interrupted") else 0


if __name__ == "__main__":
    sys.exit(main())
