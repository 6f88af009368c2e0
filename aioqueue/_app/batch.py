"""Fan-out / fan-in: batches of sub-jobs with a completion callback, and chains.

A batch lives on a home queue (its callback's queue, else the one named, else the App's
default). Sub-jobs may be on any queues; each one's final outcome (completed, dead-lettered,
cancelled) is counted into the batch exactly once by the script that finishes it, or, for a
sub-job on another queue, handed over through that queue's outbox (lua/lib/batches.lua). When the
batch is sealed and every sub-job has an outcome, the callback job is released exactly once.
"""

from __future__ import annotations

import dataclasses
import uuid
import warnings
from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from .._model.batchinfo import _POLICIES, BatchInfo, BatchItem, BatchState, FailurePolicy
from .._model.checks import check_group, check_int, check_priority, new_job_id, to_ms, to_seconds
from .._model.claimcheck import put_blobs
from .._model.exceptions import BatchCancelled, BatchFailed, BatchNotFound, ConfigurationError
from .._model.job import Job
from .._model.keys import split_queue_member
from .._model.limits import MAX_JOBS_PER_CALL
from .._model.record import JobRecord, Template
from .._queue.queue import cancel_ids
from .._store.loader import ScriptCall
from .owners import BatchOwner

if TYPE_CHECKING:
    from .._queue.owner import OwnedQueue, QueueOwner
    from .._queue.queue import Queue
    from .task import Call


R = TypeVar("R")
R2 = TypeVar("R2")
P2 = ParamSpec("P2")


async def enqueue_chain(calls: list[Call[Any]]) -> Job[Any]:
    """Store a chain's steps (``Chain.enqueue``, through its App) in one round trip: each link
    between two steps is a batch whose callback is the later step; returns the last step's
    handle."""
    app = calls[0].task.app
    homes = [app.queue(c.opts.queue or c.task.queue) for c in calls]
    # link k (between step k and step k + 1) lives on step k + 1's queue
    bids = [uuid.uuid4().hex for _ in calls[1:]]
    ttl_ms = max(app.result_ttl_default_ms, 0)
    # every step's id up front: link k names step k as its sub-job before step k is built
    ids = [c.opts.job_id or new_job_id() for c in calls]
    pipeline: list[ScriptCall] = []
    # the last link first: each step exists only once the link it feeds is open
    for k in reversed(range(len(bids))):
        home = homes[k + 1]
        nxt = (bids[k + 1], homes[k + 2]) if k + 1 < len(bids) else None
        callback = _as_callback(app, calls[k + 1], ids[k + 1], home, bids[k], chain=True, then=nxt)
        scripts = home.door
        pipeline.append(scripts.batch_open_call(bids[k], "fail", ttl_ms, "", None, None, callback))
        if k == 0:
            batch: Batch[Any] = Batch(home, bids[0])
            pipeline += _plan(batch, [calls[0]], {"group": None, "priority": None})[1]
        else:
            # step k, stored by the link before, is this link's one sub-job
            member = ids[k]
            if homes[k] is not home:
                member = homes[k].door.keys.base + member
            pipeline.append(scripts.batch_add_call(bids[k], [member]))
        pipeline.append(scripts.batch_seal_call(bids[k]))
    for q, job_id in zip(homes, ids, strict=True):
        await put_blobs(q.app.codec.claim, q.name, (job_id,))
    await homes[-1].door.run_many(pipeline)
    return Job(homes[-1], ids[-1])


