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
from typing import TYPE_CHECKING, Any, Final, Literal, NoReturn, Protocol, get_args

from .._model.exceptions import (
    ConfigurationError,
    JobCancelled,
    JobFailed,
    LeaseLost,
    UnknownDependency,
)
from .._model.limits import MAX_JOBS_PER_CALL
from .._store.loader import SCRIPTS, ScriptCall
from .depsbox import split_member

if TYPE_CHECKING:
    from .._model.convert import Convert
    from .._model.keys import QueueKeys
    from .._model.record import JobOptions, JobRecord
    from .._store.scripts import QueueScripts

#: what a dependent does when a dependency is dead-lettered or cancelled
DependencyPolicy = Literal["cancel", "run", "fail"]
POLICIES: Final = get_args(DependencyPolicy)

#: a job named across queues: (its queue's name, '' for the queue at hand; its id)
Ref = tuple[str, str]


class JobLike(Protocol):
    """A ``Job`` handle, as this module reads one (``Job`` is not imported: it reaches
    ``Queue`` and ``App``, which import this module; tests/test_layers.py)."""

    @property
    def queue(self) -> str: ...

    @property
    def id(self) -> str: ...


#: a dependency as ``depends_on=`` takes it: a Job handle, or an id on the dependent's queue
DependencyRef = JobLike | str


class Queue(Protocol):
    """What this module uses of a ``Queue`` (not imported, even for types: ``Queue`` reaches
    ``App``, which imports this module; tests/test_layers.py keeps type-level cycles out)."""

    @property
    def name(self) -> str: ...

    @property
    def _scripts(self) -> QueueScripts: ...

    @property
    def _keys(self) -> QueueKeys: ...

    @property
    def app(self) -> Any: ...

    def job(self, job_id: str) -> Any: ...

    async def _put_blobs(self, ids: Iterable[str]) -> None: ...


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
        if isinstance(dep, str):
            if dep:
                refs.append(("", dep))
                continue
        elif isinstance(getattr(dep, "queue", None), str) and isinstance(
            getattr(dep, "id", None), str
        ):
            refs.append((dep.queue, dep.id))
            continue
        raise ConfigurationError(f"depends_on= takes Jobs or job ids, not {dep!r}")
    if not refs or len(refs) > MAX_JOBS_PER_CALL:
        raise ConfigurationError(f"depends_on= takes 1 to {MAX_JOBS_PER_CALL} jobs")
    return tuple(dict.fromkeys(refs))


def check_policy(policy: str | None) -> str | None:
    if policy is not None and policy not in POLICIES:
        raise ConfigurationError(f"on_dependency_failure must be one of {POLICIES}")
    return policy


def deps_call(queue: Queue, *args: Any) -> ScriptCall:
    return (SCRIPTS["deps"], queue._scripts.lanes, [queue._keys.base, *args])


async def deps_run(queue: Queue, *args: Any) -> Any:
    return (await queue._scripts.run_many([deps_call(queue, *args)]))[0]


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _members(home: Queue, refs: Sequence[tuple[str, str]]) -> list[str]:
    app = home.app
    return [(app.queue(q) if q else home)._keys.member(job_id) for q, job_id in refs]


def _remote(home: Queue, members: Sequence[str]) -> dict[Queue, list[str]]:
    """The dependencies on other queues than ``home``, by queue: their ids."""
    by_name: dict[str, list[str]] = {}
    for m in members:
        name, job_id = split_member(m)
        if name != home.name:
            by_name.setdefault(name, []).append(job_id)
    return {home.app.queue(name): ids for name, ids in by_name.items()}


async def _check_remote(remote: Mapping[Queue, list[str]]) -> None:
    """Raise for the first dependency on another queue that is no job (nothing is stored)."""
    for queue, ids in remote.items():
        missing = await deps_run(queue, "check", *(queue._keys.member(i) for i in ids))
        if missing:
            raise UnknownDependency(f"{queue.name}:{_text(missing)}")


