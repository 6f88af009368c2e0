"""The package's folders form layers that point one way: a module imports only modules of its
own folder or of lower folders, at run time and under ``if TYPE_CHECKING:`` alike. The rule is
one line per folder (``FOLDERS``); each folder's ``__init__`` docstring says the same in words, and
docs/development.md's map is generated from both (``python3 dev.py map``)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import aioqueue

from .support import layermap

PKG = Path(aioqueue.__file__).resolve().parent

# lowest first: a unit may import units listed before it, and itself
FOLDERS: list[str] = [
    "_version",  # the version string
    "_model",  # values and their encodings: no Redis I/O
    "_store",  # the one door to Redis/Valkey
    "_queue",  # a queue and its faces
    "_app",  # the App, tasks, batches, schedules
    "_worker",  # the consumer pool
    "metrics",  # public extras over the worker
    "otel",
    "testing",
    "contrib",
    "dashboard",
    "_cli",  # the command line
    "__init__",  # the public names
    "__main__",
]
RANK = {name: i for i, name in enumerate(FOLDERS)}


def unit_of(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def sources() -> Iterator[Path]:
    yield from sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(path: Path, source: str | None = None) -> tuple[set[str], set[str]]:
    """The aioqueue modules (dotted, from the package) a module imports: (at run time, only
    for type checking)."""
    package = list(path.relative_to(PKG).with_suffix("").parts)[:-1]
    if path.name == "__init__.py":
        package = list(path.relative_to(PKG).parent.parts)
    runtime: set[str] = set()
    typing: set[str] = set()

    def resolve(node: ast.ImportFrom) -> list[str]:
        if node.level == 0:
            mod = node.module or ""
            if not (mod == "aioqueue" or mod.startswith("aioqueue.")):
                return []
            base = mod.split(".")[1:]
        else:
            base = package[: len(package) - node.level + 1] + (
                node.module.split(".") if node.module else []
            )
        if base:
            return [".".join(base)]
        return [alias.name for alias in node.names]  # from aioqueue import x (a module or a name)

    def visit(node: ast.AST, found: set[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for inner in child.body:
                    visit_one(inner, typing)
                for other in child.orelse:
                    visit_one(other, found)
                continue
            visit_one(child, found)

    def visit_one(child: ast.AST, found: set[str]) -> None:
        if isinstance(child, ast.ImportFrom):
            found.update(resolve(child))
        elif isinstance(child, ast.Import):
            for alias in child.names:
                if alias.name.startswith("aioqueue."):
                    found.add(alias.name.split(".", 1)[1])
        visit(child, found)

    visit(ast.parse(path.read_text("utf-8") if source is None else source), runtime)
    return runtime, typing - runtime


def unit_of_dotted(dotted: str) -> str | None:
    head = dotted.split(".")[0]
    return head if head in RANK else None


def test_the_docs_map_is_the_tree() -> None:
    page = layermap.PAGE.read_text("utf-8")
    assert layermap.current(page) == layermap.render(FOLDERS), "run: python3 dev.py map"


def test_every_module_is_in_a_folder_of_the_map() -> None:
    units = {unit_of(p) for p in sources()}
    assert units == set(RANK), f"not in FOLDERS: {units - set(RANK)}; gone: {set(RANK) - units}"


def test_the_top_level_holds_only_public_modules_and_folders() -> None:
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "_version.py", "metrics.py", "otel.py"]


@pytest.mark.parametrize("path", list(sources()), ids=lambda p: str(p.relative_to(PKG)))
def test_a_module_imports_only_its_own_folder_or_lower_ones(path: Path) -> None:
    me = unit_of(path)
    runtime, typing = imports(path)
    for kind, found in (("at run time", runtime), ("for type checking", typing)):
        for dotted in found:
            other = unit_of_dotted(dotted)
            if other is None or other == me:
                continue
            assert RANK[other] < RANK[me], f"{path.relative_to(PKG)} imports {dotted} {kind}"


def _graph(kind: int) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sources():
        rel = path.relative_to(PKG).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        found = imports(path)
        deps = found[0] | (found[1] if kind else set())
        graph[name] = {d for d in deps if d != name and not name.startswith(d + ".")}
    return graph


def knots(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for dep in graph.get(node, ()):
            if dep not in graph:
                continue
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = set()
            while True:
                top = stack.pop()
                component.add(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


# no module is in a cycle, not even through type-only imports (issue 25): lower modules type
# what they need of their owners against Protocols from below (_queue/owner.py, _app/owners.py),
# the App's middleware type takes its JobContext as Any (hooks.py), and Task, Call and Chain,
# which name each other in their signatures, live in one module (task.py)


def test_no_import_cycle_at_run_time() -> None:
    assert knots(_graph(0)) == []


def test_no_import_cycle_at_type_level() -> None:
    assert knots(_graph(1)) == []


def test_the_checker_sees_function_level_imports_and_type_checking_ones() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "from ..\x5fmodel.keys import check_name\n"
        "if TYPE_CHECKING:\n"
        "    from ..\x5fapp.app import App\n"
        "def f() -> None:\n"
        "    from ..\x5fworker.worker import Worker\n"
    )
    sample = PKG / "_queue" / "sample.py"
    assert imports(sample, source) == ({"_model.keys", "_worker.worker"}, {"_app.app"})
