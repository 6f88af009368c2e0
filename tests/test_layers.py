"""The modules of aioqueue form layers that point one way: a module imports (at run time)
only modules of lower layers. Imports under ``if TYPE_CHECKING:`` are type hints, not
dependencies, and are allowed in any direction."""

from __future__ import annotations

import ast
from importlib import resources

import pytest

# lowest first; a module may import at run time only modules of strictly lower layers, or of
# its own layer where it is listed after them
LAYERS: list[list[str]] = [
    ["_version", "_exceptions", "_safetext"],
    ["_hooks", "_observe"],
    [
        "_limits",
        "_timeutil",
        "_keys",
        "_serialize",
        "_convert",
        "_signing",
        "_encryption",
        "_checks",
        "_compress",
        "_claimcheck",
        "_record",
        "_wire",
        "_funclib",
        "_hot",
        "_cron",
        "_schedauth",
        "_sentinel",
        "_cluster",
    ],
    ["_job"],
    ["_batchinfo"],
    ["_codec", "_handle"],
    ["_lua", "_durable"],
    ["_scriptreads"],
    ["_scripts", "_syncdoor"],
    ["_leases", "_registry", "_queuereg", "_tasktable", "_connect", "_coalesce"],
    ["_lister", "_inspect", "_admin", "_pull", "_events", "_rekey"],
    ["_unique", "_queue"],
    ["_results", "_context", "_logs", "_sharded"],
    ["_batch"],
    ["_task"],
    ["_schedules", "_scheddecl", "_sync"],
    ["_app"],
    ["_runner"],
    ["_fetch", "_loops", "_worker"],
    ["_embedded", "_health", "metrics", "otel"],
    ["_embedded", "_health"],
    # the dashboard and contrib subpackages (each one's modules' sources read as one)
    ["dashboard", "contrib"],
    [
        "_cli_format",
        "_schedules_cli",
        "_cli_show",
        "_cli_admin",
        "_cli_health",
        "_cli_metrics",
        "_cli_dashboard",
        "_cli_events",
        "_cli_load",
        "_cli_rekey",
        "_supervisor",
        "_cli",
    ],
    ["__init__", "__main__"],
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}
# the lower layers that issue 12 names: none of them may reach the App, batches or the worker
LOWER = {
    "_record",
    "_codec",
    "_scripts",
    "_wire",
    "_keys",
    "_queue",
    "_pull",
    "_job",
    "_leases",
    "_admin",
    "_inspect",
}
HIGHER = {"_app", "_batch", "_fetch", "_loops", "_runner", "_worker"}


def modules() -> dict[str, str]:
    pkg = resources.files("aioqueue")
    found = {p.name[:-3]: p.read_text("utf-8") for p in pkg.iterdir() if p.name.endswith(".py")}
    for sub in ("dashboard", "contrib"):
        found[sub] = "\n".join(
            p.read_text("utf-8") for p in (pkg / sub).iterdir() if p.name.endswith(".py")
        )
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_imports(source: str) -> set[str]:
    """The aioqueue modules a module imports when it runs (at any depth of its code)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.ImportFrom):
                if child.level == 1 and child.module:
                    found.add(child.module.split(".")[0])
                elif child.level == 0 and child.module and child.module.startswith("aioqueue."):
                    found.add(child.module.split(".")[1])
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.startswith("aioqueue."):
                        found.add(alias.name.split(".")[1])
            visit(child)

    visit(ast.parse(source))
    return found


def test_every_module_has_a_layer() -> None:
    assert set(modules()) == set(RANK)


@pytest.mark.parametrize("name", sorted(RANK))
def test_a_module_imports_only_lower_layers_at_run_time(name: str) -> None:
    source = modules()[name]
    for dep in runtime_imports(source) - {name}:
        assert dep in RANK, f"{name} imports unknown module {dep}"
        if RANK[dep] == RANK[name]:
            layer = LAYERS[RANK[name]]
            assert layer.index(dep) < layer.index(name), f"{name} imports {dep}, listed after it"
        assert RANK[dep] <= RANK[name], f"{name} imports {dep}, a higher layer, at run time"
    if name in LOWER:
        assert not runtime_imports(source) & HIGHER


def test_the_checker_sees_function_level_imports_and_ignores_type_checking_ones() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "from ._keys import check_name\n"
        "if TYPE_CHECKING:\n"
        "    from ._app import App\n"
        "def f() -> None:\n"
        "    from ._worker import Worker\n"
    )
    assert runtime_imports(source) == {"_keys", "_worker"}