async def _watch_remote(home: Queue, job_id: str, remote: Mapping[Queue, list[str]]) -> None:
    """Register the waiting job with its dependencies on other queues; those that ended
    already (or vanished meanwhile: counted as failed) are counted in at once."""
    me = home._keys.member(job_id)
    met: list[str] = []
    for queue, ids in remote.items():
        codes = await deps_run(queue, "watch", me, *ids)
        for dep, code in zip(ids, codes, strict=True):
            if _text(code) != "w":
                met += (job_id, queue._keys.member(dep), "1" if _text(code) == "c" else "0")
    if met:
        await deps_run(home, "met", *met)


async def enqueue_dependent(
    queue: Queue, record: JobRecord, opts: JobOptions, convert: Convert | None
) -> Any:
    """Store ``record``, a job that waits for ``opts.depends_on`` (see ``Task.options``);
    returns its ``Job``.

    Raises:
        UnknownDependency: a dependency is no job (never enqueued, or expired); nothing
            was stored.
        ConfigurationError: combined with options a waiting job cannot have.
    """
    if opts.unique is not None or opts.delay is not None or opts.at is not None:
        raise ConfigurationError("depends_on= cannot be combined with unique, delay= or at=")
    app = queue.app
    members = _members(queue, opts.depends_on)
    remote = _remote(queue, members)
    await _check_remote(remote)
    t = record.template
    await queue._put_blobs((record.id,))
    policy = opts.on_dependency_failure or "cancel"
    res = await deps_run(
        queue, "add", record.id, t.task, record.payload, t.max_attempts, t.priority,
        t.group, t.options, policy, app.dead_ttl_ms, *members,
    )  # fmt: skip
    if isinstance(res, list):
        raise UnknownDependency(split_member(_text(res[1]))[1])
    if res == 1 and remote:
        await _watch_remote(queue, record.id, remote)
    job = queue.job(record.id)
    job._convert = convert
    return job


async def park(
    home: Queue, job_id: str, token: str, children: Sequence[DependencyRef], policy: str
) -> NoReturn:
    """Park the running job ``job_id`` of ``home`` (its lease: ``token``) until ``children``
    ended (see ``JobContext.wait_for_children``).

    Raises:
        Parked: parked; the run must end (the worker records nothing).
        UnknownDependency: a child is no job.
        LeaseLost: the job's lease was lost meanwhile.
    """
    members = _members(home, dependency_refs(children))
    remote = _remote(home, members)
    await _check_remote(remote)
    res = await deps_run(home, "park", job_id, token, policy, home.app.dead_ttl_ms, *members)
    if isinstance(res, list):
        raise UnknownDependency(split_member(_text(res[1]))[1])
    if res != 1:
        raise LeaseLost(job_id)
    if remote:
        await _watch_remote(home, job_id, remote)
    raise Parked(job_id)


async def outcomes(home: Queue, refs: Iterable[Ref], only_done: bool) -> dict[str, Any] | None:
    """The results of the jobs ``refs`` name, by id, each read by its task's return
    annotation (and verified on a signing App); failed and cancelled ones left out. None
    (with ``only_done``) when one has not finished yet."""
    out: dict[str, Any] = {}
    for name, job_id in refs:
        queue: Queue = home.app.queue(name) if name else home
        task_name = (await queue._scripts.job_fields([job_id], ["t"]))[0][0]
        if task_name == b"":  # a workflow's record (what its first nodes wait for)
            continue
        task = home.app.tasks.get(_text(task_name)) if task_name is not None else None
        job = queue.job(job_id)
        job._convert = task.result_converter if task is not None else None
        try:
            out[job_id] = await job.result(timeout=0)
        except (JobFailed, JobCancelled):
            continue
        except TimeoutError:  # ResultTimeout: not finished
            if only_done:
                return None
    return out


async def dependency_jobs(home: Queue, job_id: str) -> list[Ref]:
    """The dependencies job ``job_id`` of ``home`` waited for (its record's ``dl``)."""
    raw = (await home._scripts.job_fields([job_id], ["dl"]))[0][0]
    if raw is None:
        return []
    try:
        members = json.loads(raw)
    except ValueError:
        return []
    if not isinstance(members, list):  # cjson writes an empty array as {}
        return []
    return [split_member(str(m)) for m in members]
