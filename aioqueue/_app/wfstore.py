"""Storing a workflow's graph (``Workflow.enqueue``, ``workflow.py``): the workflow's record
first (``gate``), then its steps in runs per queue (``adds``: at most 1,000 steps and
dependencies a call), their further dependencies (``extend``) and their dependencies on other
queues (``watch``), sent in order with one round trip in flight (``Sender``); then ``open``
releases the steps that wait for nothing but the record.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

import orjson

from .._model.checks import new_job_id
from .._model.claimcheck import put_blobs
from .._model.exceptions import WorkflowError
from .._model.limits import MAX_JOBS_PER_CALL
from .._model.record import JobOptions, Template
from .._queue.deps import deps_run
from .._queue.depsbox import Door, deps_call, door
from .._store.loader import ScriptCall

#: the dependencies of a step that go with it in its ``adds`` call (the rest: ``extend``)
CUT: Final = MAX_JOBS_PER_CALL - 1

#: script calls sent in one round trip while storing a workflow (about 2,000 steps of a fan-out;
#: the server stores them while the next are built)
PIPELINE: Final = 4


class StepCall(Protocol):
    """A task call with its arguments bound (``task.call(...)``: a ``Call``)."""

    @property
    def task(self) -> Any: ...

    @property
    def args(self) -> tuple[Any, ...]: ...

    @property
    def kwargs(self) -> dict[str, Any]: ...

    @property
    def opts(self) -> JobOptions: ...


#: a workflow's steps: name -> (its call, the names of the steps it waits for)
Steps = Mapping[str, tuple[StepCall, tuple[str, ...]]]


class Run:
    """One queue's next ``adds`` call while it is built: its steps' values, how much work they
    are (steps and dependencies: at most MAX_JOBS_PER_CALL), and the templates they share
    (their values, sent once; id(template) -> (number, the template, kept alive meanwhile))."""

    __slots__ = ("numbers", "shared", "steps", "work")

    def __init__(self) -> None:
        self.steps: list[Any] = []
        self.work = 0
        self.shared: list[Any] = []
        self.numbers: dict[int, tuple[int, Template]] = {}

    def number(self, t: Template) -> int:
        """The number of template ``t`` in this call (its values go once)."""
        got = self.numbers.get(id(t))
        if got is None:
            got = self.numbers[id(t)] = (len(self.numbers) + 1, t)
            self.shared += (t.task, t.max_attempts, t.priority, t.group, t.options)
        return got[0]

    def args(self, policy: tuple[str, int]) -> tuple[Any, ...]:
        """The call's values after ``adds`` (deps.lua)."""
        return (*policy, len(self.numbers), *self.shared, *self.steps)


