"""Running ``python -m aioqueue`` as a user runs it: a process of its own (forked from a
prewarmed one: prewarmed.py), against a server and prefix."""

from __future__ import annotations

import os
import subprocess
import sys

from .prewarmed import run_aioqueue


def aioqueue_cli(
    url: str,
    prefix: str,
    *args: str,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m aioqueue ARGS --url URL --prefix PREFIX`` to its end (``stdin``: its input);
    ``env``: variables to set (over this process's environment, from which
    ``$AIOQUEUE_SIGNING_KEY`` is dropped)."""
    full = {k: v for k, v in os.environ.items() if k != "AIOQUEUE_SIGNING_KEY"}
    full.update(env or {})
    return run_aioqueue([*args, "--url", url, "--prefix", prefix], env=full, stdin=stdin)


def user_pytest(*args: str) -> list[str]:
    """The command that runs pytest on a user's test files (``args``) as a user would: no
    cache, and pytest-asyncio in its default strict mode (docs/testing.md's examples must
    work there)."""
    return [
        *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"),
        *("-p", "pytest_asyncio", "--asyncio-mode=strict"),
        *args,
    ]
