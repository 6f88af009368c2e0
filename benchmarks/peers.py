"""The peers' harness: a patched copy of it, its virtualenvs, and one run of its ``bench.py``.

The shared harness (``<repo>/../shared/peers-bench``, or ``--peers-dir``) is read-only, so
``prepare_peers`` copies its .py/.sh/README files and ``locks/`` into ``benchmarks/.peers/``
(gitignored) on every run, keeping the virtualenvs already there, and switches the aioqueue
adapter on in the copy's ``bench.py`` by text substitution (``PATCHES``).  ``run_setup`` creates
missing venvs with the copy's ``setup.sh`` (PyPI the first time) and keeps ``.venv-aioqueue``
installed editable from the source being measured.  ``run_peers`` runs the copy's ``bench.py``
once for every library and workload (w1, w1b, w1c, w2, w3, w4).

Stdlib-only at import, like every module the orchestrator imports.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import PEERS_COPY, REPO, log

#: the libraries of one default run, in the table's order: the asyncio peers, the two
#: synchronous queues (celery, dramatiq), the raw floor and aioqueue. chasquimq (LIB_VENV) is
#: left out: it needs Redis 8.6 (XADD ... IDMP, XACKDEL), which the embedded Valkey does not
#: have, so on the default server the harness skips each of its trials; name it in --libs
#: with a Redis 8.6+ --server-bin to measure it.
ALL_LIBS = (
    "arq",
    "saq",
    "streaq",
    "taskiq",
    "bullmq",
    "celery",
    "dramatiq",
    "raw",
    "aioqueue",
)
#: never a "best peer": the floor and ourselves
REFERENCE_LIBS = ("raw", "aioqueue")
PEER_WORKLOADS = ("w1", "w1b", "w1c", "w2", "w3", "w4")
#: what aioqueue can run without a worker CLI (producer-only workloads)
NO_WORKER_WORKLOADS = ("w1", "w1b", "w1c")

# lib -> (setup.sh name, venv directory in the harness copy)
LIB_VENV: dict[str, tuple[str, str]] = {
    "arq": ("main", ".venv"),
    "streaq": ("main", ".venv"),
    "saq": ("saq", ".venv-saq"),
    "taskiq": ("taskiq", ".venv-taskiq"),
    "bullmq": ("bullmq", ".venv-bullmq"),
    "chasquimq": ("chasquimq", ".venv-chasquimq"),
    "celery": ("celery", ".venv-celery"),
    "dramatiq": ("dramatiq", ".venv-dramatiq"),
    "raw": ("raw", ".venv-raw"),
    "aioqueue": ("aioqueue", ".venv-aioqueue"),
}

# Text substitutions applied to the harness copy's bench.py (never to the shared original).
# (what, old, new, required): a required one that does not match aborts the run.
PATCHES: tuple[tuple[str, str, str, bool], ...] = (
    (
        "register AioqueueAdapter in ADAPTERS",
        "        # AioqueueAdapter,\n",
        "        AioqueueAdapter,  # enabled by aioqueue benchmarks/peers.py\n",
        True,
    ),
    (
        "AioqueueAdapter.queued(): the queue's count (the harness's sanity check after enqueue)",
        "        return None  # API: return the app's count of queued jobs once it has one "
        "(sanity check)\n",
        '        return (await self.app.queue().counts())["queued"]  # patched by peers.py\n',
        False,
    ),
)


# --------------------------------------------------------------------------- #
# The harness copy and its virtualenvs                                         #
# --------------------------------------------------------------------------- #
def _copy(src: Path, target: Path, mode: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        target.chmod(0o644)  # the shared files are read-only; their copies must be replaceable
    shutil.copyfile(src, target)
    target.chmod(mode)


def prepare_peers(src: Path, dst: Path) -> list[str]:
    """Refresh the writable harness copy from ``src`` (venvs and runs are kept); returns the
    patches applied to its bench.py."""
    if not (src / "bench.py").is_file():
        raise SystemExit(f"peers harness not found at {src} (use --peers-dir)")
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "locks").mkdir(exist_ok=True)
    files = [p for p in src.iterdir() if p.is_file() and p.suffix in (".py", ".sh", ".md")]
    files += [p for p in (src / ".gitignore",) if p.is_file()]
    for f in files:
        _copy(f, dst / f.name, 0o755 if f.suffix == ".sh" else 0o644)
    for f in sorted((src / "locks").glob("*.txt")):
        _copy(f, dst / "locks" / f.name, 0o644)
    bench = dst / "bench.py"
    text = bench.read_text()
    applied = []
    for what, old, new, required in PATCHES:
        count = text.count(old)
        if count == 1:
            text = text.replace(old, new)
            applied.append(what)
        elif required:
            raise SystemExit(f"cannot patch the harness copy ({what}): found {count} matches")
        else:
            log(f"note: optional harness patch not applied ({what})")
    bench.write_text(text)
    return applied


def venv_python(lib: str) -> Path:
    """The interpreter of ``lib``'s venv in the harness copy."""
    return _setup_python(LIB_VENV[lib][0])


