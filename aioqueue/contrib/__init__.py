"""Helpers that join aioqueue to other libraries; each module imports its library, so import
the one you use: ``aioqueue.contrib.django`` (enqueue when a Django transaction commits) and
``aioqueue.contrib.sqlalchemy`` (enqueue when an SQLAlchemy asyncio session commits).

Both give the job its id before the commit (returned to the caller), so the id can be stored
in the same transaction and an enqueue that is retried later stores the same job, once.
"""

from __future__ import annotations

import dataclasses
from typing import ParamSpec, TypeVar

from .._app.task import BoundTask, Task
from .._model.checks import new_job_id

__all__ = ["with_job_id"]

P = ParamSpec("P")
R = TypeVar("R")


def with_job_id(
    task: Task[P, R] | BoundTask[P, R], args: tuple[object, ...], kwargs: dict[str, object]
) -> tuple[BoundTask[P, R], str]:
    """``task`` with its options and a job id (a new one unless the options name one), and
    that id, after
    checking ``args`` and ``kwargs`` against its signature: a call that cannot be enqueued
    fails now, in the transaction, not after the commit.

    Raises:
        TypeError: the arguments do not fit the function's signature.
    """
    task.call(*args, **kwargs)  # type: ignore[arg-type]
    if isinstance(task, BoundTask) and task.opts.job_id is not None:
        return task, task.opts.job_id
    job_id = new_job_id()
    if isinstance(task, Task):
        return task.options(job_id=job_id), job_id
    return BoundTask(task.task, dataclasses.replace(task.opts, job_id=job_id)), job_id
