"""The event loop the in-process benchmarks run on: uvloop (the worker CLI's default) when it
is installed, else asyncio's own. Stdlib-only at import, like ``run.py``'s orchestrator."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def run(coro: Coroutine[Any, Any, T], use_uvloop: bool) -> T:
    """Run ``coro`` to completion on a new loop (uvloop's if ``use_uvloop``)."""
    if use_uvloop:
        import uvloop

        result: T = uvloop.run(coro)
        return result
    return asyncio.run(coro)