def _setup_python(name: str) -> Path:
    """The interpreter of the venv that ``setup.sh <name>`` creates."""
    venv = next(v for n, v in LIB_VENV.values() if n == name)
    return PEERS_COPY / venv / "bin" / "python"


def run_setup(
    libs: Sequence[str], aioqueue_src: Path | None, reinstall: bool, timeout: float
) -> None:
    """Create the harness venvs that are missing (``setup.sh``; PyPI the first time), and
    (re)install aioqueue editable from ``aioqueue_src`` when it is not installed from there."""
    names = ["main"]  # .venv runs the harness and holds the server binary
    names += [LIB_VENV[lib][0] for lib in libs if lib in LIB_VENV]
    missing = sorted({n for n in names if not _setup_python(n).exists()})
    if aioqueue_src is not None and "aioqueue" not in missing:
        installed = aioqueue_installed_from()
        if reinstall or installed != aioqueue_src:
            log(f"aioqueue in .venv-aioqueue comes from {installed}; installing {aioqueue_src}")
            missing.append("aioqueue")
    if not missing:
        return
    argv = ["bash", "setup.sh", *missing]
    if "aioqueue" in missing:
        argv += ["--aioqueue", str(aioqueue_src or REPO)]
    log(f"setting up venvs: {' '.join(argv[2:])} (timeout {timeout:.0f}s) ...")
    t0 = time.time()
    cp = subprocess.run(
        argv, cwd=PEERS_COPY, capture_output=True, text=True, timeout=timeout, check=False
    )
    noise = ("WARNING: Location", "WARNING: Ignoring")
    lines = [x for x in (cp.stdout + cp.stderr).splitlines() if not x.startswith(noise)]
    if cp.returncode != 0:
        print("\n".join(lines[-30:]), file=sys.stderr)
        raise SystemExit(f"setup.sh failed (rc={cp.returncode})")
    log(f"venvs ready in {time.time() - t0:.0f}s")


