"""The worker's process-isolation options of ``python -m aioqueue worker``: ``--isolation
process``, ``--children``, ``--max-jobs-per-child``, ``--max-memory-per-child``."""

from __future__ import annotations

import argparse

from .._worker.isolation import ProcessIsolation
from .parser import Parser


def add_isolation(w: Parser) -> None:
    """Add the isolation options to the worker's parser ``w``."""
    g = w.option_group("process isolation (docs/flow-control.md#isolation)")
    g.add_argument(
        "--isolation",
        choices=("process",),
        default=None,
        help='run every task in a child process (default: only tasks declared isolation="process")',
    )
    g.add_argument("--children", type=int, default=None, help="child processes at most")
    g.add_argument(
        "--max-jobs-per-child", type=int, default=None, help="retire a child after N jobs"
    )
    g.add_argument(
        "--max-memory-per-child",
        type=int,
        default=None,
        metavar="MB",
        help="retire a child whose resident memory is over MB after a job",
    )


def isolation_of(args: argparse.Namespace) -> ProcessIsolation:
    """The worker's ``ProcessIsolation`` from its command line.

    Raises:
        ConfigurationError: a count below 1.
    """
    mb = args.max_memory_per_child
    return ProcessIsolation(
        every_task=args.isolation == "process",
        processes=args.children,
        max_jobs_per_child=args.max_jobs_per_child,
        max_memory_per_child=None if mb is None else mb << 20,
    )
