"""The operator's side of a ``Queue`` (``QueueAdmin``, a face it holds): listings, job detail,
throughput and groups (read in ``_inspect``), and the bulk actions on dead letters, scheduled and
queued jobs, done in bounded chunks of one atomic script each (``requeue.lua``, ``promote.lua``,
``purge.lua``, ``cancel.lua``). Nothing here holds state.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from .._model.checks import at_to_ms, check_group, check_int, check_job_id, check_priority, to_ms
from .._model.exceptions import ConfigurationError, JobNotChangeable, JobNotFound
from .._model.job import JobState, JobWhy
from .._model.limits import MAX_JOBS_PER_CALL
from .._store.scripts import QueueScripts
from .core import QueueCore
from .inspect import (
    GroupInfo,
    JobDetail,
    JobPage,
    Throughput,
    detail,
    groups,
    summaries,
    throughput,
)
from .lister import Lister, check_state
from .payloads import drop_orphans
from .search import SEARCH_BUDGET, SearchPage, search
from .trends import Trends, trends

if TYPE_CHECKING:
    pass


# --------------------------------------------------------------------- the Queue's admin side
class QueueAdmin:
    """The operator's methods of a ``Queue`` (which holds one and offers its methods):
    listings, detail, throughput, groups, and the bulk actions. Each action runs one atomic
    script per chunk of at most 1,000 jobs and is safe while workers run; it returns how many
    jobs it changed."""

    __slots__ = ("core",)

    def __init__(self, core: QueueCore) -> None:
        self.core = core

    def _lister(
        self,
        state: str | JobState,
        task: str | None,
        group: str | None,
        newest_first: bool = False,
        since: datetime | float | None = None,
    ) -> Lister:
        st = check_state(state)
        since_ms = None
        if since is not None:
            if st is not JobState.FAILED:
                raise ConfigurationError("since= applies to dead letters (state 'failed') only")
            since_ms = at_to_ms(since)
        return Lister(
            self.core.door,
            st,
            task=task,
            group=None if group is None else check_group(group),
            newest_first=newest_first,
            since_ms=since_ms,
        )

    async def jobs(
        self,
        state: str | JobState,
        *,
        task: str | None = None,
        group: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        newest_first: bool = False,
    ) -> JobPage:
        """A page of the jobs in ``state`` (scheduled, queued, active, failed, completed or
        cancelled).

        Args:
            state: the state to list. Completed and cancelled jobs are listed from an index
                that keeps the most recent 100,000 of each whose records are still kept (a
                completed job whose result is not kept is not listed; look others up by id
                with ``job_detail``).
            task: only jobs of this task name.
            group: only jobs of this fairness group.
            limit: jobs per page at most (1-1,000); a filtered page may hold fewer while its
                cursor goes on.
            cursor: the previous page's ``cursor``; ``None`` starts a listing.
            newest_first: scheduled by due time, active by lease deadline, failed, completed
                and cancelled by the time they ended, queued lane by lane in the order they
                are served; this reverses it.

        Returns:
            The page. A job that stays in the state is listed exactly once per listing, one
            that enters or leaves it meanwhile at most once.
        """
        check_int(limit, 1, "limit")
        lister = self._lister(state, task, group, newest_first)
        ids, nxt = await lister.page(min(limit, MAX_JOBS_PER_CALL), cursor)
        items = await summaries(
            self.core.door, self.core.app.codec, self.core.name, lister.state, ids
        )
        return JobPage(tuple(items), nxt)

    async def search(
        self,
        state: str | JobState,
        *,
        task: str | None = None,
        group: str | None = None,
        error: str | None = None,
        text: str | None = None,
        cursor: str | None = None,
        newest_first: bool = False,
        limit: int = 50,
        budget: int = SEARCH_BUDGET,
    ) -> SearchPage:
        """The jobs in ``state`` of this task and group whose error (type and message) and
        arguments (as JSON text) contain ``error`` and ``text`` (case-blind; at most 200
        characters each), with bounded work: it stops once ``limit`` jobs matched (at the end
        of a chunk of records read, so a page may hold up to 19 more) or ``budget`` records
        were read (1,000 by default), and its ``cursor`` goes on from there. Arguments that cannot
        be decoded here (encrypted without the key, corrupt) match no ``text``."""
        check_int(limit, 1, "limit")
        check_int(budget, 1, "budget")
        lister = self._lister(state, task, group, newest_first)
        return await search(
            lister,
            self.core.door,
            self.core.app.codec,
            self.core.name,
            error=error,
            text=text,
            cursor=cursor,
            limit=limit,
            budget=min(budget, 10 * SEARCH_BUDGET),
        )

    async def trends(self, span: str = "hour") -> Trends:
        """Jobs completed and dead-lettered, per task too, and the highest backlog and wait
        the workers sampled, per minute over the last ``"hour"`` or per hour over the last
        ``"day"`` or ``"week"`` (kept in Redis in small per-bucket hashes that expire)."""
        return await trends(self.core.door, span)

    async def backlog(self) -> dict[str, int]:
        """The queue's backlog per task: its jobs queued (in any lane, or waiting aside on a
        limiter) or scheduled (delayed, retries' backoff, durable waits), counted exactly by
        the scripts that move them (the 100 first tasks by name, the rest under ``"*"``); the
        total, ``sum(...values())``, is what ``max_queued`` bounds. Not counted: jobs
        waiting for dependencies. See docs/flow-control.md#backpressure."""
        return await self.core.door.backlog()

    async def finished_counts(self) -> dict[str, int]:
        """The jobs that ``jobs("completed")`` and ``jobs("cancelled")`` list: the sizes of
        their indexes (the most recent 100,000 of each whose records are kept)."""
        done, cancelled = await self.core.door.finished_counts()
        return {"completed": done, "cancelled": cancelled}

    async def job_detail(self, job_id: str) -> JobDetail:
        """Everything stored about a job, in any state. Raises JobNotFound without a record."""
        return await detail(self.core.door, self.core.app.codec, await self.core.job_info(job_id))

    async def why(self, job_id: str) -> JobWhy:
        """Why the job is (not) running, from the server's state in one atomic read: every
        block a claim would meet (pause, group limit or rate, queue rate, no live worker, no
        worker declaring its task) and its place in its lane; or that it is scheduled,
        waiting, running (on whom, until when), finished or not found. See ``JobWhy``."""
        raw = await self.core.door.why(check_job_id(job_id))
        return JobWhy.read(self.core.name, job_id, raw)

    async def change_job(
        self,
        job_id: str,
        priority: int | None = None,
        delay: float | timedelta | None = None,
        at: datetime | float | None = None,
    ) -> JobState:
        """Change a job that has not started: see ``Job.change``."""
        if priority is None and delay is None and at is None:
            raise ConfigurationError("give priority=, delay= or at= to change")
        if delay is not None and at is not None:
            raise ConfigurationError("give delay= or at=, not both")
        pr = None if priority is None else check_priority(priority)
        delay_ms = -1 if delay is None else to_ms(delay, "delay")
        at_ms = -1 if at is None else at_to_ms(at)
        code, state = await self.core.door.change(job_id, pr, delay_ms, at_ms)
        if code == -1:
            raise JobNotFound(job_id)
        if code == 0:
            raise JobNotChangeable(job_id, state)
        return JobState(state)

    async def throughput(self, minutes: int = 60) -> Throughput:
        """Jobs completed and dead-lettered per minute over the last ``minutes`` (1-120)."""
        check_int(minutes, 1, "minutes")
        return await throughput(self.core.door, min(minutes, 120))

    async def wait_time(self) -> float | None:
        """Seconds the longest-waiting runnable job has waited since it became due (its enqueue,
        or its due time if it was delayed), by the server's clock: the autoscaling signal
        beside the backlog (``counts()["queued"]``). Read from the heads of the queue's lanes
        (the first 100 jobs in serving order), so the work is bounded; None when nothing is
        queued."""
        page = await self.jobs("queued", limit=100)
        if not page.items:
            return None
        now_ms = await self.core.door.server_ms()
        since = min(max(j.created_ms, j.due_ms or 0) for j in page.items)
        return max(now_ms - since, 0) / 1000

    async def is_paused(self) -> bool:
        """Whether the queue is paused (``pause()`` without a group)."""
        return b"paused" in await self.core.door.queue_settings()

    async def groups(self, limit: int = 100) -> list[GroupInfo]:
        """The queue's groups with queued or active jobs or settings of their own, by name."""
        check_int(limit, 1, "limit")
        return await groups(self.core.door, limit)

    async def requeue(
        self,
        job_ids: Sequence[str] | None = None,
        *,
        task: str | None = None,
        group: str | None = None,
        since: datetime | float | None = None,
        all: bool = False,
    ) -> int:
        """Put dead letters back in the queue with their attempts reset: these ids, or every
        dead letter matching the filters (task, group, died at or after ``since``: an aware
        datetime or POSIX seconds), or with ``all=True`` every one. Only those dead when the
        call starts are requeued (a job that dies again meanwhile stays dead). Returns how many."""
        if job_ids is not None:
            return await _chunked(self.core.door.requeue, job_ids)
        _need_selector(all, task, group, since)
        lister = self._lister(JobState.FAILED, task, group, since=since)
        lister.until_ms = await self.core.door.server_ms()
        total = 0
        async for ids in lister.pages():
            total += (await self.core.door.requeue(ids))[0]
        return total

    async def promote(
        self,
        job_ids: Sequence[str] | None = None,
        *,
        task: str | None = None,
        group: str | None = None,
        all: bool = False,
    ) -> int:
        """Make scheduled jobs runnable now: these ids, or every one matching the filters, or
        ``all=True``. Returns how many."""
        if job_ids is not None:
            return await _chunked(self.core.door.promote, job_ids)
        _need_selector(all, task, group, None)
        total = 0
        async for ids in self._lister(JobState.SCHEDULED, task, group).pages():
            total += (await self.core.door.promote(ids))[0]
        return total

    async def purge(
        self,
        state: str | JobState | None = None,
        job_ids: Sequence[str] | None = None,
        *,
        task: str | None = None,
        group: str | None = None,
        since: datetime | float | None = None,
    ) -> int:
        """Delete jobs that are not running, records and all: these ids (in any state but
        active and waiting), or every job in ``state`` (queued, scheduled or failed) that
        matches the filters (queued, scheduled, failed, or completed and cancelled: those
        their index lists). Purged members of a batch count as cancelled in it. Returns how
        many were deleted."""
        scripts = self.core.door
        if job_ids is not None:
            states: tuple[str, ...] = ("queued", "scheduled", "failed", "completed", "cancelled")
            if state is not None:
                states = (JobState(state).value,)
            return await _chunked(lambda ids: self._purge_ids(ids, states), job_ids)
        if state is None:
            raise ConfigurationError(
                "purge needs job ids or a state (queued, scheduled, failed, completed, cancelled)"
            )
        st = check_state(state)
        if st is JobState.ACTIVE:
            raise ConfigurationError("running jobs are not purged: cancel them instead")
        if task is None and since is None:
            if st is JobState.QUEUED:
                if group is not None:
                    return await _drain(scripts, "lane", check_group(group))
                total = await _drain(scripts, "prio") + await _drain(scripts, "ready")
                for g in sorted(await scripts.group_counts()):
                    total += await _drain(scripts, "lane", g)
                return total
            if group is None:
                source = {JobState.SCHEDULED: "scheduled", JobState.FAILED: "dead"}
                return await _drain(scripts, source.get(st, st.value))
        total = 0
        async for ids in self._lister(st, task, group, since=since).pages():
            total += (await self._purge_ids(ids, (st.value,)))[0]
        return total

    async def _purge_ids(self, ids: Sequence[str], states: Sequence[str]) -> tuple[int, int]:
        """purge.lua on these ids, then the payload-store blobs of those deleted."""
        res = await self.core.door.purge_ids(ids, states)
        claim = self.core.app.codec.claim
        if claim is not None:
            await drop_orphans(claim, self.core.door.reads, self.core.name, ids)
        return res

    async def purge_queue(self) -> dict[str, int]:
        """Delete every job of the queue that is not running (queued, scheduled, dead
        letters, and the completed and cancelled ones their indexes list); running jobs
        finish. Returns how many of each were deleted."""
        return {
            st.value: await self.purge(st)
            for st in (
                JobState.QUEUED,
                JobState.SCHEDULED,
                JobState.FAILED,
                JobState.COMPLETED,
                JobState.CANCELLED,
            )
        }

    async def cancel(
        self,
        job_ids: Sequence[str] | None = None,
        *,
        state: str | JobState | None = None,
        task: str | None = None,
        group: str | None = None,
        all: bool = False,
    ) -> int:
        """Cancel these jobs, or every queued, scheduled and active job (or those in
        ``state``) matching the filters (``all=True``: every one). Queued and scheduled ones
        are cancelled at once; running ones are stopped by their worker. Returns how many
        were cancelled or asked to stop."""
        dead_ttl = self.core.app.dead_ttl_ms
        if job_ids is not None:
            now, flagged = await _cancel_chunks(self.core.door, job_ids, dead_ttl)
            return now + flagged
        _need_selector(all, task, group, None)
        states = (
            [check_state(state)]
            if state is not None
            else [JobState.QUEUED, JobState.SCHEDULED, JobState.ACTIVE]
        )
        total = 0
        for st in states:
            async for ids in self._lister(st, task, group).pages():
                now, flagged = await self.core.door.cancel(ids, dead_ttl)
                total += now + flagged
        return total


def _need_selector(
    all: bool, task: str | None, group: str | None, since: datetime | float | None
) -> None:
    if not all and task is None and group is None and since is None:
        raise ConfigurationError("give job ids, a filter (task, group, since) or all=True")


async def _chunked(call: Any, job_ids: Sequence[str]) -> int:
    ids = [check_job_id(i) for i in job_ids]
    total = 0
    for i in range(0, len(ids), MAX_JOBS_PER_CALL):
        total += (await call(ids[i : i + MAX_JOBS_PER_CALL]))[0]
    return int(total)


async def _cancel_chunks(
    scripts: QueueScripts, job_ids: Sequence[str], dead_ttl: int
) -> tuple[int, int]:
    ids = [check_job_id(i) for i in job_ids]
    now = flagged = 0
    for i in range(0, len(ids), MAX_JOBS_PER_CALL):
        a, b = await scripts.cancel(ids[i : i + MAX_JOBS_PER_CALL], dead_ttl)
        now, flagged = now + a, flagged + b
    return now, flagged


async def _drain(scripts: QueueScripts, source: str, group: str = "") -> int:
    """Purge a structure from its head, a chunk per call, until a call purges nothing."""
    total = 0
    # an index of finished jobs drops the stale entries it skips, so a chunk of them goes on
    indexed = source in ("completed", "cancelled")
    while True:
        done, skipped = await scripts.purge_head(source, MAX_JOBS_PER_CALL, group)
        total += done
        if done == 0 and not (indexed and skipped):
            return total
