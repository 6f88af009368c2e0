"""The child process of process isolation (``isolation.py`` runs a pool of them): it imports
the task's module, runs one job at a time and answers, until its parent closes the pipe.

Messages on the pipe (pickled tuples of str, bytes and numbers; arguments and results are the
job's own serializer's bytes): in, ``(module, qualname, payload)`` with payload
``serializer.dumps([args, kwargs])`` as the job stored them, or None to import the function
only (before the job's timeout starts); out, with the child's resident memory in bytes last
(``rss``):

    ("loaded", rss)                               the function is imported, ready to run
    ("ok", result bytes, rss)                     the task returned
    ("retry", delay or None, message, rss)        it raised ``Retry``
    ("error", exception or None, type name, message, traceback text, rss)
                                                  it raised (the exception itself when it
                                                  pickles, else None and its type and text)

Nothing here touches Redis: the parent leases, renews and acknowledges; a child only computes.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import os
import pickle
import resource
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from .._model.convert import task_types
from .._model.exceptions import Retry
from .._model.serialize import Serializer

#: what a job's function resolves to: the function and its arguments' decoder (or None)
Resolved = tuple[Callable[..., Any], Callable[[Any, Any], tuple[Any, Any]] | None]


def resolve(serializer: Serializer, module: str, qualname: str) -> Resolved:
    """The function a task wraps, found by the name it was declared under (a module-level
    name holding the ``Task``, ``@app.task``, or the function itself), and the decoder of its
    typed arguments, as the worker's ``Task.args_decoder`` is made."""
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    inner = getattr(obj, "fn", None)
    fn = inner if callable(inner) else obj
    if serializer.name != "json":  # pickle and custom serializers keep types
        return fn, None
    return fn, task_types(fn, f"task {qualname!r}")[0]


def rss_bytes() -> int:
    """This process's resident memory now (Linux: /proc), else its peak (getrusage)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def run_one(serializer: Serializer, found: Resolved, payload: bytes) -> tuple[Any, ...]:
    """Run one job and say how it went (without the rss)."""
    fn, decode = found
    try:
        args, kwargs = serializer.loads(payload)
        if decode is not None:
            args, kwargs = decode(args, kwargs)
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            result = asyncio.run(_awaited(result))
        return ("ok", serializer.dumps(result))
    except Retry as r:
        return ("retry", r.delay, str(r))
    except BaseException as exc:
        text = "".join(traceback.format_exception(exc))
        try:
            pickle.loads(pickle.dumps(exc))
            sent: BaseException | None = exc
        except Exception:
            sent = None
        exc.__traceback__ = None  # the text above carries it; frames do not pickle
        return ("error", sent, type(exc).__name__, str(exc), text)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _die_with_worker(alive: Connection) -> None:
    """Exit as soon as the worker is gone: ``alive``'s other end is held by the worker alone and
    never written, so a read returns only when the worker closes it or dies (a SIGKILL
    included). A child busy in a job then does not run on, orphaned (the forkserver, its
    parent, outlives the worker while any child lives)."""

    def watch() -> None:
        with contextlib.suppress(EOFError, OSError):
            alive.recv_bytes()
        os._exit(ORPHANED)

    threading.Thread(target=watch, name="aioqueue-child-watch", daemon=True).start()


#: the exit code of a child whose worker is gone
ORPHANED = 75


def main(conn: Connection, alive: Connection, serializer: Serializer) -> None:
    """The child's loop: one job at a time until the parent closes the pipe (or sends None)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _die_with_worker(alive)
    cache: dict[tuple[str, str], Resolved] = {}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        module, qualname, payload = msg
        try:
            found = cache.get((module, qualname)) or resolve(serializer, module, qualname)
            cache[(module, qualname)] = found
            out = ("loaded",) if payload is None else run_one(serializer, found, payload)
        except Exception as exc:  # the function cannot be found here
            out = ("error", None, "TaskNotImportable", f"{module}.{qualname}: {exc}", "")
        conn.send((*out, rss_bytes()))