class GraphStore:
    """One enqueue of a workflow: where each step goes (queue, job id), the calls that store
    them, and the opening."""

    def __init__(
        self,
        app: Any,
        name: str,
        steps: Steps,
        order: Sequence[str],
        feeds: Mapping[str, Sequence[str]],
        policy: str,
        queue: str | None,
    ) -> None:
        self.app, self.name, self.steps = app, name, steps
        #: the steps, each after the steps it waits for, and step -> the steps that wait for
        #: it (``Workflow._sorted``)
        self.order, self.feeds = order, feeds
        self.home: str = app.queue(queue).name
        self.wid = f"wf-{uuid.uuid4().hex}"
        self.doors: dict[str, Door] = {self.home: door(app, self.home)}
        #: each step's queue (as the App names it), job id and member
        self.queues, self.ids, self.member = self._place()
        self.told = self._told()
        #: the steps no other waits for
        self.sinks = [n for n in order if n not in feeds]
        hd = self.doors[self.home]
        self.gate = hd.keys.member(self.wid)
        self.calls: list[ScriptCall] = [deps_call(hd, "gate", self.wid, name, self._graph())]
        #: per queue, its next ``adds`` call
        self.runs: dict[str, Run] = {q: Run() for q in self.doors}
        self.policy = (policy, app.dead_ttl_ms)
        self.out = Sender(app, hd, name)
        #: payloads may go to a payload store (claim check): their blobs are put per part
        self.claims = app.codec.claim is not None
        #: every step on the record's queue: no step has a dependency on another queue
        self.one_queue = all(q == self.home for q in self.queues.values())

    def _place(self) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
        """Each step's queue (as the App names it), job id and member (a door for each
        queue met on the way, in ``self.doors``)."""
        # a step's queue as asked -> as the App names it, and that queue's key base
        names: dict[str | None, tuple[str, str]] = {}
        queues: dict[str, str] = {}
        ids: dict[str, str] = {}
        member: dict[str, str] = {}
        steps, doors = self.steps, self.doors
        for step in self.order:
            call = steps[step][0]
            opts = call.opts
            asked = opts.queue or call.task.queue
            placed = names.get(asked)
            if placed is None:
                q = self.app.queue(asked).name
                d = doors.get(q)
                if d is None:
                    d = doors[q] = door(self.app, q)
                placed = names[asked] = (q, d.keys.base)
            q, base = placed
            queues[step] = q
            job_id = ids[step] = opts.job_id or new_job_id()
            member[step] = base + job_id
        return queues, ids, member

    def _told(self) -> dict[str, str]:
        """The steps stored with their lone dependent counted (its record's ``dd``, so that
        storing the dependent reads and writes nothing of them; lib/deps ``dep_wait``'s mask):
        step -> that dependent's name. Only for two steps of one queue whose ids the
        workflow made (an id given with ``job_id=`` may name a job stored before)."""
        told: dict[str, str] = {}
        queues, steps = self.queues, self.steps
        for dep, fed in self.feeds.items():
            if len(fed) != 1 or queues[fed[0]] != queues[dep]:
                continue
            if steps[dep][0].opts.job_id is None and steps[fed[0]][0].opts.job_id is None:
                told[dep] = fed[0]
        return told

    def _mask(self, step: str, deps: Sequence[str]) -> str:
        """Which of ``deps`` (names) were stored with ``step`` as their lone dependent."""
        told = self.told
        if len(deps) == 1:  # a chain's or a fan-out's step
            return "1" if told.get(deps[0]) == step else ""
        flags = ["1" if told.get(d) == step else "0" for d in deps]
        return "".join(flags) if "1" in flags else ""

    def _graph(self) -> bytes:
        """The graph the workflow's record keeps (JSON)."""
        q, ids = self.queues, self.ids
        steps = {
            name: {"q": q[name], "id": ids[name], "after": after}
            for name, (_, after) in self.steps.items()
        }
        graph: bytes = orjson.dumps({"name": self.name, "steps": steps, "sinks": self.sinks})
        return graph

    async def store(self) -> None:
        """Store every step, in ``self.order`` (each after the steps it waits for). Steps go in
        runs per queue; before a step's calls on other queues (its remote dependencies
        count it in there) or its further dependencies, every run so far is flushed, so
        what they name is stored first. The calls go in order, one round trip in flight:
        the server stores some while the next are built."""
        out = self.out
        try:
            for step in self.order:
                self._add(step)
                # (the server idle: what is built goes at once, the first call too)
                if len(self.calls) >= PIPELINE or (self.calls and out.idle()):
                    await out.send(self._take())
            self._flush()
            await out.send(self._take())
            await out.wait()
        finally:
            out.stop()

    def _take(self) -> list[ScriptCall]:
        calls, self.calls = self.calls, []
        return calls

    def _flush(self, *only: str) -> None:
        for rq in only or tuple(self.runs):
            run = self.runs[rq]
            if run.steps:
                self.calls.append(deps_call(self.doors[rq], "adds", *run.args(self.policy)))
                self.runs[rq] = Run()

    def _add(self, step: str) -> None:
        call, after = self.steps[step]
        q = self.queues[step]
        job_id = self.ids[step]
        rec = call.task.record_of(call, q, job_id)
        if self.claims:
            self.out.stored(q, job_id)
        member, n = self.member, len(after)
        # its first dependencies (the record's gate for a first step), in this call
        first: Sequence[str]
        if n == 1:  # a chain's or a fan-out's step
            first = (member[after[0]],)
        elif n == 0:
            first = (self.gate,)
        else:
            first = [member[d] for d in after[:CUT]]
        mask = self._mask(step, after[:CUT])
        k = len(first)
        if self.runs[q].work + 1 + k > MAX_JOBS_PER_CALL:
            self._flush(q)
        run = self.runs[q]
        fed = self.told.get(step)
        dd = member[fed] if fed is not None else ""
        run.steps += (job_id, rec.payload, run.number(rec.template), dd, mask, k, *first)
        run.work += 1 + k
        remote = {} if self.one_queue else self._remote(step, q, after)
        if n > CUT or remote:
            self._flush()
            d = self.doors[q]
            for i in range(CUT, n, MAX_JOBS_PER_CALL):
                part = after[i : i + MAX_JOBS_PER_CALL]
                deps = [member[a] for a in part]
                self.calls.append(deps_call(d, "extend", job_id, self._mask(step, part), *deps))
            for rq, rids in remote.items():
                self._chunked(self.doors[rq], "watch", member[step], rids)

    def _remote(self, step: str, q: str, after: Sequence[str]) -> dict[str, list[str]]:
        """The step's dependencies on other queues, by queue (the record's, for a first step
        on another queue than the record's)."""
        remote: dict[str, list[str]] = {}
        for dep in after:
            if self.queues[dep] != q:
                remote.setdefault(self.queues[dep], []).append(self.ids[dep])
        if not after and self.home != q:
            remote[self.home] = [self.wid]
        return remote

    def _chunked(self, d: Door, op: str, head: str, items: Sequence[str]) -> None:
        for i in range(0, len(items), MAX_JOBS_PER_CALL):
            self.calls.append(deps_call(d, op, head, *items[i : i + MAX_JOBS_PER_CALL]))

    async def open(self) -> None:
        """Release the stored graph, and hand on at once what opening put in the outbox
        (rather than at the workers' next reap): the first steps on other queues (counted
        once: the forwarder's copy is a no-op), and those past what one call tells."""
        hd = self.doors[self.home]
        await deps_run(hd, "open", self.wid, max(self.app.result_ttl_default_ms, 0))
        for step in self.order:
            if not self.steps[step][1] and self.queues[step] != self.home:
                d = self.doors[self.queues[step]]
                await deps_run(d, "met", self.ids[step], self.gate, "1", "")
        while await deps_run(hd, "more", self.wid, "1", ""):
            pass


