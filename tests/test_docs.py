"""The documentation's claims hold: mypy checks a user's enqueue calls (run from outside the
repository), and the documentation names tests that exist: every ``tests/...py`` and
``tests/...py::name`` a page cites (guarantees.md maps each invariant to the tests that would
fail if it broke; reliability.md and known-issues.md name regression tests), and every
invariant section of guarantees.md names at least one test file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([*ROOT.glob("docs/*.md"), ROOT / "README.md"])
CITED = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?")


def _defines(path: Path, name: str) -> bool:
    return (
        re.search(rf"^(?:async )?def {name}\b|^class {name}\b", path.read_text(), re.M) is not None
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_cited_test_exists(page: Path) -> None:
    missing = []
    for match in CITED.finditer(page.read_text()):
        path, name = ROOT / match.group(1), match.group(2)
        if not path.exists():
            missing.append(match.group(1))
        elif name and not _defines(path, name):
            missing.append(f"{match.group(1)}::{name}")
    assert not missing, f"{page.name} cites tests that do not exist: {missing}"


def _invariant_sections() -> list[tuple[str, str]]:
    text = (ROOT / "docs" / "guarantees.md").read_text()
    sections = re.split(r"^### ", text, flags=re.M)[1:]
    return [(s.splitlines()[0], s) for s in sections if re.match(r"I\d+ ", s)]


def test_every_invariant_in_guarantees_names_its_tests() -> None:
    """Each invariant names at least one test by ``file::test`` (that it exists is
    test_every_cited_test_exists's); a file alone would not say which test fails."""
    invariants = _invariant_sections()
    assert invariants, "guarantees.md has no invariant sections"
    for title, section in invariants:
        cited = [(m.group(1), m.group(2)) for m in CITED.finditer(section)]
        assert cited, f"guarantees.md: {title} names no test"
        assert all((ROOT / c).exists() for c, _ in cited), (title, cited)
        assert any(name for _, name in cited), f"guarantees.md: {title} names no test by name"


#: the invariants whose every citation names its test (I9 and I10 are written elsewhere)
NAMED_ONLY = tuple(f"I{n} " for n in range(1, 9))


def test_the_core_invariants_cite_tests_only_by_name() -> None:
    for title, section in _invariant_sections():
        if not title.startswith(NAMED_ONLY):
            continue
        bare = [m.group(1) for m in CITED.finditer(section) if not m.group(2)]
        assert not bare, f"guarantees.md: {title} cites test files without a test: {bare}"


USER_CODE = """
from aioqueue import App

app = App()


@app.task
async def add(a: int, b: int) -> int:
    return a + b


async def main() -> None:
    job = await add.enqueue("one", 2)
    reveal_type(job)
"""


@pytest.mark.slow
def test_mypy_in_a_users_project_checks_enqueue_calls(tmp_path: Path) -> None:
    # the guide's claim (tasks.md: enqueue is checked against the task's signature), from a
    # directory outside the repository, with aioqueue installed the way dev.py installs it:
    # an install type checkers cannot follow would make the package Any and the check pass
    (tmp_path / "use.py").write_text(USER_CODE)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "use.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert "import-not-found" not in out, out
    assert 'Argument 1 to "enqueue" of "Task" has incompatible type "str"; expected "int"' in out
    assert 'Revealed type is "aioqueue._model.job.Job[int]"' in out
    assert proc.returncode == 1
