"""The virtual clock: fast-forward the time the real scripts read, without sleeping.

An App made with ``App(..., testing=True)`` runs the test build of the scripts, whose one
clock (``now_ms()`` in lua/lib/core.lua) adds the offset stored in the queue's ``testclock``
key, else in the prefix's (``<prefix>:testclock``, standalone servers); its Python reads of
the server's time add it too (see aioqueue/_store/clock.py). ``VirtualClock.advance`` raises
that offset on the prefix and on every queue of the App, fires the schedule ticks that fell
due, and wakes the queues' idle consumers: what would be due by then is due now. Redis's own
TTLs (of job records, results, dead letters) run on the real clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from .._app.app import App
from .._app.schedules import Scheduler
from .._model.checks import to_ms
from .._model.exceptions import ConfigurationError
from .._model.keys import QueueKeys, prefix_testclock
from .._queue.queuereg import real_queues
from .._store.scriptreads import QueueReads


def door(app: App, queue: str | None = None) -> QueueReads:
    """The reads of one of ``app``'s queues (default: its default queue): its keys
    (``.keys``) and the server's clock as the App reads it (``.server_ms()``)."""
    return QueueReads(app.redis, QueueKeys(app.prefix, queue or app.default_queue))


#: scheduler passes per queue in one ``fire_schedules`` (each fires up to 100 ticks)
_MAX_PASSES = 100


class VirtualClock:
    """The virtual clock of an App made with ``testing=True`` (docs/testing.md).

    Args:
        app: an open App made with ``testing=True`` (any other is refused: production Apps
            run scripts that ignore the offset).
        queues: the queues the clock moves, besides the App's (its default queue, its
            tasks' queues and the queues its workers registered under its prefix); on a
            standalone server every other queue of the prefix follows the prefix's offset,
            on a Cluster only these do.

    Raises:
        ConfigurationError: the App was not made with ``testing=True``.
    """

    def __init__(self, app: App, queues: Sequence[str] = ()) -> None:
        if not app.testing:
            raise ConfigurationError(
                "VirtualClock needs an App made with testing=True (test mode); no other App "
                "lets its clock be moved"
            )
        self.app = app
        self.queues = list(queues)

    async def offset(self) -> timedelta:
        """How far the App's clock is ahead of the server's."""
        raw = await self.app.redis.get(prefix_testclock(self.app.prefix))
        return timedelta(milliseconds=int(raw or 0))

    async def now(self) -> datetime:
        """The App's time: the server's clock plus the offset (aware, UTC)."""
        return datetime.fromtimestamp(await door(self.app).server_ms() / 1000, UTC)

    async def advance_to(self, when: datetime) -> None:
        """Move the clock forward to ``when`` (an aware datetime; one already past: no move),
        as ``advance`` does: e.g. to a schedule's ``next_run``."""
        if when.tzinfo is None:
            raise ConfigurationError("advance_to needs a timezone-aware datetime")
        await self.advance(max(when - await self.now(), timedelta(0)))

    async def advance(self, by: float | timedelta) -> None:
        """Move the clock ``by`` seconds (or a timedelta) forward: delayed jobs and retries,
        leases, rate windows, ``expires=`` and schedule ticks that fall within it are due
        now. Fires the schedule ticks due by then (as a woken scheduler would), then wakes
        the idle consumers of every queue so that none waits the real time.

        Raises:
            ConfigurationError: ``by`` is negative (the clock never goes back).
        """
        ms = to_ms(by, "advance")
        names = await self._queues()
        total = int((await self.offset()).total_seconds() * 1000) + ms
        pipe = self.app.redis.pipeline(transaction=False)
        pipe.set(prefix_testclock(self.app.prefix), total)  # every other queue (standalone)
        for name in names:
            pipe.set(door(self.app, name).keys.testclock, total)
        await pipe.execute()
        await self.fire_schedules(names)
        pipe = self.app.redis.pipeline(transaction=False)
        for name in names:
            pipe.lpush(door(self.app, name).keys.wake, b"1")
        await pipe.execute()

    async def fire_schedules(self, queues: Sequence[str] | None = None) -> int:
        """Fire the schedule ticks due by the virtual clock on ``queues`` (default: the
        clock's): one pass of a worker's scheduler, repeated while it fires. Returns the
        number of ticks fired (each enqueued its job)."""
        scheduler = Scheduler(
            self.app, list(queues) if queues is not None else await self._queues()
        )
        for name in scheduler.queues:
            for _ in range(_MAX_PASSES):  # 0: it fired (or set garbage aside): look again
                if await scheduler.fire_due(name) > 0:
                    break
        return scheduler.fired

    async def _queues(self) -> list[str]:
        app = self.app
        names = [app.default_queue, *self.queues, *(t.queue for t in app.tasks.values())]
        names += await real_queues(app.redis, app.prefix, names)
        return list(dict.fromkeys(names))