class Sender:
    """Sends a workflow's script calls in order with one round trip in flight, so that the
    server stores one part while the next is built; the claim-checked payloads of the steps
    of a part are put before it goes."""

    __slots__ = ("app", "blobs", "door", "flying", "name")

    def __init__(self, app: Any, d: Door, name: str) -> None:
        self.app = app
        self.door = d
        self.name = name
        self.blobs: dict[str, list[str]] = {}
        self.flying: asyncio.Task[None] | None = None

    def stored(self, queue: str, job_id: str) -> None:
        """Job ``job_id`` of ``queue`` goes in the next part (its payload's blob first)."""
        self.blobs.setdefault(queue, []).append(job_id)

    async def send(self, calls: list[ScriptCall]) -> None:
        """Send ``calls`` once the part before them is stored (its errors raise here)."""
        await self.wait()
        for queue, job_ids in self.blobs.items():
            await put_blobs(self.app.codec.claim, queue, job_ids)
        self.blobs = {}
        if calls:
            self.flying = asyncio.ensure_future(self._run(calls))
            await asyncio.sleep(0)  # it is written now, and stored while the next is built

    async def _run(self, calls: list[ScriptCall]) -> None:
        for res in await self.door.scripts.run_many(calls):
            if isinstance(res, list) and res and res[0] == -3:
                raise WorkflowError(f"workflow {self.name!r}: a step's dependency vanished")

    def idle(self) -> bool:
        """Whether the part sent last is stored (or none was sent)."""
        return self.flying is None or self.flying.done()

    async def wait(self) -> None:
        """Until the part sent last is stored."""
        flying, self.flying = self.flying, None
        if flying is not None:
            await flying

    def stop(self) -> None:
        """Give up the part in flight (the enqueue failed: the graph stays closed)."""
        if self.flying is not None:
            self.flying.cancel()
