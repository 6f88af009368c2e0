"""Job dependencies and parked parents (issue 27, points 1 and 3; docs/workflows.md).

A job enqueued with ``depends_on=`` is stored ``waiting`` with the set of dependencies it
still waits for (``lua/lib/deps.lua``); each dependency keeps the set of its dependents and
tells them, in the script that finishes it, or through its queue's outbox for a dependent on
another queue (another cluster slot) and for dependents past one call's bound (I13). A
running job parks itself the same way (``JobContext.wait_for_children``): its lease is given
back without spending the attempt, and it runs again from the top once its children ended.

Jobs are named across queues by *members*: their queue's key base followed by their id.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal, NoReturn, get_args

from .._model.exceptions import (
    ConfigurationError,
    JobCancelled,
    JobFailed,
    LeaseLost,
    UnknownDependency,
)
from .._model.job import Job, typed_result
from .._model.limits import MAX_JOBS_PER_CALL
from .._store.loader import SCRIPTS, ScriptCall

if TYPE_CHECKING:
    from .._app.app import App
    from .._app.context import JobContext
    from .._app.task import Task
    from .._model.record import JobOptions
    from .queue import Queue

#: what a dependent does when a dependency is dead-lettered or cancelled
DependencyPolicy = Literal["cancel", "run", "fail"]
POLICIES: Final = get_args(DependencyPolicy)

#: a dependency as ``depends_on=`` takes it: a Job handle, or an id on the dependent's queue
DependencyRef = Job[Any] | str


class Parked(BaseException):
    """Raised by ``wait_for_children`` once the job is parked: the run ends there, and the
    worker records nothing (the park script gave the lease back). A BaseException, so that a
    task's ``except Exception`` does not swallow it."""


def dependency_refs(depends_on: Iterable[DependencyRef] | None) -> tuple[tuple[str, str], ...]:
    """``depends_on=`` as JobOptions keeps it (hashable): (queue name or '', id) pairs.

    Raises:
        ConfigurationError: not Jobs or ids, none at all, or more than 1,000.
    """
    if depends_on is None:
        return ()
    refs: list[tuple[str, str]] = []
    for dep in depends_on:
        if isinstance(dep, Job):
            refs.append((dep.queue, dep.id))
        elif isinstance(dep, str) and dep:
            refs.append(("", dep))
        else:
            raise ConfigurationError(f"depends_on= takes Jobs or job ids, not {dep!r}")
    if not refs or len(refs) > MAX_JOBS_PER_CALL:
        raise ConfigurationError(f"depends_on= takes 1 to {MAX_JOBS_PER_CALL} jobs")
    return tuple(dict.fromkeys(refs))


def check_policy(policy: str | None) -> str | None:
    if policy is not None and policy not in POLICIES:
        raise ConfigurationError(f"on_dependency_failure must be one of {POLICIES}")
    return policy


def _call(queue: Queue, *args: Any) -> ScriptCall:
    return (SCRIPTS["deps"], queue._scripts.lanes, [queue._keys.base, *args])


async def _run(queue: Queue, *args: Any) -> Any:
    return (await queue._scripts.run_many([_call(queue, *args)]))[0]


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _members(home: Queue, refs: Sequence[tuple[str, str]]) -> list[str]:
    app = home.app
    return [(app.queue(q) if q else home)._keys.base + job_id for q, job_id in refs]


def _remote(home: Queue, members: Sequence[str]) -> dict[Queue, list[str]]:
    """The dependencies on other queues than ``home``, by queue: their ids."""
    out: dict[Queue, list[str]] = {}
    for m in members:
        job = _job_of(home, m)
        if job._queue is not home:
            out.setdefault(job._queue, []).append(job.id)
    return out


async def _check_remote(remote: Mapping[Queue, list[str]]) -> None:
    """Raise for the first dependency on another queue that is no job (nothing is stored)."""
    for queue, ids in remote.items():
        missing = await _run(queue, "check", *(queue._keys.base + i for i in ids))
        if missing:
            raise UnknownDependency(f"{queue.name}:{_text(missing)}")


async def _watch_remote(home: Queue, job_id: str, remote: Mapping[Queue, list[str]]) -> None:
    """Register the waiting job with its dependencies on other queues; those that ended
    already (or vanished meanwhile: counted as failed) are counted in at once."""
    me = home._keys.base + job_id
    met: list[str] = []
    for queue, ids in remote.items():
        codes = await _run(queue, "watch", me, *ids)
        for dep, code in zip(ids, codes, strict=True):
            if _text(code) != "w":
                met += (job_id, queue._keys.base + dep, "1" if _text(code) == "c" else "0")
    if met:
        await _run(home, "met", *met)