class Batch(Generic[R]):
    """A handle on a batch; ``R`` is its callback's result type. Cheap, no I/O."""

    __slots__ = ("callback", "id", "queue")

    def __init__(self, queue: Queue, batch_id: str, callback: Job[R] | None = None) -> None:
        self.queue = queue
        self.id = batch_id
        self.callback = callback

    def __repr__(self) -> str:
        return f"Batch(id={self.id!r}, queue={self.queue.name!r})"

    async def add(self, *calls: Call[Any]) -> list[Job[Any]]:
        """Add sub-jobs to an open batch, in one round trip (see ``add_many``)."""
        return await self.add_many(calls)

    async def add_many(self, calls: Iterable[Call[Any]]) -> list[Job[Any]]:
        """Add many sub-jobs to an open batch, in one round trip.

        Raises:
            BatchNotFound: no such batch (never created, or its retention ran out).
            ConfigurationError: the batch is sealed or finished.
        """
        info = await self.info()
        if info.state is not BatchState.OPEN or info.sealed:
            raise ConfigurationError(f"batch {self.id!r} is sealed or finished; it takes no jobs")
        opts = await _batch_opts(self)
        jobs, pipeline = _plan(self, list(calls), opts)
        await _put_blobs(self.queue.app, jobs)
        await self.queue.door.run_many(pipeline)
        return jobs

    async def seal(self) -> None:
        """Declare that no more sub-jobs will be added; the batch can then finish.

        Raises:
            BatchNotFound: no such batch (never created, or its retention ran out).
        """
        if not await self.queue.door.batch_seal(self.id):
            raise BatchNotFound(self.id)

    async def cancel(self) -> int:
        """Cancel the batch: sub-jobs that have not started are cancelled, running ones
        finish but the callback never runs. Returns how many sub-jobs were cancelled.

        Raises:
            BatchNotFound: no such batch (never created, or its retention ran out).
        """
        n = await self.queue.door.batch_cancel(self.id)
        if n is None:
            raise BatchNotFound(self.id)
        for queue, ids in (await self._foreign_members()).items():
            n += await cancel_ids(queue, ids)
        return n

    async def info(self) -> BatchInfo:
        """The batch's counts and state.

        Raises:
            BatchNotFound: no such batch (never created, or its retention ran out).
        """
        fields = ("s", "total", "done", "failed", "sealed")
        raw = await self.queue.door.batch_fields(self.id, fields)
        if raw[0] is None:
            raise BatchNotFound(self.id)
        return BatchInfo(
            self.id,
            BatchState(raw[0].decode()),
            int(raw[1] or 0),
            int(raw[2] or 0),
            int(raw[3] or 0),
            raw[4] is not None,
        )

    async def wait(self, timeout: float | timedelta | None = None) -> BatchInfo:
        """Wait until every sub-job has an outcome (and the batch is sealed), without polling.

        Raises:
            BatchFailed: ``on_failure="fail"`` and some sub-jobs failed.
            BatchCancelled: the batch was cancelled.
            ResultTimeout: not finished within ``timeout`` seconds (or timedelta).
            BatchNotFound: no such batch (never created, or its retention ran out).
        """
        q = self.queue

        async def check() -> tuple[bool, BatchInfo | None]:
            state, _, _ = await q.door.watch(self.id, register=True, kind="batch")
            if not state:
                raise BatchNotFound(self.id)
            if state == BatchState.OPEN:
                return False, None
            info = await self.info()
            if state == BatchState.FAILED:
                raise BatchFailed(info)
            if state == BatchState.CANCELLED:
                raise BatchCancelled(f"batch {self.id!r} was cancelled")
            return True, info

        waiter = q.app.result_waiter
        channel = q.door.keys.done_channel
        info = await waiter.wait(
            channel, f"batch:{self.id}", check, to_seconds(timeout), f"batch {self.id!r}"
        )
        assert info is not None
        return info

    async def results(self) -> list[BatchItem]:
        """The outcomes of the finished sub-jobs, in the order they were added.

        Raises:
            BatchNotFound: no such batch (never created, or its retention ran out).
            BadSignature: signing is on and a result is unsigned, tampered, or was not made
                by that member job for this batch.
        """
        q = self.queue
        codec = q.app.codec
        members = await q.door.batch_members(self.id)
        if not members:
            if (await q.door.batch_fields(self.id, ("s",)))[0] is None:
                raise BatchNotFound(self.id)
            return []
        res, err = await q.door.batch_outcomes(self.id, members)
        bound = (q.name, self.id)  # a member's result must have been made for this batch
        out = []
        for m, r, e in zip(members, res, err, strict=True):
            if r is None and e is None:
                continue
            job = _member_job(q, m.decode())
            if r is not None:
                value = codec.load_result(r, queue=job.queue, job_id=job.id, batch=bound)
                out.append(BatchItem(job, True, value, None))
            else:
                assert e is not None
                out.append(BatchItem(job, False, None, codec.load_error(e)))
        return out

    async def _foreign_members(self) -> dict[OwnedQueue, list[str]]:
        q = self.queue
        members = await q.door.batch_members(self.id)
        out: dict[OwnedQueue, list[str]] = {}
        for m in members:
            elsewhere = split_queue_member(q.app.prefix, m.decode())
            if elsewhere is not None and elsewhere[0] != q.name:
                out.setdefault(q.app.queue(elsewhere[0]), []).append(elsewhere[1])
        return out


