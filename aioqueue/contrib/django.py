"""Enqueue a job when the current Django transaction commits.

.. code-block:: python

    from aioqueue.contrib.django import enqueue_on_commit

    with transaction.atomic():
        order = Order.objects.create(...)
        enqueue_on_commit(send_receipt, order.pk)  # stored only if the transaction commits

The job is stored by the App's blocking producer (``app.sync()``) from a
``transaction.on_commit`` callback of the default database: after a rollback nothing is
enqueued; outside a transaction (autocommit) it is enqueued at once. Django runs on-commit
callbacks after the commit, so an enqueue that fails there (Redis unreachable) raises from the
code that committed while the rows are already stored: see docs/integrations.md for what to do
(the returned id makes a later retry idempotent).
"""

from __future__ import annotations

from functools import partial
from typing import ParamSpec, TypeVar

from django.db import transaction

from .._app.task import BoundTask, Task
from . import with_job_id

__all__ = ["enqueue_on_commit"]

P = ParamSpec("P")
R = TypeVar("R")


def enqueue_on_commit(
    task: Task[P, R] | BoundTask[P, R], /, *args: P.args, **kwargs: P.kwargs
) -> str:
    """Enqueue a job of ``task`` (or ``task.options(...)``) when the transaction of Django's
    default database commits (at once when none is open); returns the job's id.

    The call is checked against the task's signature now; the id is chosen now (unless the
    options give one), so it can be saved with the transaction's rows.

    Raises:
        TypeError: the arguments do not fit the function's signature.
    """
    bound, job_id = with_job_id(task, args, kwargs)
    transaction.on_commit(partial(bound.task.app.sync().enqueue, bound, *args, **kwargs))
    return job_id