async def enqueue_dependent(
    task: Task[Any, Any], opts: JobOptions, args: Any, kwargs: Any, queue: Queue
) -> Job[Any]:
    """Store a job that waits for ``opts.depends_on`` (see ``Task.options``).

    Raises:
        UnknownDependency: a dependency is no job (never enqueued, or expired); nothing
            was stored.
        ConfigurationError: combined with options a waiting job cannot have.
    """
    if opts.unique is not None or opts.delay is not None or opts.at is not None:
        raise ConfigurationError("depends_on= cannot be combined with unique, delay= or at=")
    app = task.app
    members = _members(queue, opts.depends_on)
    remote = _remote(queue, members)
    await _check_remote(remote)
    record = task._record(opts, args, kwargs, queue.name)
    t = record.template
    await queue._put_blobs((record.id,))
    policy = opts.on_dependency_failure or "cancel"
    res = await _run(
        queue, "add", record.id, t.task, record.payload, t.max_attempts, t.priority,
        t.group, t.options, policy, app.dead_ttl_ms, *members,
    )  # fmt: skip
    if isinstance(res, list):
        raise UnknownDependency(_job_of(queue, _text(res[1])).id)
    if res == 1 and remote:
        await _watch_remote(queue, record.id, remote)
    return Job(queue, record.id, task.result_converter)


async def park(ctx: JobContext, children: Sequence[DependencyRef], policy: str) -> NoReturn:
    """Park the running job ``ctx`` until ``children`` ended (see ``wait_for_children``).

    Raises:
        Parked: parked; the run must end (the worker records nothing).
        UnknownDependency: a child is no job.
        LeaseLost: the job's lease was lost meanwhile.
    """
    home = ctx.app.queue(ctx.queue)
    members = _members(home, dependency_refs(children))
    remote = _remote(home, members)
    await _check_remote(remote)
    res = await _run(home, "park", ctx.id, ctx.token, policy, ctx.app.dead_ttl_ms, *members)
    if isinstance(res, list):
        raise UnknownDependency(_job_of(home, _text(res[1])).id)
    if res != 1:
        raise LeaseLost(ctx.id)
    if remote:
        await _watch_remote(home, ctx.id, remote)
    raise Parked(ctx.id)


async def outcomes(app: App, jobs: Iterable[Job[Any]], only_done: bool) -> dict[str, Any] | None:
    """The results of ``jobs`` by id, each decoded by its task's codec (and verified on a
    signing App); failed and cancelled ones left out. None (with ``only_done``) when one
    has not finished yet."""
    out: dict[str, Any] = {}
    for job in jobs:
        try:
            value = await job._queue._wait_result(job.id, 0)
        except (JobFailed, JobCancelled):
            continue
        except TimeoutError:  # ResultTimeout: not finished
            if only_done:
                return None
            continue
        name = (await job._queue._scripts.job_fields([job.id], ["t"]))[0][0]
        task = app.tasks.get(_text(name)) if name is not None else None
        convert = task.result_converter if task is not None else None
        out[job.id] = typed_result(job.id, convert, value)
    return out


async def dependency_jobs(ctx: JobContext) -> list[Job[Any]]:
    """The dependencies the running job waited for (its record's ``dl``)."""
    home = ctx.app.queue(ctx.queue)
    raw = (await home._scripts.job_fields([ctx.id], ["dl"]))[0][0]
    if raw is None:
        return []
    try:
        members = json.loads(raw)
    except ValueError:
        return []
    if not isinstance(members, list):  # cjson writes an empty array as {}
        return []
    return [_job_of(home, str(m)) for m in members]


def forward_entry(fields: list[bytes]) -> tuple[str, str, list[bytes]] | None:
    """An outbox entry of lib/deps: (kind 'met' or 'more', the queue it is applied on, its
    values), None for a batch outcome; ValueError when it cannot be read."""
    if not fields or fields[0] not in (b"\x00d", b"\x00c"):
        return None
    if fields[0] == b"\x00d" and len(fields) == 4:
        queue, job_id = _split_member(fields[1])
        return "met", queue, [job_id.encode(), fields[2], fields[3]]
    if fields[0] == b"\x00c" and len(fields) == 3:
        queue, job_id = _split_member(fields[1])
        return "more", queue, [job_id.encode(), fields[2]]
    raise ValueError("a dependency entry of the wrong shape")


def _split_member(raw: bytes | str) -> tuple[str, str]:
    """A member's queue name and job id (a prefix has no braces: ``check_prefix``).

    Raises:
        ValueError: it names no job.
    """
    text = raw.decode() if isinstance(raw, bytes) else raw
    if "{" not in text or "}:" not in text:
        raise ValueError("not a job member")
    name, _, job_id = text.split("{", 1)[1].partition("}:")
    return name, job_id


def _job_of(home: Queue, member: str) -> Job[Any]:
    name, job_id = _split_member(member)
    return Job(home.app.queue(name), job_id)


def forward_call(queue: Queue, kind: str, values: list[bytes]) -> ScriptCall:
    """The deps.lua call that applies outbox entries of one kind on ``queue``."""
    return _call(queue, kind, *values)