def _member_job(home: Queue, member: str) -> Job[Any]:
    """A batch member is a job id on the home queue, or ``<key base of its queue><id>``."""
    app = home.app
    elsewhere = split_queue_member(app.prefix, member)
    if elsewhere is not None:
        return Job(app.queue(elsewhere[0]), elsewhere[1])
    return Job(home, member)


async def _put_blobs(app: QueueOwner, jobs: Iterable[Job[Any]]) -> None:
    """Put the claim-checked payloads of sub-jobs before their records (``_claimcheck.py``)."""
    for job in jobs:
        await put_blobs(app.codec.claim, job.queue, (job.id,))


async def _batch_opts(batch: Batch[Any]) -> dict[str, Any]:
    raw = await batch.queue.door.batch_fields(batch.id, ("grp", "pri"))
    return {
        "group": raw[0].decode() if raw[0] else None,
        "priority": int(raw[1]) if raw[1] else None,
    }


def _plan(
    batch: Batch[Any], calls: list[Call[Any]], opts: dict[str, Any]
) -> tuple[list[Job[Any]], list[ScriptCall]]:
    """The script calls that add ``calls`` to ``batch``: members on other queues are counted
    into the batch first, then every sub-job is enqueued on its queue."""
    home = batch.queue
    app = home.app
    by_queue: dict[str, list[JobRecord]] = {}
    members: list[str] = []
    foreign = False
    jobs: list[Job[Any]] = []
    templates: dict[tuple[Template, bool], Template] = {}
    for call in calls:
        o = call.opts
        if o.job_id is not None:
            raise ConfigurationError(
                "sub-jobs of a batch get their own ids; job_id= cannot be used with a batch"
            )
        queue = app.queue(o.queue or call.task.queue)
        if opts["group"] is not None and queue is not home:
            raise ConfigurationError(
                "a batch with a concurrency limit keeps its sub-jobs on its own queue "
                f"({home.name!r}); {call.task.name!r} goes to {queue.name!r}"
            )
        # sub-jobs of one task and options share one template: the enqueue calls send it
        # once per run of them
        t = call.task.builder.template(o)
        key = (t, queue is home)
        template = templates.get(key)
        if template is None:
            group = opts["group"] if o.group is None and opts["group"] is not None else t.group
            prio = opts["priority"]
            priority = prio if o.priority is None and prio is not None else t.priority
            member = app.codec.member_options(home.name, batch.id)
            options = t.options
            if member:  # signing: the sub-job's batch is signed with its payload
                options = app.codec.dump_options({**app.codec.load_options(t.options), **member})
            template = templates[key] = dataclasses.replace(
                t,
                group=group,
                priority=priority,
                batch=batch.id,
                batch_queue="" if queue is home else home.name,
                options=options,
            )
        rec = call.task.builder.record(o, call.args, call.kwargs, queue.name, template)
        if queue is not home:
            members.append(queue.door.keys.base + rec.id)
            foreign = True
        else:
            members.append(rec.id)
        by_queue.setdefault(queue.name, []).append(rec)
        jobs.append(Job(queue, rec.id))
    pipeline: list[ScriptCall] = []
    if foreign:
        # sub-jobs on other queues must be counted into the batch before they exist; all the
        # members go in here, in call order, so results() keeps that order (enqueueing a home
        # sub-job then finds it counted already)
        for i in range(0, len(members), MAX_JOBS_PER_CALL):
            chunk = members[i : i + MAX_JOBS_PER_CALL]
            pipeline.append(home.door.batch_add_call(batch.id, chunk))
    for name, records in by_queue.items():
        pipeline += app.queue(name).door.enqueue_calls(records)
    return jobs, pipeline


