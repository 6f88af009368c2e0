"""DAG workflows (issue 27, point 2; docs/workflows.md): ``app.workflow(name)`` builds a graph
of task calls with edges, checks it before anything is stored (a cycle, a missing step), and
enqueues it gated: a workflow record (``job:<workflow id>``, waiting) is stored first, every
step waits for its dependencies (``_queue/deps.py``) and the steps without any wait for the
record; the last call opens the record, which releases them. A producer that dies midway
leaves a closed graph that never runs (``WorkflowHandle.cancel`` removes it).
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any, Final

import orjson

from .._model.checks import check_name
from .._model.exceptions import ConfigurationError, WorkflowError
from .._model.job import Job
from .._queue.deps import POLICIES, DependencyPolicy
from .._queue.depsbox import door
from .wfstore import GraphStore, StepCall

# App and Call are not imported, even for types: each reaches back to App, which imports this
# module (tests/test_layers.py keeps type-level cycles out)


#: the most steps one workflow may have
MAX_STEPS: Final = 100_000


class WorkflowState(enum.StrEnum):
    """Where a workflow is: ``pending`` (stored but not released: its enqueue did not end),
    ``running``, ``completed`` (every step), ``failed`` (a step was dead-lettered) or
    ``cancelled`` (a step was cancelled, and none failed)."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Workflow:
    """A graph of task calls (``app.workflow(name)``): ``step`` adds one, ``after=`` names the
    steps it waits for; ``enqueue`` stores it. A step runs once every step it waits for
    completed; a step that fails for good or is cancelled follows ``on_failure`` (as
    ``on_dependency_failure``: ``cancel`` its dependents, the default, ``run`` them anyway,
    or ``fail`` them)."""

    __slots__ = ("_steps", "app", "name", "on_failure")

    def __init__(self, app: Any, name: str, on_failure: DependencyPolicy = "cancel") -> None:
        if not name or len(name) > 200:
            raise ConfigurationError("a workflow's name is 1 to 200 characters")
        if on_failure not in POLICIES:
            raise ConfigurationError(f"on_failure must be one of {POLICIES}")
        self.app = app
        self.name = name
        self.on_failure = on_failure
        self._steps: dict[str, tuple[StepCall, tuple[str, ...]]] = {}

    def step(self, name: str, call: StepCall, *, after: Iterable[str] = ()) -> str:
        """Add step ``name`` running ``call`` (``task.call(...)``) once the steps ``after``
        completed; returns ``name`` (to use in another step's ``after``).

        Raises:
            WorkflowError: a step of that name exists.
            ConfigurationError: ``call`` has options a step cannot have (unique, delay, at).
        """
        if name in self._steps:
            raise WorkflowError(f"workflow {self.name!r}: step {name!r} is added twice")
        o = call.opts
        if o.unique is not None or o.delay is not None or o.at is not None:
            raise ConfigurationError("a workflow's steps cannot be unique or delayed")
        waits = tuple(after)
        if len(waits) > 1:
            waits = tuple(dict.fromkeys(waits))  # each once, in the order given
        self._steps[name] = (call, waits)
        return name

    def order(self) -> list[str]:
        """The steps, each after the steps it waits for.

        Raises:
            WorkflowError: no steps, too many, an edge to a missing step, or a cycle.
        """
        return self._sorted()[0]

    def _sorted(self) -> tuple[list[str], dict[str, list[str]]]:
        """``order()``, and each step's dependents (the steps that wait for it, in the
        order they were added)."""
        steps = self._steps
        if not steps or len(steps) > MAX_STEPS:
            raise WorkflowError(f"workflow {self.name!r} has 1 to {MAX_STEPS} steps")
        waits: dict[str, int] = {}
        feeds: dict[str, list[str]] = {}
        for name, (_, after) in steps.items():
            for dep in after:
                fed = feeds.get(dep)
                if fed is None:
                    if dep not in steps:
                        raise WorkflowError(f"step {name!r} waits for {dep!r}, which is no step")
                    fed = feeds[dep] = []
                fed.append(name)
            waits[name] = len(after)
        ready = [name for name, n in waits.items() if n == 0]
        out: list[str] = []
        while ready:
            name = ready.pop()
            out.append(name)
            for nxt in feeds.get(name, ()):
                waits[nxt] -= 1
                if waits[nxt] == 0:
                    ready.append(nxt)
        if len(out) < len(steps):
            stuck = sorted(n for n, w in waits.items() if w > 0)[:5]
            raise WorkflowError(f"workflow {self.name!r} has a cycle through {stuck}")
        return out, feeds

    async def enqueue(self, *, queue: str | None = None) -> WorkflowHandle:
        """Store the workflow (its record on ``queue``, default the App's) and release it.

        Raises:
            WorkflowError: the graph cannot run (nothing was stored).
        """
        order, feeds = self._sorted()
        store = GraphStore(self.app, self.name, self._steps, order, feeds, self.on_failure, queue)
        await store.store()
        await store.open()
        # its sinks are known here: result() waits for them without reading the graph back
        sinks = {n: (store.queues[n], store.ids[n]) for n in store.sinks}
        return WorkflowHandle(self.app, store.wid, store.home, sinks=sinks)


