#!/usr/bin/env python3
"""The project's task runner; standard library only, so it works on a bare Python.

Usage: python3 dev.py {setup,test,lint,check,docs,demo,bench} [args...]

    setup   create .venv and install the package with its dev and docs extras (skipped when
            up to date)
    test    run pytest in .venv, in parallel (-n 4) with branch coverage; extra arguments are
            passed to pytest after those (-n 0: one process; --no-cov: no coverage)
    lint    ruff check, ruff format --check, mypy
    check   lint, then test
    docs    build the documentation site into site/ (mkdocs build --strict); extra arguments
            go to mkdocs build
    demo    run examples/demo.py
    bench   run benchmarks/run.py; extra arguments are passed to it
    map     write docs/development.md's package map from the tree (folders' and modules'
            docstrings, in tests/test_layers.py's order)
    package build the wheel and the sdist, check them (twine, their contents), install the
            wheel (not editable) in a fresh virtualenv and run `aioqueue --version`, the demo
            and its worker from it
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
STAMP = VENV / ".aioqueue-stamp"
WINDOWS = os.name == "nt"


def venv_bin(name: str) -> Path:
    """Return the path of an executable installed in the virtualenv."""
    if WINDOWS:
        return VENV / "Scripts" / (name + ".exe")
    return VENV / "bin" / name


PYTHON = venv_bin("python")
# "compat": a .pth file puts the repository on sys.path. Type checkers follow that (mypy and
# pyright read .pth files), whereas setuptools' default editable install is an import hook
# they cannot see: in a user's own project, aioqueue would then be untyped (Any) and the
# typed-enqueue checks would silently pass.
INSTALL = ("install", "--quiet", "-e", ".[dev,docs]", "--config-settings", "editable_mode=compat")
# setuptools (77+) warns on every compat install that the mode is transitional, a 12-line
# block that even --quiet prints; that one warning is silenced (by its message, in the build
# backend pip runs), the others still show. docs/development.md, "dev.py", says why compat.
INSTALL_ENV = {"PYTHONWARNINGS": "ignore:Compat editable installs"}


class Failed(Exception):
    """A command exited with a non-zero code."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def run(*args: str | Path, check: bool = True, env: dict[str, str] | None = None) -> int:
    """Print a command, run it from the repository root (with ``env`` added to the
    environment) and return its exit code.

    Raises:
        Failed: the command failed and ``check`` is true.
    """
    argv = [str(a) for a in args]
    shown = [os.path.relpath(a, ROOT) if Path(a).is_relative_to(ROOT) else a for a in argv]
    print("+ " + shlex.join(shown), flush=True)
    code = subprocess.call(argv, cwd=ROOT, env={**os.environ, **env} if env else None)
    if check and code != 0:
        raise Failed(code)
    return code


def wanted_stamp() -> str:
    """Hash what the install depends on: pyproject.toml, the base interpreter's version and
    the install command."""
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes())
    digest.update(sys.version.encode())
    digest.update(" ".join(INSTALL).encode())
    return digest.hexdigest()


def setup(_: list[str]) -> int:
    """Create .venv and install ``.[dev,docs]`` into it unless the stamp says it is current."""
    stamp = wanted_stamp()
    if PYTHON.exists() and STAMP.exists() and STAMP.read_text().strip() == stamp:
        return 0
    if not PYTHON.exists():
        run(sys.executable, "-m", "venv", VENV)
    pip = (PYTHON, "-m", "pip", "--disable-pip-version-check")
    run(*pip, "install", "--quiet", "--upgrade", "pip")
    run(*pip, *INSTALL, env=INSTALL_ENV)
    STAMP.write_text(stamp + "\n")
    return 0


