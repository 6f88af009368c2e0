"""MkDocs hooks for the documentation site (mkdocs.yml, ``hooks:``).

The API reference (docs/api.md) is generated from the public API, ``aioqueue.__all__`` and
``aioqueue.testing.__all__``: the line ``<!-- api-reference -->`` (alone on its line) becomes one
mkdocstrings entry (``::: aioqueue.Name``) per public name, grouped by the module that defines
it, so a name added to ``__all__`` is documented without editing the page, and a docstring that
names a parameter the signature does not have fails the strict build.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

MARKER = "<!-- api-reference -->"

#: section titles for the modules that define public names, in page order; a module missing
#: here gets a section after these, titled by its name
SECTIONS = {
    "aioqueue._app.app": "The App",
    "aioqueue._app.task": "Tasks",
    "aioqueue._model.job": "Jobs",
    "aioqueue._app.context": "The running job",
    "aioqueue._queue.queue": "Queues and the pull API",
    "aioqueue._queue.sharded": "Sharded queues",
    "aioqueue._app.batch": "Batches and chains",
    "aioqueue._app.schedules": "Schedules",
    "aioqueue._worker.worker": "Workers",
    "aioqueue._queue.registry": "The worker registry",
    "aioqueue._model.hooks": "Hooks and middleware",
    "aioqueue._app.logs": "Logs",
    "aioqueue._app.sync": "The blocking producer",
    "aioqueue._queue.inspect": "Inspection",
    "aioqueue._queue.events": "Job events",
    "aioqueue._model.serialize": "Serializers",
    "aioqueue._store.embedded": "The embedded server",
    "aioqueue._model.exceptions": "Exceptions",
    "aioqueue.testing": "The testing kit: aioqueue.testing",
    "aioqueue.metrics": "Prometheus metrics: aioqueue.metrics",
    "aioqueue.otel": "OpenTelemetry traces: aioqueue.otel",
    "aioqueue.dashboard": "The web dashboard: aioqueue.dashboard",
    "aioqueue.contrib.django": "Enqueue on a Django commit: aioqueue.contrib.django",
    "aioqueue.contrib.sqlalchemy": "Enqueue on an SQLAlchemy commit: aioqueue.contrib.sqlalchemy",
}

#: public attributes that are internals, left out of the reference (mkdocs.yml's ``filters``,
#: checked by tests/test_doc_site.py): the App's client and result waiter, a task's codecs, the
#: schedules' declaration hook of the App's decorators; a queue's door to its keys and its
#: enqueue coalescer, what a Job handle asks of its queue, a task's record builder, the
#: queue that made a reservation (the collaborators' public faces instead of reads of
#: private attributes, issue 25)
HIDDEN = (
    "redis",
    "result_waiter",
    "args_decoder",
    "result_converter",
    "declare",
    "door",
    "coalescer",
    "leases",
    "enqueue_chain",
    "job_state",
    "wait_result",
    "builder",
    "made_by",
)

#: the public modules besides ``aioqueue`` whose ``__all__`` the reference documents
MODULES = (
    "aioqueue.testing",
    "aioqueue.metrics",
    "aioqueue.otel",
    "aioqueue.dashboard",
    "aioqueue.contrib.django",
    "aioqueue.contrib.sqlalchemy",
)


def definitions() -> dict[str, list[str]]:
    """Where each top-level class and function of the package's private modules is defined
    (its name: the dotted modules that define one of that name), read from the source."""
    import ast

    root = Path(__file__).resolve().parent / "aioqueue"
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("_*/*.py")):
        dotted = ".".join(("aioqueue", *path.relative_to(root).with_suffix("").parts))
        for node in ast.parse(path.read_text("utf-8")).body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                found.setdefault(node.name, []).append(dotted)
    return found


def public_names() -> dict[str, list[str]]:
    """Every public name (``aioqueue.App``, ``aioqueue.testing.run_until_empty``), by the
    module that defines it, in page order."""
    import importlib

    import aioqueue

    defined = definitions()
    groups: dict[str, list[str]] = {}
    for package in (aioqueue, *(importlib.import_module(m) for m in MODULES)):
        for name in package.__all__:
            if name.startswith("__"):
                continue
            # the private module that defines it (public names say ``__module__ ==
            # "aioqueue"``); a name that is no class or function (a type alias) stays with
            # its package
            value = getattr(package, name)
            home = next(
                (
                    m
                    for m in defined.get(name, [])
                    if vars(importlib.import_module(m)).get(name) is value
                ),
                package.__name__,
            )
            if package is not aioqueue:
                home = package.__name__  # a public module's names stay in its section
            groups.setdefault(home, []).append(f"{package.__name__}.{name}")
    order = [m for m in SECTIONS if m in groups] + sorted(set(groups) - set(SECTIONS))
    return {home: groups[home] for home in order}


def api_reference() -> str:
    """Return the Markdown of the API reference: a section per module, an entry per name."""
    lines: list[str] = []
    for home, names in public_names().items():
        lines += [f"## {SECTIONS.get(home, home)}", ""]
        if home == "aioqueue._model.exceptions":  # the tree of the families, from its docstring
            lines += [_exception_tree(), ""]
        for name in names:
            lines += [f"::: {name}", "    options:", "      heading_level: 3", ""]
    return "\n".join(lines)


def _exception_tree() -> str:
    """The exception tree drawn in ``aioqueue._model.exceptions``'s docstring, as a code block."""
    import aioqueue._model.exceptions

    doc = inspect.getdoc(aioqueue._model.exceptions) or ""
    intro, _, rest = doc.partition("::\n\n")
    tree = rest.split("\n\n")[0]
    return f"{intro.strip()}:\n\n```\n{inspect.cleandoc(tree)}\n```"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Expand the API reference marker, a line of its own (mkdocs event hook); the marker
    quoted in a sentence (development.md) stays as it is."""
    lines = markdown.split("\n")
    if MARKER not in lines:
        return markdown
    return "\n".join(api_reference() if line == MARKER else line for line in lines)