class WorkflowHandle:
    """A stored workflow (from ``Workflow.enqueue``, or ``WorkflowHandle(app, id)`` for one
    whose record is on ``queue``, default the App's)."""

    __slots__ = ("_sinks", "app", "id", "queue")

    def __init__(
        self,
        app: Any,
        workflow_id: str,
        queue: str | None = None,
        *,
        sinks: Mapping[str, tuple[str, str]] | None = None,
    ) -> None:
        """``sinks``: its sinks (step name -> (queue, job id)) when they are known, as
        ``Workflow.enqueue`` knows them; None: ``result`` reads them from the record."""
        self.app = app
        self.id = workflow_id
        self.queue: str = app.queue(queue).name
        self._sinks = None if sinks is None else dict(sinks)

    def __repr__(self) -> str:
        return f"WorkflowHandle(id={self.id!r}, queue={self.queue!r})"

    async def graph(self) -> dict[str, Any]:
        """The stored graph: ``name``, ``steps`` (name -> ``q`` queue, ``id`` job id,
        ``after``), ``sinks``, ``released`` (False while its enqueue has not ended) and
        ``cancelled``.

        Raises:
            WorkflowError: no such workflow (never stored, or its record expired).
        """
        rows = await door(self.app, self.queue).scripts.job_fields([self.id], ["s", "wg"])
        s, wg = rows[0]
        graph: dict[str, Any] = {}
        with contextlib.suppress(ValueError):
            graph = orjson.loads(wg or b"")
        if not _well_formed(graph):
            raise WorkflowError(f"no workflow {self.id!r} on queue {self.queue!r}")
        graph["released"] = s != b"waiting"
        graph["cancelled"] = s == b"cancelled"
        return graph

    def _by_queue(self, graph: dict[str, Any]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for v in graph["steps"].values():
            out.setdefault(v["q"], []).append(v["id"])
        return out

    async def nodes(self) -> dict[str, str | None]:
        """Each step's state (a ``JobState`` value; None: its record is gone, expired or
        purged)."""
        graph = await self.graph()
        states: dict[tuple[str, str], str | None] = {}
        for name, qids in self._by_queue(graph).items():
            rows = await door(self.app, name).scripts.job_fields(qids, ["s"])
            for job_id, (s,) in zip(qids, rows, strict=True):
                states[name, job_id] = s.decode(errors="replace") if s else None
        return {n: states[v["q"], v["id"]] for n, v in graph["steps"].items()}

    async def state(self) -> WorkflowState:
        """The workflow's state, from its steps' (see ``WorkflowState``)."""
        graph = await self.graph()
        if graph["cancelled"]:
            return WorkflowState.CANCELLED
        if not graph["released"]:
            return WorkflowState.PENDING
        states = set((await self.nodes()).values())
        if "failed" in states:
            return WorkflowState.FAILED
        if "cancelled" in states:
            return WorkflowState.CANCELLED
        if states == {"completed"}:
            return WorkflowState.COMPLETED
        return WorkflowState.RUNNING

    async def result(self, timeout: float | timedelta | None = None) -> Any:
        """The result of its sink (the step no other waits for); with several sinks, their
        results by step name. Raises as ``Job.result`` does for the sink (a handle from
        ``Workflow.enqueue`` knows its sinks; one made from an id reads them from the
        workflow's record: ``WorkflowError`` when there is none)."""
        sinks = self._sinks
        if sinks is None:
            graph = await self.graph()
            steps = graph["steps"]
            sinks = {n: (steps[n]["q"], steps[n]["id"]) for n in graph["sinks"]}
        jobs: dict[str, Job[Any]] = {n: Job(self.app.queue(q), i) for n, (q, i) in sinks.items()}
        if len(jobs) == 1:
            return await next(iter(jobs.values())).result(timeout)
        return {n: await job.result(timeout) for n, job in jobs.items()}

    async def cancel(self) -> int:
        """Cancel every step that has not ended (running ones are asked to stop); returns
        how many were cancelled at once."""
        n = 0
        await self.app.queue(self.queue).cancel_jobs([self.id])  # a closed graph: none runs
        for name, qids in self._by_queue(await self.graph()).items():
            n += await self.app.queue(name).cancel_jobs(qids)
        return n


def _well_formed(graph: Any) -> bool:
    """Whether a stored graph (``wg``) has the shape ``Workflow.enqueue`` writes: garbage
    written there reads as no workflow, never as a crash deeper in a reader."""
    if not isinstance(graph, dict) or not isinstance(graph.get("name"), str):
        return False
    steps, sinks = graph.get("steps"), graph.get("sinks")
    if not isinstance(steps, dict) or not isinstance(sinks, list):
        return False
    queues: set[Any] = set()  # each queue name is checked once (a graph may have 100,000 steps)
    for v in steps.values():
        if not isinstance(v, dict) or not isinstance(v.get("after"), list):
            return False
        q = v.get("q")
        if not isinstance(q, str):
            return False
        if q not in queues:
            if not _is_queue_name(q):
                return False
            queues.add(q)
        if not isinstance(v.get("id"), str):
            return False
        if not all(isinstance(a, str) and a in steps for a in v["after"]):
            return False
    return all(isinstance(n, str) and n in steps for n in sinks)


def _is_queue_name(value: Any) -> bool:
    with contextlib.suppress(ConfigurationError):
        return bool(check_name("queue name", value))
    return False


#: the most steps a tree shows (a larger workflow's tree ends with how many were left out)
TREE_MAX: Final = 2000


async def workflow_tree(handle: WorkflowHandle) -> dict[str, Any]:
    """What the CLI and the dashboard show of a workflow: its ``id``, ``name``, ``state``
    and ``rows``, its steps depth first from the first steps, each once (under the first
    step it waits for), as dicts ``step``, ``depth``, ``state``, ``queue``, ``job``, ``after``
    (at most ``TREE_MAX``; ``more`` counts the steps left out)."""
    graph = await handle.graph()
    states = await handle.nodes()
    steps: dict[str, Any] = graph["steps"]
    below: dict[str, list[str]] = {n: [] for n in steps}
    for name, v in steps.items():
        if v["after"]:
            below[v["after"][0]].append(name)
    rows: list[dict[str, Any]] = []
    todo = [(n, 0) for n in reversed([n for n, v in steps.items() if not v["after"]])]
    while todo and len(rows) < TREE_MAX:
        name, depth = todo.pop()
        v = steps[name]
        row = {"step": name, "depth": depth, "state": states.get(name), "queue": v["q"]}
        rows.append({**row, "job": v["id"], "after": v["after"]})
        todo += [(n, depth + 1) for n in reversed(below[name])]
    return {
        "id": handle.id,
        "name": graph["name"],
        "state": (await handle.state()).value,
        "rows": rows,
        "more": len(steps) - len(rows),
    }
