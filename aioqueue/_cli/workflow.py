"""``aioqueue workflow ID``: a workflow's steps as a tree with their states (``--json``: the
data), from ``_app/workflow.workflow_tree``."""

from __future__ import annotations

import argparse

from .._app.app import App
from .._app.workflow import WorkflowHandle, workflow_tree
from .._model.safetext import escape
from .format import echo, emit_json
from .load import EXIT_OK


async def show_workflow(app: App, args: argparse.Namespace) -> int:
    tree = await workflow_tree(WorkflowHandle(app, args.id, args.queue))
    if args.json:
        emit_json(tree)
        return EXIT_OK
    echo(f"workflow {escape(tree['id'])}  {escape(tree['name'])}  {tree['state']}")
    for row in tree["rows"]:
        more = row["after"][1:]
        also = f"  (also after {', '.join(escape(a) for a in more)})" if more else ""
        where = f"{escape(row['queue'])}/{escape(row['job'])}"
        echo(f"{'  ' * (row['depth'] + 1)}{escape(row['step'])}  {row['state']}  {where}{also}")
    if tree["more"]:
        echo(f"  ... and {tree['more']} more steps (--json for all)")
    return EXIT_OK
