"""Periodic schedules: declared in code (``@app.cron``, ``app.schedule``) or managed at run time
(``app.schedules.add / remove / list``), stored in Redis, and fired by the scheduler that every
worker runs (``Scheduler``).

A schedule lives on the queue of its task. Its definition and its next tick are stored there
(``cron:defs``, ``cron:next``); any number of schedulers race to fire a due tick, and
``schedule.lua`` lets exactly one of them: it compares the stored tick with the one the
scheduler read, judges it due by the server's clock, enqueues the tick's job (id
``cron:<name>:<tick ms>``) and stores the next tick, in one atomic step.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .._model.checks import check_name, to_ms
from .._model.claimcheck import put_blobs
from .._model.cron import DEFAULT_GRACE_MS, MissedPolicy, Spec, interval_ms, job_id_for
from .._model.exceptions import ConfigurationError, ServerRefused, ServerUnavailable
from .._model.record import JobRecord, Template
from .._model.schedauth import read_spec, stored_form, valid_tick
from .._queue.owner import QueueOwner
from .._store.loader import schedule_queues
from .._store.outcomes import TickOutcome
from .task import Task

if TYPE_CHECKING:
    from .._model.signing import Signer
    from .._store.scripts import QueueScripts

logger = logging.getLogger(__name__)


class ScheduleOwner(QueueOwner, Protocol):
    """What schedules use of the App (``app.App``; a protocol: no import cycle)."""

    @property
    def default_queue(self) -> str: ...
    @property
    def schedules(self) -> Schedules: ...


#: longest sleep of a scheduler between two looks at queues that have schedules (seconds)
POLL = 1.0
#: ... and at queues that have none (an idle worker stays almost silent): the first schedule
#: added at run time to such a queue is seen within this (its ticks meanwhile run late, within
#: their grace)
IDLE_POLL = 10.0
#: how often a scheduler stores the schedules declared in code again (seconds): after a server
#: that lost its data comes back, they return within this
RESYNC = 60.0
#: the most stored ticks a scheduler reads (and sets aside, if garbage) per pass of a queue
TICKS_PER_PASS = 1000
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A stored schedule, as ``app.schedules.list()`` and ``add()`` return it."""

    name: str
    task: str
    queue: str
    #: the cron expression (None for an interval)
    cron: str | None
    #: the cron expression's time zone (None: UTC)
    tz: str | None
    #: the interval (None for a cron expression)
    every: timedelta | None
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    missed: MissedPolicy
    #: the most a tick's job is delayed by its jitter
    jitter: timedelta
    #: a tick reached later than this is missed
    grace: timedelta
    #: when the next tick's job is due (None while the schedule has no stored tick)
    next_run: datetime | None
    #: declared in code (``@app.cron``, ``app.schedule``), not added at run time
    declared: bool


def schedule_info(spec: Spec, next_ms: int | None) -> ScheduleInfo:
    """What ``list()`` and ``add()`` show of a stored schedule (``next_ms``: its next tick)."""
    return ScheduleInfo(
        name=spec.name,
        task=spec.task,
        queue=spec.queue,
        cron=spec.cron,
        tz=spec.tz,
        every=None if spec.every_ms is None else timedelta(milliseconds=spec.every_ms),
        args=spec.args,
        kwargs=dict(spec.kwargs),
        missed=spec.missed,
        jitter=timedelta(milliseconds=spec.jitter_ms),
        grace=timedelta(milliseconds=spec.grace_ms),
        next_run=None if next_ms is None else datetime.fromtimestamp(next_ms / 1000, UTC),
        declared=spec.declared,
    )


