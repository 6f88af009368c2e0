"""Lifecycle hooks and middleware: what an App runs around its workers, its jobs and its
enqueues, registered with ``@app.on_startup``, ``@app.on_shutdown``, ``@app.middleware``,
``@app.before_enqueue`` and ``@app.after_enqueue``.

Order and failures (docs/hooks.md):

- startup hooks run in registration order when a worker starts, before it fetches a job; one
  that raises stops the worker (``StartupFailed``) and no shutdown hook runs;
- shutdown hooks run in reverse order once the worker's jobs are finished and acknowledged;
  one that raises is logged and the others still run;
- middleware wraps each run of a job, the first registered outermost; one that raises fails
  that attempt like an exception of the task (retried by the task's policy), never the worker;
- before-enqueue hooks run before anything is stored and may refuse by raising; after-enqueue
  hooks run once the jobs are stored, and what they raise is logged, not raised (the jobs are
  in the queue: an error there would invite a duplicate enqueue).

With nothing registered each of these costs one truth test of an empty tuple or list.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from .._model.exceptions import StartupFailed
from .._model.hooks import CallNext, EnqueueEvent, EnqueueHook, LifecycleHook, State

logger = logging.getLogger("aioqueue.hooks")


#: ``async def middleware(job: JobContext, call_next: CallNext) -> Any``; the job is typed
#: ``Any`` here so that this module (below ``context.py``, which types ``ctx.app`` as the App
#: that holds these hooks) needs no JobContext: no cycle, even of types (issue 25)
Middleware = Callable[[Any, CallNext], Awaitable[Any]]


#: ``def hook(event: EnqueueEvent) -> None``: plain functions, so that the blocking producer
def _is_async(fn: object) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
    )


def _name(fn: object) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


# the hooks' decorators return the function they are given, with its own type
LH = TypeVar("LH", bound=LifecycleHook)
MW = TypeVar("MW", bound=Middleware)
EH = TypeVar("EH", bound=EnqueueHook)
T = TypeVar("T")


class Hooks:
    """The hooks and middleware registered on one App (``app.hooks``)."""

    __slots__ = (
        "after_enqueue",
        "before_enqueue",
        "middleware",
        "on_enqueue",
        "shutdown",
        "startup",
    )

    def __init__(self) -> None:
        self.startup: list[LifecycleHook] = []
        self.shutdown: list[LifecycleHook] = []
        self.middleware: list[Middleware] = []
        self.before_enqueue: list[EnqueueHook] = []
        self.after_enqueue: list[EnqueueHook] = []
        #: True when any enqueue hook is registered (the producers' one check)
        self.on_enqueue = False

    def add_enqueue_hook(self, hooks: list[EnqueueHook], fn: EH) -> EH:
        """Register a before- or after-enqueue hook (a plain function); returns it."""
        if not callable(fn) or _is_async(fn):
            raise TypeError(f"an enqueue hook must be a plain (not async) function, not {fn!r}")
        hooks.append(fn)
        self.on_enqueue = True
        return fn

    @staticmethod
    def add_async(hooks: list[Any], fn: T, what: str) -> T:
        """Register a startup or shutdown hook or a middleware (an async function); returns
        it."""
        if not _is_async(fn):
            raise TypeError(f"{what} must be an async function (async def), not {fn!r}")
        hooks.append(fn)
        return fn

    # ------------------------------------------------------------------ workers
    async def start(self, state: State) -> None:
        """Run the startup hooks in registration order.

        Raises:
            StartupFailed: a hook raised (its exception is the cause).
        """
        for hook in self.startup:
            try:
                await hook(state)
            except Exception as exc:
                detail = " ".join(f"{type(exc).__name__}: {exc}".split())
                raise StartupFailed(f"startup hook {_name(hook)} failed: {detail}") from exc

    async def stop(self, state: State) -> None:
        """Run the shutdown hooks in reverse order; one that raises is logged."""
        for hook in reversed(self.shutdown):
            try:
                await hook(state)
            except Exception:
                logger.exception("shutdown hook %s failed", _name(hook))

    # ------------------------------------------------------------------ producers
    def before(self, queue: str, task: str, job_ids: tuple[str, ...]) -> EnqueueEvent:
        """Run the before-enqueue hooks (what they raise refuses the enqueue); the event."""
        event = EnqueueEvent(queue, task, job_ids)
        for hook in self.before_enqueue:
            hook(event)
        return event

    def after(self, event: EnqueueEvent) -> None:
        """Run the after-enqueue hooks; one that raises is logged (the jobs are stored)."""
        for hook in self.after_enqueue:
            try:
                hook(event)
            except Exception:
                logger.exception("after-enqueue hook %s failed", _name(hook))


async def run_through(middleware: Sequence[Middleware], job: object, body: CallNext) -> Any:
    """Run ``body`` (the task) inside ``middleware``, the first one outermost; ``job`` is
    the running job's JobContext."""
    call: CallNext = body
    for m in reversed(middleware):
        call = functools.partial(m, job, call)
    return await call()
