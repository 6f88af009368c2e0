"""What a task declares about isolation (``@app.task(isolation="process")``), checked when it
is declared: an isolated function must be importable by name in a child process, and a sync
task with a timeout and no isolation is warned about (its timeout cannot stop it).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, Literal

from .exceptions import ConfigurationError, SyncTimeoutWarning

#: how a task runs: None, in the worker (async on its loop, sync in its thread pool);
#: "process", in a child process that a timeout kills (``_worker/isolation.py``)
Isolation = Literal["process"] | None


def check_isolation(
    isolation: object, fn: Callable[..., Any], name: str, timeout: float | None, is_async: bool
) -> Isolation:
    """The task's isolation, checked; warns ``SyncTimeoutWarning`` for a sync task whose
    timeout cannot stop it.

    Raises:
        ConfigurationError: an isolation other than None or "process", or an isolated
            function a child could not import by name (a lambda, one defined in a function).
    """
    if isolation is None:
        if timeout is not None and not is_async:
            warnings.warn(
                f"task {name!r} is sync and has a timeout of {timeout} s: on timeout its job "
                "fails but its thread runs on to the end (a thread cannot be stopped); "
                'declare it isolation="process" to have the timeout kill it',
                SyncTimeoutWarning,
                stacklevel=5,
            )
        return None
    if isolation != "process":
        raise ConfigurationError(f'isolation must be None or "process", not {isolation!r}')
    qualname = getattr(fn, "__qualname__", "")
    if not qualname or "<" in qualname or not getattr(fn, "__module__", None):
        raise ConfigurationError(
            f'task {name!r}: isolation="process" needs a function defined at the top level '
            f"of a module (a child process imports it by name), not {qualname or fn!r}"
        )
    return "process"
