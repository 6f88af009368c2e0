"""The documentation's Python examples run as pasted, so the docs cannot drift from the code.

Every ```python block in README.md and docs/*.md is one of two kinds:

- runnable: imports included, no top-level ``await``, a timeout on every wait
  (``result(timeout=...)``, ``wait(timeout=...)``). Each is run in a process of its own (with a
  timeout; forked from one that imported aioqueue already, tests/support/prewarmed.py)
  against the suite's server: ``$AIOQUEUE_REDIS_URL`` points at a database of its own, emptied
  first, so ``App()`` with default settings sees no other test's keys. A block whose first line
  is ``# name.py`` is also saved under that name beside every block of its page, so a later
  block can import it (``from jobs import app``). The line
  ``<!-- run with a worker: MODULE:APP -->`` before a block runs
  ``python -m aioqueue worker MODULE:APP`` while the block runs (the quick start's producer).
  ``<!-- run with pytest -->`` runs the block as a test file with pytest (testing.md's tests),
  in pytest-asyncio's strict mode, and it must pass at least one test.
  ``<!-- run in an App: NAME -->`` runs a block written as lines of a program (``await`` at the
  top level, names defined elsewhere) inside ``async with doc_setup.app:`` after
  ``from doc_setup import *``, where ``doc_setup`` is ``tests/doc_setups/NAME.py``: the App and
  the tasks and names the page's text has defined (qos.md's ``reports`` queue, ...).
- a fragment: the line before it is ``<!-- fragment -->`` (invisible on the rendered page).
  Fragments are parts of a larger program (``await`` at the top level, names defined elsewhere,
  a server that is not there); they are only rendered.

A block that is neither marked nor runnable fails here, with what to do.
"""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from redis.asyncio import Redis

from .support.clirun import user_pytest
from .support.prewarmed import Prewarmed

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *ROOT.glob("docs/*.md")])

FRAGMENT = "<!-- fragment -->"
WORKER = re.compile(r"<!-- run with a worker: ([\w.]+:\w+) -->")
PYTEST = "<!-- run with pytest -->"
IN_APP = re.compile(r"<!-- run in an App: (\w+) -->")
SETUPS = Path(__file__).resolve().parent / "doc_setups"
FILE_NAME = re.compile(r"# ([\w/]+\.py)\b")
#: the database the snippets use on the suite's server (the other tests use database 0)
SNIPPET_DB = 13
#: the longest one snippet may take on a busy machine
RUN_TIMEOUT = 90.0
#: methods that wait and must be given a timeout in a runnable snippet
WAITS = frozenset({"result", "wait"})


@dataclass(frozen=True)
class Snippet:
    page: Path
    line: int  # of the opening fence, 1-based
    code: str
    fragment: bool
    worker: str | None  # "module:app" to run a worker for, while the snippet runs
    pytest: bool  # a test file, run by pytest
    setup: str | None = None  # run inside ``async with app:`` after tests/doc_setups/<setup>.py

    @property
    def program(self) -> str:
        """What runs: the block, or for a block run in an App, the block inside it."""
        if self.setup is None:
            return self.code
        body = "".join(f"        {line}\n" if line else "\n" for line in self.code.splitlines())
        return (
            "import asyncio\n\nimport doc_setup\nfrom doc_setup import *  # noqa: F403\n\n\n"
            f"async def main() -> None:\n    async with doc_setup.app:\n{body}\n\n"
            "asyncio.run(main())\n"
        )

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def file_name(self) -> str | None:
        match = FILE_NAME.match(self.code)
        return match.group(1) if match else None


