"""The README's first-run transcript shows the commands ``dev.py demo`` runs today."""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def dev_py() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dev_under_test", ROOT / "dev.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def transcript() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("```\n+ ", readme.index("python3 dev.py demo")) + 4
    return readme[start : readme.index("```", start)].splitlines()


def test_the_readme_transcript_shows_the_install_dev_py_runs() -> None:
    dev = dev_py()
    pip = ".venv/bin/python -m pip --disable-pip-version-check"
    commands = [line for line in transcript() if line.startswith("+ ")]
    assert commands[1:] == [
        f"+ {pip} install --quiet --upgrade pip",
        f"+ {pip} {shlex.join(dev.INSTALL)}",
        "+ .venv/bin/python examples/demo.py",
    ]
    assert commands[0].endswith(" -m venv .venv")
    # setuptools' deprecation block of compat installs is silenced by dev.py, not edited out
    assert dev.INSTALL_ENV["PYTHONWARNINGS"].startswith("ignore:Compat editable installs")
    assert not any(line.startswith(("!!", "****")) for line in transcript())
    assert transcript()[-1] == "worker stopped with exit code 0"