def precompile(src: Path) -> str:
    """Write the bytecode of ``src``'s aioqueue package for .venv-aioqueue's interpreter.

    A pip install of the wheel compiles every module at install time; the editable install
    the harness measures does not, and with ``PYTHONDONTWRITEBYTECODE`` set (as on our
    benchmark host) every worker the harness spawns would compile the whole package from
    source again: 0.12 s of CPU at 65 modules, counted in W2's "from spawn" and grown with
    the code base (round 3, docs/benchmarks.md). Python reads this bytecode only while it
    matches its source's mtime and size, so a stale file costs nothing but the compile."""
    py = venv_python("aioqueue")
    cp = subprocess.run(
        [str(py), "-m", "compileall", "-q", str(src / "aioqueue")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return "compiled" if cp.returncode == 0 else f"compileall failed: {cp.stderr.strip()[-200:]}"


def aioqueue_installed_from() -> Path | None:
    """The source folder of the editable aioqueue in .venv-aioqueue (PEP 610 direct_url.json)."""
    pattern = "lib/python*/site-packages/aioqueue-*.dist-info/direct_url.json"
    for f in (PEERS_COPY / ".venv-aioqueue").glob(pattern):
        with contextlib.suppress(OSError, ValueError, KeyError):
            url = str(json.loads(f.read_text())["url"])
            if url.startswith("file://"):
                return Path(url[len("file://") :]).resolve()
    return None


def export_commit(ref: str) -> tuple[Path, str]:
    """``git archive`` of ``ref`` into benchmarks/.peers/src/<sha>/ (a clean tree to measure
    while the working tree is being edited); returns the folder and the full commit id."""
    cp = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if cp.returncode != 0:
        raise SystemExit(f"--commit {ref}: not a commit of {REPO}")
    sha = cp.stdout.strip()
    dst = PEERS_COPY / "src" / sha[:12]
    if not (dst / "pyproject.toml").is_file():
        blob = subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", sha],
            capture_output=True,
            timeout=120,
            check=True,
        ).stdout
        dst.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            tar.extractall(dst, filter="data")
    return dst, sha


# --------------------------------------------------------------------------- #
# One run of the harness                                                       #
# --------------------------------------------------------------------------- #
def aioqueue_worker_cli() -> tuple[bool, str]:
    """Whether ``python -m aioqueue worker --help`` works in the aioqueue venv."""
    py = venv_python("aioqueue")
    try:
        cp = subprocess.run(
            [str(py), "-m", "aioqueue", "worker", "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tempfile.gettempdir(),  # import the installed package, not a local folder
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    out = (cp.stderr or cp.stdout).strip().splitlines()
    return cp.returncode == 0, (out[-1] if out else f"rc={cp.returncode}")


def run_bounded(argv: list[str], cwd: Path, timeout: float) -> int:
    """Run a child in its own session, output streamed through; SIGTERM to its group on timeout
    or interruption (the peers' harness then stops its workers and server itself)."""
    proc = subprocess.Popen(argv, cwd=cwd, start_new_session=True)
    try:
        return proc.wait(timeout)
    except (subprocess.TimeoutExpired, KeyboardInterrupt) as exc:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        if isinstance(exc, KeyboardInterrupt):
            raise
        log(f"{' '.join(argv[:3])} ... timed out after {timeout:.0f}s")
        return -1


def peers_parts(
    libs: list[str], workloads: list[str], cli_ok: bool
) -> list[tuple[list[str], list[str]]]:
    """(libs, workloads) per harness invocation: one normally; two when aioqueue's worker CLI
    does not start (everyone on the producer-only workloads, then the others on w2..w4 -- the
    same trial order as one run)."""
    if "aioqueue" not in libs or cli_ok:
        return [(libs, workloads)]
    first = [w for w in workloads if w in NO_WORKER_WORKLOADS]
    rest = [w for w in workloads if w not in NO_WORKER_WORKLOADS]
    parts = []
    if first:
        parts.append((libs, first))
    others = [lib for lib in libs if lib != "aioqueue"]
    if rest and others:
        parts.append((others, rest))
    return parts


def _cli_note(workloads: list[str]) -> tuple[bool, str, list[str]]:
    """Check aioqueue's worker CLI; (ok, the check's last line, notes for the table)."""
    cli_ok, cli_msg = aioqueue_worker_cli()
    if cli_ok:
        return cli_ok, cli_msg, []
    skipped = [w for w in workloads if w not in NO_WORKER_WORKLOADS]
    msg = (
        f"aioqueue's worker CLI fails (`python -m aioqueue worker --help`: {cli_msg}); "
        f"aioqueue runs only {','.join(NO_WORKER_WORKLOADS)}"
        + (f", not {','.join(skipped)}" if skipped else "")
    )
    log("NOTE: " + msg)
    return cli_ok, cli_msg, [msg]


def run_peers(
    libs: list[str],
    workloads: list[str],
    stamp: str,
    *,
    repeats: int,
    quick: bool,
    timeout: float,
) -> dict[str, Any]:
    """Run the harness copy's bench.py for ``libs`` x ``workloads``; its results, merged."""
    cli_ok, cli_msg, notes = _cli_note(workloads) if "aioqueue" in libs else (True, "", [])
    parts_out = []
    for i, (plibs, pworks) in enumerate(peers_parts(libs, workloads, cli_ok)):
        out = PEERS_COPY / f"results-run-{stamp}-{i + 1}.json"
        argv = [str(venv_python("arq")), "bench.py", "--libs", ",".join(plibs)]
        argv += ["--workloads", ",".join(pworks), "--repeats", str(repeats), "--out", str(out)]
        if quick:
            argv.append("--quick")
        log(f"peers harness: {' '.join(argv[1:])}")
        rc = run_bounded(argv, PEERS_COPY, timeout)
        part: dict[str, Any] = {"libs": plibs, "workloads": pworks, "rc": rc}
        if out.is_file():
            part["results"] = json.loads(out.read_text())
        else:
            part["error"] = f"bench.py wrote no results (rc={rc})"
            notes.append(f"peers part {i + 1} ({','.join(pworks)}): {part['error']}")
        parts_out.append(part)
    return {
        "aioqueue_worker_cli": cli_ok,
        "aioqueue_worker_cli_check": cli_msg,
        "parts": parts_out,
        "libraries": merge_libraries(parts_out),
        "notes": notes,
    }


def merge_libraries(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Every library's entry of the harness's JSON, the workloads of all parts in one."""
    libs: dict[str, Any] = {}
    for part in parts:
        for lib, entry in part.get("results", {}).get("libraries", {}).items():
            cur = libs.setdefault(lib, {k: v for k, v in entry.items() if k != "results"})
            cur.setdefault("results", {}).update(entry.get("results", {}))
            for k in ("error", "skipped"):
                if k in entry:
                    cur[k] = entry[k]
    return libs