# The suite runs in parallel (pytest-xdist): each worker process starts its own embedded Valkey
# (and local cluster, when a test needs one) and isolates its tests by key prefix. Most tests
# wait on servers and worker processes, so more workers than cores pay off (measured on a
# 2-core machine: docs/development.md, "Tests"). `--dist loadgroup` keeps the tests marked
# `xdist_group` on one worker. A later `-n 0` (or `-p no:xdist`) runs in one process.
PARALLEL = ("-n", "4", "--dist", "loadgroup")
# Branch coverage of aioqueue/ (configured in pyproject.toml, [tool.coverage]), one line per
# module not fully covered; `--no-cov` turns it off.
COVERAGE = ("--cov", "--cov-report=term:skip-covered")


def pytest_args(args: list[str]) -> list[str]:
    """The arguments ``dev.py test`` gives pytest: the defaults, then ``args`` (later wins)."""
    defaults: list[str] = []
    # against a server of one's own (AIOQUEUE_TEST_REDIS_URL) the workers would share it, and
    # the tests that empty a database of their own on it would race: one process then
    if not os.environ.get("AIOQUEUE_TEST_REDIS_URL") and not any("no:xdist" in a for a in args):
        defaults += PARALLEL
    defaults += COVERAGE
    return [*defaults, *args]


# Bytecode. A run starts hundreds of Python processes (the xdist workers, worker and command
# line processes), each importing aioqueue and its dependencies, and each xdist worker imports
# every test module with its asserts rewritten by pytest. Where PYTHONDONTWRITEBYTECODE is set
# (some containers set it), none of that is cached: every process compiles it all again, and
# four workers took 35 s (60 s of CPU) before the first test, 12 s (20 s) with the caches
# (docs/development.md, "Durations"). The suite writes them (into __pycache__/, ignored by
# git), and when the tests' rewritten modules are not cached yet, one process collects the
# suite first, so that the workers find them instead of each rewriting them all.
def warm_caches(argv: list[str]) -> None:
    """Before ``pytest argv``: bytecode written, and the rewrite cache when ``argv`` runs in
    parallel."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    if PARALLEL[0] not in argv:
        return
    if not any((ROOT / "tests" / "__pycache__").glob("conftest.*-pytest-*.pyc")):
        collect = [str(PYTHON), "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist"]
        collect += ["--no-cov", "-p", "no:cacheprovider"]
        print(f"+ {shlex.join(collect)} > /dev/null  # the caches, once", flush=True)
        subprocess.call(collect, cwd=ROOT, stdout=subprocess.DEVNULL)


def test(args: list[str]) -> int:
    """Run pytest (in parallel, with coverage) with ``args``, returning its exit code."""
    setup([])
    argv = pytest_args(args)
    warm_caches(argv)
    return run(PYTHON, "-m", "pytest", *argv, check=False)


def package_map(_: list[str]) -> int:
    """Write docs/development.md's package map from the tree (tests/support/layermap.py)."""
    setup([])
    return run(PYTHON, str(ROOT / "tests" / "support" / "layermap.py"), check=False)


