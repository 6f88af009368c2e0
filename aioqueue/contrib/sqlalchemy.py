"""Enqueue jobs when an SQLAlchemy asyncio session commits.

.. code-block:: python

    from aioqueue.contrib.sqlalchemy import enqueue_after_commit, enqueued

    async with session.begin():
        session.add(Order(...))
        enqueue_after_commit(session, send_receipt, order_id)  # only if this commits
    await enqueued(session)  # optional: wait for the enqueues, raise if one failed

The calls are kept with the session's transaction: when its outermost transaction commits
they are enqueued (each by ``await task.enqueue(...)`` on the running event loop, started in
the order given); when it rolls back they are dropped, and so are the calls made inside a
savepoint (``begin_nested()``) that rolls back. The enqueues start right after the commit;
``await enqueued(session)`` waits for them and raises the first error; without it, an error
is logged (logger ``aioqueue.contrib.sqlalchemy``) with the job's id. Each call returns the
job's id, chosen before the commit, so it can be stored with the rows and a retried enqueue
stores the same job once.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session, SessionTransaction

from .._app.task import BoundTask, Task
from . import with_job_id

__all__ = ["enqueue_after_commit", "enqueued"]

P = ParamSpec("P")
R = TypeVar("R")

logger = logging.getLogger(__name__)
_KEY = "aioqueue.after_commit"


@dataclass
class _Call:
    bound: BoundTask[Any, Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    #: the (innermost) transaction it was made in: dropped if that one rolls back
    transaction: SessionTransaction


@dataclass
class _Pending:
    calls: list[_Call] = field(default_factory=list)
    #: the enqueues started by commits: running, or failed and not yet reported by enqueued()
    started: set[asyncio.Task[None]] = field(default_factory=set)


def enqueue_after_commit(
    session: AsyncSession,
    task: Task[P, R] | BoundTask[P, R],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> str:
    """Enqueue a job of ``task`` (or ``task.options(...)``) once ``session``'s transaction
    commits; nothing if it rolls back. Returns the job's id.

    The call is checked against the task's signature now. Call it inside a transaction (one
    is begun if the session has none yet, as the session's next statement would).

    Raises:
        TypeError: the arguments do not fit the function's signature.
    """
    bound, job_id = with_job_id(task, args, kwargs)
    sync = session.sync_session
    tx = sync.get_nested_transaction() or sync.get_transaction() or sync.begin()
    _pending(sync).calls.append(_Call(bound, args, dict(kwargs), tx))
    return job_id


async def enqueued(session: AsyncSession) -> None:
    """Wait for the enqueues that ``session``'s commits started and that have not finished.

    Raises:
        Exception: the first of them that failed (after all of them have ended).
    """
    pending: _Pending | None = session.sync_session.info.get(_KEY)
    if pending is None:
        return
    started, pending.started = pending.started, set()
    results = await asyncio.gather(*started, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r


def _pending(sync: Session) -> _Pending:
    pending: _Pending | None = sync.info.get(_KEY)
    if pending is None:
        pending = sync.info[_KEY] = _Pending()
        event.listen(sync, "after_commit", _after_commit)
        event.listen(sync, "after_soft_rollback", _after_soft_rollback)
    return pending


def _within(tx: SessionTransaction | None, ended: SessionTransaction) -> bool:
    """Whether ``tx`` is ``ended`` or a transaction nested in it."""
    while tx is not None:
        if tx is ended:
            return True
        tx = tx.parent
    return False


def _after_soft_rollback(sync: Session, previous_transaction: SessionTransaction) -> None:
    # any rollback, of a savepoint or of the whole transaction: drop what was made in it
    pending: _Pending = sync.info[_KEY]
    pending.calls = [c for c in pending.calls if not _within(c.transaction, previous_transaction)]


def _after_commit(sync: Session) -> None:
    # the outermost transaction committed (a savepoint's release does not fire this)
    pending: _Pending = sync.info[_KEY]
    calls, pending.calls = pending.calls, []
    loop = asyncio.get_running_loop()  # the session's greenlet runs inside the event loop
    for call in calls:
        task = loop.create_task(_enqueue(call))
        pending.started.add(task)
        task.add_done_callback(partial(_ended, pending))


def _ended(pending: _Pending, task: asyncio.Task[None]) -> None:
    # a finished enqueue is forgotten; a failed one is kept for enqueued() to raise (it was
    # logged already: retrieving it here keeps asyncio from warning about it again)
    if task.cancelled() or task.exception() is None:
        pending.started.discard(task)


async def _enqueue(call: _Call) -> None:
    try:
        await call.bound.enqueue(*call.args, **call.kwargs)
    except Exception:
        logger.exception(
            "job %s (%s) was not enqueued after its transaction committed",
            call.bound.opts.job_id,
            call.bound.task.name,
        )
        raise
