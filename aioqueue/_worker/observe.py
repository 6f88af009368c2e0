"""The worker's observer seam: what a worker tells an observer (``aioqueue.metrics``'
``WorkerMetrics``) about its jobs, leases and claims, if it has one.

A worker without an observer (the default) checks one attribute against None at each of
these points and runs nothing else: metrics off costs nothing measurable. An observer is
called on the worker's event loop, synchronously: it must be quick and must not raise.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .._app.app import App
    from .._model.record import Claimed
    from .slots import Slots


class Observed(Protocol):
    """What an observer may read of the worker it watches (a ``Worker`` is one)."""

    @property
    def app(self) -> App: ...
    @property
    def concurrency(self) -> int: ...
    @property
    def unknown_task_grace(self) -> float: ...
    @property
    def slots(self) -> Slots[Any]: ...


class WorkerObserver(Protocol):
    """What a ``Worker(observer=...)`` reports, as it happens."""

    def bind(self, worker: Observed) -> None:
        """The worker this observer watches, once, when the worker is made (an observer
        may read ``worker.running_jobs`` and the like when it is scraped)."""

    def job_started(self, queue: str, job: Claimed) -> None:
        """A leased job's run started."""

    def job_done(
        self, queue: str, job: Claimed, run: asyncio.Task[Any], *, cancelled: bool, lost: bool
    ) -> None:
        """A run ended: ``run`` is its finished task (its result is the runner's outcome, or
        it was cancelled: by a cancellation request if ``cancelled``, because the lease was
        lost if ``lost``, else by shutdown)."""

    def leases_renewed(self, queue: str, renewed: int, lost: int) -> None:
        """A heartbeat renewed ``renewed`` leases and found ``lost`` of them gone."""

    def claimed(self, queue: str, jobs: int) -> None:
        """One claim round trip leased ``jobs`` jobs (0: it found none)."""

    def handed(self, queue: str, jobs: int) -> None:
        """A parked wait was handed ``jobs`` jobs by producers (no claim needed)."""