def make_spec(
    app: ScheduleOwner,
    task: Task[Any, Any] | str,
    cron: str | None,
    every: float | timedelta | None,
    tz: str | None,
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None,
    name: str | None,
    missed: MissedPolicy,
    jitter: float | timedelta | None,
    grace: float | timedelta | None,
    queue: str | None,
    declared: bool,
) -> Spec:
    """A schedule's definition from the public arguments, checked.

    Raises:
        ConfigurationError: a bad value, or arguments that do not fit the task or JSON.
        TypeError: the arguments do not fit the task's signature.
    """
    if isinstance(task, Task):
        task_name, task_queue = task.name, task.queue
        task.builder.sig.check(tuple(args), dict(kwargs or {}))
    elif isinstance(task, str) and task:
        registered = app.tasks.get(task)
        task_name = task
        task_queue = registered.queue if registered is not None else app.default_queue
    else:
        raise ConfigurationError(f"a schedule names a task or its name, not {task!r}")
    if not isinstance(args, list | tuple):
        raise ConfigurationError(f"args must be a list or tuple, not {type(args).__name__}")
    spec = Spec(
        name=check_name("schedule name", name or task_name),
        task=task_name,
        queue=check_name("queue name", queue or task_queue),
        cron=cron,
        tz=tz,
        every_ms=None if every is None else interval_ms(every),
        args=tuple(args),
        kwargs=dict(kwargs or {}),
        missed=missed,
        jitter_ms=to_ms(jitter, "jitter") if jitter is not None else 0,
        grace_ms=to_ms(grace, "grace") if grace is not None else DEFAULT_GRACE_MS,
        declared=declared,
    )
    try:
        spec.to_json()
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"schedule {spec.name!r}: its arguments are stored as JSON: {exc}"
        ) from exc
    return spec


class Schedules:
    """``app.schedules``: the App's periodic schedules, declared in code or stored at run time
    (any process can add, remove and list them)."""

    __slots__ = ("_app", "declared")

    def __init__(self, app: ScheduleOwner) -> None:
        self._app = app
        #: the schedules declared in code, by (queue, name): workers store them on start
        self.declared: dict[tuple[str, str], Spec] = {}

    def declare(self, spec: Spec) -> None:
        key = (spec.queue, spec.name)
        if key in self.declared:
            raise ConfigurationError(
                f"a schedule named {spec.name!r} is already declared on queue {spec.queue!r}; "
                "pass name= to tell them apart"
            )
        self.declared[key] = spec

    async def add(
        self,
        task: Task[Any, Any] | str,
        *,
        cron: str | None = None,
        every: float | timedelta | None = None,
        tz: str | None = None,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        missed: MissedPolicy = "skip",
        jitter: float | timedelta | None = None,
        grace: float | timedelta | None = None,
        queue: str | None = None,
    ) -> ScheduleInfo:
        """Store a schedule (or replace the one of that name on its queue).

        Args:
            task: the task (or its name) each tick enqueues a job of.
            cron: a cron expression, 5 fields or 6 with seconds first (needs
                ``aioqueue[cron]``); or
            every: an interval (seconds or a timedelta); ticks fall on its multiples since
                the epoch.
            tz: the cron expression's time zone (default UTC).
            args: the job's positional arguments (stored as JSON).
            kwargs: the job's keyword arguments (stored as JSON).
            name: unique on its queue (default: the task's name).
            missed: what a tick reached more than ``grace`` late does: ``"skip"`` (no job
                for it) or ``"once"`` (one job for all the ticks missed in a row).
            jitter: delay each tick's job by up to this long (the same delay for a tick in
                every process).
            grace: how late a tick may be reached and still run (default 60 s).
            queue: the queue its jobs go to (default: the task's).

        Returns:
            the stored schedule, with its next run.
        """
        spec = make_spec(
            self._app,
            task,
            cron=cron,
            every=every,
            tz=tz,
            args=args,
            kwargs=kwargs,
            name=name,
            missed=missed,
            jitter=jitter,
            grace=grace,
            queue=queue,
            declared=False,
        )
        scripts = self._app.queue(spec.queue).door
        first = await store(scripts, spec, self._app.codec.signer)
        return schedule_info(spec, first)

    async def remove(self, name: str, *, queue: str | None = None) -> bool:
        """Remove a stored schedule; True if there was one. Without ``queue``, on every queue
        that has one of that name. A schedule declared in code comes back while workers
        declare it."""
        queues = [queue] if queue else await self._queues()
        removed = False
        for q in queues:
            removed = await self._app.queue(q).door.schedule_remove(name) or removed
        return removed

    async def list(self, *, queues: Sequence[str] | None = None) -> builtins.list[ScheduleInfo]:
        """The stored schedules with their next runs (of ``queues``, default: every queue
        that has any), by next run. A garbled definition is logged and left out."""
        out: builtins.list[ScheduleInfo] = []
        for q in queues or await self._queues():
            scripts = self._app.queue(q).door
            _, ticks = await scripts.schedule_ticks()
            nexts = {n: int(t) for n, t in ticks if valid_tick(t)}
            for name, raw in sorted((await scripts.schedule_defs()).items()):
                try:
                    spec = Spec.from_json(name, q, raw)
                except ValueError as exc:
                    logger.warning("queue %s: %s", q, exc)
                    continue
                out.append(schedule_info(spec, nexts.get(name)))
        far = datetime.max.replace(tzinfo=UTC)
        return sorted(out, key=lambda s: (s.next_run or far, s.queue, s.name))

    async def _queues(self) -> builtins.list[str]:
        app = self._app
        known = {app.default_queue, *(q for q, _ in self.declared)}
        known |= {t.queue for t in app.tasks.values()}
        return sorted(known | set(await schedule_queues(app.redis, app.prefix)))