def lint(_: list[str]) -> int:
    """Run every linter, even after one fails; fail if any failed."""
    setup([])
    checks = {
        "ruff check": run(PYTHON, "-m", "ruff", "check", ".", check=False),
        "ruff format": run(PYTHON, "-m", "ruff", "format", "--check", ".", check=False),
        "mypy": run(PYTHON, "-m", "mypy", check=False),
    }
    failed = [name for name, code in checks.items() if code]
    if failed:
        print(f"dev.py: lint failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def check(args: list[str]) -> int:
    """Lint, then test."""
    return lint([]) or test(args)


def docs(args: list[str]) -> int:
    """Build the documentation site in strict mode: a broken link, anchor or API reference
    (a docstring naming a parameter the signature lacks) fails the build."""
    setup([])
    # mkdocs-material's banner about MkDocs 2 says nothing about this build
    os.environ.setdefault("NO_MKDOCS_2_WARNING", "1")
    return run(venv_bin("mkdocs"), "build", "--strict", *args, check=False)


def demo(_: list[str]) -> int:
    """Run the quick-start demo."""
    setup([])
    return run(PYTHON, ROOT / "examples" / "demo.py", check=False)


def bench(args: list[str]) -> int:
    """Run the benchmarks with ``args``."""
    setup([])
    return run(PYTHON, ROOT / "benchmarks" / "run.py", *args, check=False)


# what the wheel must carry besides the modules: the scripts, the typing marker, the
# dashboard's templates and static files (each pattern relative to the repository's root)
PACKAGE_DATA = (
    "aioqueue/py.typed",
    "aioqueue/_store/lua/*.lua",
    "aioqueue/_store/lua/lib/*.lua",
    "aioqueue/dashboard/templates/*.html",
    "aioqueue/dashboard/static/*",
)


def package(_: list[str]) -> int:
    """Build, check and install the distributions the way a user gets them."""
    setup([])
    with tempfile.TemporaryDirectory(prefix="aioqueue-package-") as tmp:
        out = Path(tmp) / "dist"
        run(PYTHON, "-m", "build", "--outdir", out, ".")
        wheels, sdists = sorted(out.glob("*.whl")), sorted(out.glob("*.tar.gz"))
        if len(wheels) != 1 or len(sdists) != 1:
            print(f"dev.py: expected one wheel and one sdist in {out}", file=sys.stderr)
            return 1
        run(PYTHON, "-m", "twine", "check", "--strict", wheels[0], sdists[0])
        wanted = {str(f.relative_to(ROOT)) for pattern in PACKAGE_DATA for f in ROOT.glob(pattern)}
        wanted |= {str(f.relative_to(ROOT)) for f in (ROOT / "aioqueue").rglob("*.py")}
        in_wheel = set(zipfile.ZipFile(wheels[0]).namelist())
        with tarfile.open(sdists[0]) as sdist:
            in_sdist = {name.partition("/")[2] for name in sdist.getnames()}
        for name, has in (("wheel", in_wheel), ("sdist", in_sdist)):
            missing = sorted(wanted - has)
            if missing:
                print(f"dev.py: the {name} lacks {', '.join(missing)}", file=sys.stderr)
                return 1
        print(f"dev.py: the wheel and the sdist carry all {len(wanted)} files of the package")
        venv = Path(tmp) / "venv"
        run(sys.executable, "-m", "venv", venv)
        python = venv / ("Scripts/python.exe" if WINDOWS else "bin/python")
        pip = (python, "-m", "pip", "--disable-pip-version-check", "install", "--quiet")
        run(*pip, f"{wheels[0]}[embedded]")
        run(venv / ("Scripts/aioqueue.exe" if WINDOWS else "bin/aioqueue"), "--version")
        # the demo and its worker from a copy of examples/, away from the repository, so that
        # `import aioqueue` finds the installed wheel and nothing of the work tree
        demo = Path(tmp) / "demo"
        (demo / "examples").mkdir(parents=True)
        for name in ("__init__.py", "tasks.py", "demo.py"):
            (demo / "examples" / name).write_bytes((ROOT / "examples" / name).read_bytes())
        code = subprocess.call([python, demo / "examples" / "demo.py"], cwd=demo)
        if code != 0:
            print(f"dev.py: the demo from the installed wheel exited {code}", file=sys.stderr)
            return code
        where = subprocess.check_output(
            [python, "-c", "import aioqueue; print(aioqueue.__file__)"], cwd=demo, text=True
        )
        if not where.startswith(str(venv)):
            print(f"dev.py: aioqueue was imported from {where.strip()}", file=sys.stderr)
            return 1
    return 0


COMMANDS = {
    "setup": setup,
    "test": test,
    "lint": lint,
    "check": check,
    "docs": docs,
    "demo": demo,
    "bench": bench,
    "package": package,
    "map": package_map,
}


def main(argv: list[str]) -> int:
    """Dispatch ``argv[0]`` to its command; return the exit code."""
    if not argv or argv[0] not in COMMANDS:
        print((__doc__ or "").strip(), file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"], ["help"]) else 2
    try:
        return COMMANDS[argv[0]](argv[1:])
    except Failed as exc:
        print(f"dev.py: command failed with exit code {exc.code}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
