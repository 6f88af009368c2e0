"""The documentation site (mkdocs.yml, built by ``python3 dev.py docs`` in strict mode in CI):
its API reference covers the whole public API, and every page is in its navigation."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import aioqueue
import mkdocs_hooks

ROOT = Path(__file__).resolve().parents[1]


def test_the_api_reference_documents_every_public_name_once() -> None:
    page = mkdocs_hooks.api_reference()
    entries = re.findall(r"^::: ([\w.]+)$", page, re.M)
    wanted = [f"aioqueue.{n}" for n in aioqueue.__all__ if not n.startswith("__")]
    for name in mkdocs_hooks.MODULES:  # the other public modules: each one's __all__
        module = importlib.import_module(name)
        wanted += [f"{name}.{n}" for n in module.__all__]
    assert {"aioqueue.testing", "aioqueue.metrics", "aioqueue.otel", "aioqueue.dashboard"} <= set(
        mkdocs_hooks.MODULES
    )
    assert sorted(entries) == sorted(wanted)
    # grouped under headings, the App first and the exceptions together
    assert page.startswith("## The App\n\n::: aioqueue.App\n")
    exceptions = mkdocs_hooks.public_names()["aioqueue._model.exceptions"]
    assert {"aioqueue.AioQueueError", "aioqueue.JobFailed", "aioqueue.Retry"} <= set(exceptions)


def test_the_api_page_holds_the_marker_the_hook_expands() -> None:
    api = (ROOT / "docs" / "api.md").read_text()
    assert mkdocs_hooks.MARKER in api
    expanded = mkdocs_hooks.on_page_markdown(api, page=None)
    assert mkdocs_hooks.MARKER not in expanded
    assert "::: aioqueue.Worker" in expanded
    # other pages are left alone, even where they quote the marker in a sentence
    for name in ("index.md", "development.md"):
        other = (ROOT / "docs" / name).read_text()
        assert mkdocs_hooks.on_page_markdown(other, page=None) == other
    assert mkdocs_hooks.MARKER in (ROOT / "docs" / "development.md").read_text()


def test_every_page_is_in_the_navigation() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    listed = set(re.findall(r"^\s+- (?:[^:\n]+: )?([\w-]+\.md)$", config, re.M))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert listed == pages, (
        f"not in mkdocs.yml's nav: {sorted(pages - listed)}; missing: {sorted(listed - pages)}"
    )


def test_the_state_diagram_is_drawn_not_shown_as_code() -> None:
    # mkdocs.yml's mermaid fence: Material draws a <pre class="mermaid"> block
    config = (ROOT / "mkdocs.yml").read_text()
    assert "- name: mermaid" in config
    assert "format: !!python/name:pymdownx.superfences.fence_code_format" in config
    assert "```mermaid\nstateDiagram-v2" in (ROOT / "docs" / "guarantees.md").read_text()


def public_members() -> Iterator[str]:
    """Every public method and property of every class in the reference (``aioqueue.Queue.
    reserve``), inherited ones included, but the internals named in ``mkdocs_hooks.HIDDEN``."""
    for names in mkdocs_hooks.public_names().values():
        for full in names:
            home, _, name = full.rpartition(".")
            obj = getattr(importlib.import_module(home), name)
            if not inspect.isclass(obj):
                continue
            for klass in obj.__mro__:
                if not klass.__module__.startswith("aioqueue"):
                    continue
                for member, value in vars(klass).items():
                    if member.startswith("_") or member in mkdocs_hooks.HIDDEN:
                        continue
                    if isinstance(value, property | classmethod | staticmethod) or (
                        inspect.isfunction(value)
                    ):
                        yield f"{full}.{member}"


@pytest.fixture(scope="module")
def built_api(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The API reference page as the strict build makes it."""
    out = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=True,
        capture_output=True,
        timeout=300,
    )
    return (out / "api" / "index.html").read_text()


def test_every_public_method_is_in_the_built_reference(built_api: str) -> None:
    shown = set(re.findall(r'id="(aioqueue[\w.]*)"', built_api))
    missing = sorted(set(public_members()) - shown)
    assert missing == []  # a public method without a docstring is not rendered: give it one
    assert "aioqueue.Queue.reserve" in shown  # a Queue's inherited (pull API) methods
    assert not [h for h in shown if h.rpartition(".")[2] in mkdocs_hooks.HIDDEN]


def test_the_hidden_internals_are_the_ones_the_site_filters() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    (line,) = [x for x in config.splitlines() if x.strip().startswith("filters:")]
    wanted = ["!^_", *(f"!^{name}$" for name in mkdocs_hooks.HIDDEN)]
    assert json.loads(line.split(":", 1)[1]) == wanted