async def open_batch(
    app: BatchOwner,
    calls: Iterable[Call[Any]] | None,
    *,
    on_complete: Call[R] | None,
    on_failure: FailurePolicy,
    concurrency: int | None = None,
    priority: int | None = None,
    group: str | None = None,
    queue: str | None = None,
    retention: float | timedelta | None = None,
) -> Batch[R]:
    if on_failure not in _POLICIES:
        raise ConfigurationError(f"on_failure must be one of {_POLICIES}, not {on_failure!r}")
    if on_failure == "ignore":
        # user code -> App.batch -> here
        warnings.warn(
            'on_failure="ignore" is deprecated: it does exactly what "continue" does; '
            'pass "continue"',
            DeprecationWarning,
            stacklevel=3,
        )
        on_failure = "continue"
    if concurrency is not None:
        check_int(concurrency, 1, "concurrency")
        if group is not None:
            raise ConfigurationError(
                "a batch with a concurrency limit is its own group: drop group="
            )
    if priority is not None:
        check_priority(priority)
    if group is not None:
        check_group(group)
    home_name = (
        queue
        if queue is not None
        else (on_complete.opts.queue or on_complete.task.queue if on_complete else None)
    )
    home = app.queue(home_name)
    bid = uuid.uuid4().hex
    own_group = f"batch:{bid}" if concurrency is not None else group
    ttl_s = to_seconds(retention, "retention")
    ttl_ms = to_ms(ttl_s, "retention") if ttl_s is not None else max(app.result_ttl_default_ms, 0)
    callback_record: JobRecord | None = None
    callback: Job[R] | None = None
    if on_complete is not None:
        callback_record = rec = _as_callback(app, on_complete, None, home, bid)
        callback = Job(home, rec.id)
    batch: Batch[R] = Batch(home, bid, callback)
    scripts = home.door
    pipeline = [
        scripts.batch_open_call(
            bid, on_failure, ttl_ms, own_group or "", concurrency, priority, callback_record
        )
    ]
    if callback_record is not None:
        await put_blobs(app.codec.claim, home.name, (callback_record.id,))
    if calls is not None:
        opts = {"group": own_group, "priority": priority}
        members, more = _plan(batch, list(calls), opts)
        await _put_blobs(app, members)
        pipeline += more
        pipeline.append(scripts.batch_seal_call(bid))
    await scripts.run_many(pipeline)
    return batch


def _as_callback(
    app: BatchOwner,
    call: Call[Any],
    job_id: str | None,
    home: Queue,
    bid: str,
    *,
    chain: bool = False,
    then: tuple[str, Queue] | None = None,
) -> JobRecord:
    """The record of ``call`` as the callback of batch ``bid`` on ``home`` (with id ``job_id``,
    or a new one): its options name the batch (and, in a chain, say it takes the batch's one
    result as its first argument); ``then`` is the next link of a chain (its batch id and
    queue), which counts this callback as its sub-job. The record is built once its options
    are final: with signing on, they are signed together with its payload."""
    task, opts = call.task, call.opts
    t = task.builder.template(opts)
    options = {**app.codec.load_options(t.options), "batch": bid, "bq": home.name}
    if chain:
        options["chain"] = 1
    template = t
    if then is not None:
        nxt_bid, nxt_home = then
        batch_queue = "" if nxt_home is home else nxt_home.name
        options.update(app.codec.member_options(nxt_home.name, nxt_bid))
        template = dataclasses.replace(template, batch=nxt_bid, batch_queue=batch_queue)
    template = dataclasses.replace(template, options=app.codec.dump_options(options))
    return task.builder.record(opts, call.args, call.kwargs, home.name, template, job_id)