def snippets(page: Path) -> list[Snippet]:
    """The page's ```python blocks, with the marker on the line before each."""
    lines = page.read_text().splitlines()
    found = []
    i = 0
    while i < len(lines):
        if lines[i].strip().startswith("```python"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```"))
            before = lines[i - 1].strip() if i else ""
            worker = WORKER.fullmatch(before)
            in_app = IN_APP.fullmatch(before)
            found.append(
                Snippet(
                    page=page,
                    line=i + 1,
                    code="\n".join(lines[i + 1 : end]) + "\n",
                    fragment=before == FRAGMENT,
                    worker=worker.group(1) if worker else None,
                    pytest=before == PYTEST,
                    setup=in_app.group(1) if in_app else None,
                )
            )
            i = end
        i += 1
    return found


ALL = [s for page in PAGES for s in snippets(page)]
RUNNABLE = [s for s in ALL if not s.fragment]


def problems(snippet: Snippet) -> list[str]:
    """Why a block not marked as a fragment cannot run as pasted (empty if it can)."""
    try:
        # compiled, not only parsed: the compiler refuses ``await`` outside a coroutine
        compile(snippet.program, snippet.where, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return [f"not valid Python as pasted ({exc.msg}, line {exc.lineno})"]
    tree = ast.parse(snippet.program, snippet.where)
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in WAITS
            and not any(k.arg == "timeout" for k in node.keywords)
        ):
            found.append(f"line {node.lineno}: .{node.func.attr}() waits without a timeout")
    return found


def test_every_block_is_runnable_or_marked() -> None:
    assert len(ALL) > 40, "the pages have fewer Python blocks than expected: is the parser broken?"
    assert RUNNABLE, "no runnable block left: the test would prove nothing"
    bad = {s.where: p for s in RUNNABLE if (p := problems(s))}
    assert not bad, (
        f"these ```python blocks do not run as pasted: {bad}; make each run (imports, "
        f"asyncio.run, a timeout on every wait), or put {FRAGMENT} on the line before it"
    )


def test_the_markers_stand_before_python_blocks() -> None:
    # a marker before anything else (a typo, a moved block) would silently mark nothing
    stray = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        for n, line in enumerate(lines[:-1]):
            marker = (
                line.strip() in (FRAGMENT, PYTEST)
                or WORKER.fullmatch(line.strip())
                or IN_APP.fullmatch(line.strip())
            )
            if marker and not lines[n + 1].strip().startswith("```python"):
                stray.append(f"{page.relative_to(ROOT)}:{n + 1}")
    assert not stray, f"markers not followed by a ```python block: {stray}"


def test_the_checks_catch_what_cannot_run() -> None:
    page = ROOT / "README.md"
    cases = {
        "await job.result(timeout=1)\n": "not valid Python",
        "import asyncio\n\nasync def f(job):\n    return await job.result()\n": "without a",
        "async def f(batch):\n    await batch.wait()\n": "without a timeout",
    }
    for code, expected in cases.items():
        found = problems(Snippet(page, 1, code, fragment=False, worker=None, pytest=False))
        assert any(expected in p for p in found), (code, found)
    ok = "async def f(job):\n    return await job.result(timeout=1)\n"
    assert problems(Snippet(page, 1, ok, fragment=False, worker=None, pytest=False)) == []


def _with_db(url: str, db: int) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "unix":
        query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query) if k != "db"]
        return parts._replace(query=urllib.parse.urlencode([*query, ("db", str(db))])).geturl()
    return parts._replace(path=f"/{db}").geturl()


@pytest.fixture
async def snippet_url(redis_url: str) -> str:
    """The suite's server, on the snippets' own database, emptied."""
    url = _with_db(redis_url, SNIPPET_DB)
    client = Redis.from_url(url)
    try:
        await client.flushdb()
    finally:
        await client.aclose()
    return url


@pytest.fixture(scope="module")
def prewarmed() -> Iterator[Prewarmed]:
    """The process the examples are forked from (tests/support/prewarmed.py)."""
    with Prewarmed() as p:
        yield p


def _stop(proc: subprocess.Popen[str]) -> str:
    """Stop a worker process the way an operator does (SIGTERM), and return its output."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate(timeout=30)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("snippet", RUNNABLE, ids=lambda s: s.where)
def test_snippet_runs(
    snippet: Snippet, snippet_url: str, tmp_path: Path, prewarmed: Prewarmed
) -> None:
    assert not problems(snippet), "see test_every_block_is_runnable_or_marked"
    for other in snippets(snippet.page):  # the page's named files, importable by the others
        if other.file_name and not other.fragment:
            (tmp_path / other.file_name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / other.file_name).write_text(other.code)
    script = tmp_path / ("test_snippet.py" if snippet.pytest else "snippet_under_test.py")
    script.write_text(snippet.program)
    if snippet.setup is not None:
        (tmp_path / "doc_setup.py").write_text((SETUPS / f"{snippet.setup}.py").read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOQUEUE_")}
    env.update(
        AIOQUEUE_REDIS_URL=snippet_url,
        # the testing kit's plugin uses it instead of starting a server of its own
        AIOQUEUE_TEST_REDIS_URL=snippet_url,
        # for the examples that sign (tasks.md): any key of at least 16 bytes
        AIOQUEUE_SIGNING_KEY="doc-snippets-signing-key",
        PYTHONPATH=str(tmp_path),
        PYTHONUNBUFFERED="1",
    )
    worker = None
    if snippet.worker:
        worker = subprocess.Popen(
            [sys.executable, "-m", "aioqueue", "worker", snippet.worker],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        if snippet.pytest:
            proc = subprocess.run(
                user_pytest(script.name),  # in pytest-asyncio's strict mode
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=RUN_TIMEOUT,
                check=False,
            )
        else:  # `python snippet_under_test.py`, forked from a process that imported aioqueue
            proc = prewarmed.run([script.name], cwd=tmp_path, env=env, timeout=RUN_TIMEOUT)
    finally:
        worker_output = _stop(worker) if worker else ""
    assert proc.returncode == 0, (
        f"{snippet.where} failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        + (f"\nworker:\n{worker_output}" if worker else "")
    )
    if snippet.pytest:
        assert re.search(r"\b[1-9]\d* passed", proc.stdout), proc.stdout