async def store(scripts: QueueScripts, spec: Spec, signer: Signer | None) -> int:
    """Store a schedule's definition (signed when the App signs); a new or changed one starts
    at its first tick after the server's now. Returns its next tick (ms).

    Raises:
        ConfigurationError: its first tick is beyond the times a schedule can have.
    """
    first = spec.next_after(await scripts.server_ms())
    put = await scripts.schedule_put(spec.name, stored_form(spec, signer), first)
    if put == -1:
        raise ConfigurationError(f"schedule {spec.name!r}: its first tick {first} is too far")
    if put == 0:
        _, ticks = await scripts.schedule_ticks()
        return int(dict(ticks).get(spec.name, first))
    return first


class Scheduler:
    """A worker's scheduler: stores the schedules declared in code for its queues, then fires
    their due ticks (and those added at run time). Every worker runs one; they race safely.

    Args:
        app: the App (its codec signs the jobs' payloads; its tasks give their defaults).
        queues: the queues whose schedules it fires.
    """

    def __init__(self, app: ScheduleOwner, queues: Sequence[str]) -> None:
        self.app = app
        self.queues = list(queues)
        self._specs: dict[tuple[str, str, bytes], Spec] = {}
        self._synced_at: float | None = None
        #: a schedule key was set aside: the declared schedules are stored again at once
        self._resync = False
        #: ticks this scheduler fired (a job enqueued), for tests and logs
        self.fired = 0

    async def run(self, finished: Callable[[], bool]) -> None:
        """Loop until ``finished()``; a failure is logged (once while it repeats) and the loop
        goes on."""
        loop = asyncio.get_running_loop()
        last_error = ""
        while not finished():
            wait = IDLE_POLL
            try:
                if self._synced_at is None or loop.time() - self._synced_at > RESYNC:
                    self._resync = False
                    await self.sync()
                    # a key set aside during the sync: store the declared schedules again
                    self._synced_at = None if self._resync else loop.time()
                for q in self.queues:
                    wait = min(wait, await self.fire_due(q))
                if self._resync:
                    wait = 0.0
            except (ServerUnavailable, ConnectionError, OSError) as exc:
                logger.debug("scheduler: %s", exc)
            except Exception as exc:
                if repr(exc) != last_error:  # a garbled key would repeat it every pass
                    logger.exception("scheduler pass failed; going on")
                last_error = repr(exc)
            else:
                last_error = ""
            await asyncio.sleep(max(wait, 0.001))

    async def sync(self) -> None:
        """Store the schedules declared in code for this scheduler's queues."""
        for (queue, _), spec in self.app.schedules.declared.items():
            if queue in self.queues:
                scripts = self.app.queue(queue).door
                await self._contained(scripts, store(scripts, spec, self.app.codec.signer))
        if not self._resync:  # (a worker's startup stores them too: the loop need not again)
            self._synced_at = asyncio.get_running_loop().time()

    async def _contained(self, scripts: QueueScripts, call: Awaitable[T]) -> T | None:
        """``call``'s answer; None when a schedule key of the wrong type refused it: the key
        is then set aside (listed in ``garbled``) and the declared schedules stored again."""
        try:
            return await call
        except ServerRefused as exc:
            if "WRONGTYPE" not in str(exc):
                raise
        if await scripts.schedule_contain():
            logger.error("%s: a schedule key of the wrong type was set aside", scripts.base)
            self._synced_at, self._resync = None, True
        return None

    async def fire_due(self, queue: str) -> float:
        """Fire the due ticks of one queue's schedules; the seconds until the next one is due
        (0 when a tick was fired or garbage set aside: look again at once). Garbage costs at
        most its own entry: a key of the wrong type is set aside, ticks without a definition
        or that are not a valid time are set aside (at most ``TICKS_PER_PASS`` a pass), a
        definition that is garbled or not made by a key holder is set aside."""
        scripts = self.app.queue(queue).door
        wait = await self._contained(scripts, self._fire_due(scripts, queue))
        return 0.0 if wait is None else wait

    async def _fire_due(self, scripts: QueueScripts, queue: str) -> float:
        now, ticks = await scripts.schedule_ticks(TICKS_PER_PASS)
        bad = [name for name, tick in ticks if not valid_tick(tick)]
        due = [(name, int(tick)) for name, tick in ticks if valid_tick(tick) and tick <= now]
        if not due and not bad:
            return IDLE_POLL if not ticks else min(POLL, (ticks[0][1] - now) / 1000)
        defs = await scripts.schedule_defs([name for name, _ in due] + bad)
        moved = await self._ticks_aside(scripts, [n for n, _ in due if n not in defs] + bad)
        for name in bad:  # a readable definition whose tick was garbage starts afresh
            raw = defs.get(name)
            spec = None if raw is None else await self._spec(scripts, queue, name, raw)
            if raw is not None and spec is not None:
                await scripts.schedule_put(name, raw.decode(), spec.next_after(now))
        for name, tick in due:
            raw = defs.get(name)
            spec = None if raw is None else await self._spec(scripts, queue, name, raw)
            if spec is None:
                moved = True  # removed since the read, or set aside
                continue
            outcome = await self._fire(scripts, spec, tick, now)
            moved = moved or outcome in (TickOutcome.FIRED, TickOutcome.ADVANCED)
        return 0.0 if moved else POLL

    async def _ticks_aside(self, scripts: QueueScripts, names: Sequence[str]) -> bool:
        if not names:
            return False
        why = "schedule ticks without a definition or that are not a valid time"
        n = await scripts.schedule_ticks_aside(names, why)
        if n:
            logger.error("%s: set aside %d %s", scripts.base, n, why)
        return n > 0  # none: a name that did not read back (not UTF-8) stays, and costs a slot

    async def _spec(self, scripts: QueueScripts, queue: str, name: str, raw: bytes) -> Spec | None:
        """The schedule to fire for a stored definition (see ``read_spec``), parsed once; None
        when it is garbled or not made by a key holder: it is then set aside with the reason."""
        key = (queue, name, raw)
        if key not in self._specs:
            if len(self._specs) > 10_000:
                self._specs.clear()
            app = self.app
            try:
                self._specs[key] = read_spec(
                    queue, name, raw, app.codec.signer, app.schedules.declared
                )
            except ValueError as exc:
                logger.error("queue %s: %s; set aside, not firing it", queue, exc)
                await scripts.schedule_set_aside(name, raw, str(exc))
                return None
        return self._specs[key]

    async def _fire(self, scripts: QueueScripts, spec: Spec, tick: int, now: int) -> TickOutcome:
        fire, after = spec.plan(tick, now)
        job, run_at = None, -1
        if fire is not None:
            job = self._job(spec, fire)
            await put_blobs(self.app.codec.claim, spec.queue, (job.id,))
            if spec.jitter_ms:
                run_at = fire + spec.jitter_for(fire)
        _, outcome = await scripts.schedule_tick(spec.name, tick, after, job, run_at)
        if outcome is TickOutcome.FIRED:
            self.fired += 1
            logger.debug("schedule %s: enqueued %s", spec.name, job and job.id)
        elif outcome is TickOutcome.ADVANCED and job is None:
            logger.info(
                "schedule %s: skipped the ticks missed until %s",
                spec.name,
                datetime.fromtimestamp(after / 1000, UTC).isoformat(),
            )
        return outcome

    def _job(self, spec: Spec, tick: int) -> JobRecord:
        job_id = job_id_for(spec.name, tick)
        app = self.app
        task = app.tasks.get(spec.task)
        template = Template(
            spec.task,
            task.max_attempts if task is not None else app.max_attempts,
            priority=task.priority if task is not None else 0,
        )
        payload = app.codec.dump_args(
            spec.queue, job_id, spec.task, spec.args, spec.kwargs, template.options
        )
        return JobRecord(job_id, payload, template)
