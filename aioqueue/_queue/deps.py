"""Job dependencies and parked parents (issue 27, points 1 and 3; docs/workflows.md).

A job enqueued with ``depends_on=`` is stored ``waiting`` with the set of dependencies it
still waits for (``lua/lib/deps.lua``); each dependency keeps the set of its dependents and
tells them, in the script that finishes it, or through its queue's outbox for a dependent on
another queue (another cluster slot) and for dependents past one call's bound (I13). A
running job parks itself the same way (``JobContext.wait_for_children``): its lease is given
back without spending the attempt, and it runs again from the top once its children ended.

Jobs are named across queues by *members*: their queue's key base followed by their id. The
functions here take the App and queue names, and reach each queue through a ``Door`` made
from the App's public parts.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal, NoReturn, Protocol, get_args

from .._model.claimcheck import put_blobs
from .._model.exceptions import (
    BadSignature,
    ConfigurationError,
    JobCancelled,
    JobFailed,
    JobNotFound,
    LeaseLost,
    UnknownDependency,
)
from .._model.job import Job, typed_result
from .._model.limits import MAX_JOBS_PER_CALL
from .depsbox import Door, deps_call, door, split_member

if TYPE_CHECKING:
    from .._model.convert import Convert
    from .._model.record import JobOptions, JobRecord

#: what a dependent does when a dependency is dead-lettered or cancelled
DependencyPolicy = Literal["cancel", "run", "fail"]
POLICIES: Final = get_args(DependencyPolicy)

#: a job named across queues: (its queue's name, '' for the queue at hand; its id)
Ref = tuple[str, str]


class JobLike(Protocol):
    """A ``Job`` handle, as ``depends_on=`` reads one."""

    @property
    def queue(self) -> str: ...

    @property
    def id(self) -> str: ...


#: a dependency as ``depends_on=`` takes it: a Job handle, or an id on the dependent's queue
DependencyRef = JobLike | str


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


async def deps_run(d: Door, *args: Any) -> Any:
    """One deps.lua call on the queue of ``d``."""
    return (await d.scripts.run_many([deps_call(d, *args)]))[0]


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _members(app: Any, home: str, refs: Sequence[tuple[str, str]]) -> list[str]:
    return [door(app, q or home).keys.member(job_id) for q, job_id in refs]


def _remote(app: Any, home: str, members: Sequence[str]) -> dict[str, list[str]]:
    """The dependencies on other queues than ``home``, by queue name: their ids."""
    by_name: dict[str, list[str]] = {}
    for m in members:
        name, job_id = split_member(m)
        if name != home:
            by_name.setdefault(name, []).append(job_id)
    return by_name


async def _check_remote(app: Any, remote: Mapping[str, list[str]]) -> None:
    """Raise for the first dependency on another queue that is no job (nothing is stored)."""
    for name, ids in remote.items():
        d = door(app, name)
        missing = await deps_run(d, "check", *(d.keys.member(i) for i in ids))
        if missing:
            raise UnknownDependency(f"{name}:{_text(missing)}")


async def _watch_remote(app: Any, home: str, job_id: str, remote: Mapping[str, list[str]]) -> None:
    """Register the waiting job with its dependencies on other queues; those that ended
    already (or vanished meanwhile: counted as failed) are counted in at once, the results
    of those that completed kept for the job."""
    me = door(app, home).keys.member(job_id)
    met: list[str | bytes] = []
    for name, ids in remote.items():
        d = door(app, name)
        codes = [_text(c) for c in await deps_run(d, "watch", me, *ids)]
        done = [dep for dep, code in zip(ids, codes, strict=True) if code == "c"]
        kept = dict(zip(done, await d.scripts.job_fields(done, ["t", "r"]), strict=True))
        for dep, code in zip(ids, codes, strict=True):
            if code != "w":
                res = _kept_value(*kept[dep]) if code == "c" else b""
                met += (job_id, d.keys.member(dep), "1" if code == "c" else "0", res)
    if met:
        await deps_run(door(app, home), "met", *met)


def _kept_value(task: bytes | None, result: bytes | None) -> bytes:
    """What a dependent keeps of a completed dependency (as lib/batches ``dep_kept``):
    ``<task>\\0<result as stored>``; empty without a result."""
    return b"" if result is None else (task or b"") + b"\0" + result


async def enqueue_dependent(
    app: Any, queue: str, record: JobRecord, opts: JobOptions, convert: Convert | None
) -> Job[Any]:
    """Store ``record``, a job that waits for ``opts.depends_on`` (see ``Task.options``);
    returns its ``Job``.

    Raises:
        UnknownDependency: a dependency is no job (never enqueued, or expired); nothing
            was stored.
        ConfigurationError: combined with options a waiting job cannot have.
    """
    if opts.unique is not None or opts.delay is not None or opts.at is not None:
        raise ConfigurationError("depends_on= cannot be combined with unique, delay= or at=")
    members = _members(app, queue, opts.depends_on)
    remote = _remote(app, queue, members)
    await _check_remote(app, remote)
    t = record.template
    await put_blobs(app.codec.claim, queue, (record.id,))
    policy = opts.on_dependency_failure or "cancel"
    res = await deps_run(
        door(app, queue), "add", record.id, t.task, record.payload, t.max_attempts, t.priority,
        t.group, t.options, policy, app.dead_ttl_ms, *members,
    )  # fmt: skip
    if isinstance(res, list):
        raise UnknownDependency(split_member(_text(res[1]))[1])
    if res == 1 and remote:
        await _watch_remote(app, queue, record.id, remote)
    return Job(app.queue(queue), record.id, convert)


async def park(
    app: Any, home: str, job_id: str, token: str, children: Sequence[DependencyRef], policy: str
) -> NoReturn:
    """Park the running job ``job_id`` of ``home`` (its lease: ``token``) until ``children``
    ended (see ``JobContext.wait_for_children``).

    Raises:
        Parked: parked; the run must end (the worker records nothing).
        UnknownDependency: a child is no job.
        LeaseLost: the job's lease was lost meanwhile.
    """
    members = _members(app, home, dependency_refs(children))
    remote = _remote(app, home, members)
    await _check_remote(app, remote)
    res = await deps_run(door(app, home), "park", job_id, token, policy, app.dead_ttl_ms, *members)
    if isinstance(res, list):
        raise UnknownDependency(split_member(_text(res[1]))[1])
    if res != 1:
        raise LeaseLost(job_id)
    if remote:
        await _watch_remote(app, home, job_id, remote)
    raise Parked(job_id)


async def outcomes(
    app: Any, home: str, refs: Iterable[Ref], only_done: bool, holder: str | None = None
) -> dict[str, Any] | None:
    """The results of the jobs ``refs`` name, by id, each read by its task's return
    annotation (and verified on a signing App); failed and cancelled ones left out. None
    (with ``only_done``) when one has not finished yet. Given ``holder`` (the dependent, on
    ``home``), the results kept for it (lib/deps ``depres``) are read first: they outlive the
    dependencies' own records."""
    refs = [(name or home, job_id) for name, job_id in refs]
    kept = await _kept(app, home, holder, refs) if holder is not None else {}
    out: dict[str, Any] = {}
    for name, job_id in refs:
        stored, _, raw = kept.get((name, job_id), b"").partition(b"\0")
        task_name: bytes | None = stored
        if not raw:  # nothing kept (or garbage): the record tells
            task_name = (await door(app, name).scripts.job_fields([job_id], ["t"]))[0][0]
        if task_name == b"":  # a workflow's record (what its first nodes wait for)
            continue
        task = app.tasks.get(_text(task_name)) if task_name is not None else None
        convert = task.result_converter if task is not None else None
        if raw:
            try:
                value = app.codec.load_result(raw, queue=name, job_id=job_id)
            except (ValueError, BadSignature):  # garbage, forged: the record is read instead
                pass
            else:
                out[job_id] = typed_result(job_id, convert, value)
                continue
        job: Job[Any] = Job(app.queue(name), job_id, convert)
        try:
            out[job_id] = await job.result(timeout=0)
        except (JobFailed, JobCancelled):
            continue
        except JobNotFound:
            # a dependency of a released dependent ended: gone, and nothing kept for it (it
            # failed, or was cancelled, and its record expired)
            if only_done or holder is None:
                raise
        except TimeoutError:  # ResultTimeout: not finished
            if only_done:
                return None
    return out


async def _kept(
    app: Any, home: str, holder: str, refs: Sequence[Ref]
) -> dict[tuple[str, str], bytes]:
    """The results of ``refs`` kept for job ``holder`` of ``home``, by (queue, id)."""
    d = door(app, home)
    members = [door(app, name).keys.member(job_id) for name, job_id in refs]
    out: dict[tuple[str, str], bytes] = {}
    for i in range(0, len(refs), MAX_JOBS_PER_CALL):
        got = await deps_run(d, "kept", holder, *members[i : i + MAX_JOBS_PER_CALL])
        for ref, raw in zip(refs[i : i + MAX_JOBS_PER_CALL], got, strict=False):
            if isinstance(raw, bytes):
                out[ref] = raw
    return out


#: the job a running task is for, (queue, id): set by the worker's runner for each run, read by
#: ``already_kept``
running: contextvars.ContextVar[Ref | None] = contextvars.ContextVar(
    "aioqueue_running_job", default=None
)


async def already_kept(app: Any, queue: str, job_id: str) -> bool:
    """Whether the running job (a parent run again from the top, or a dependent) keeps the
    result of job ``job_id`` of ``queue``: that job completed for it, and enqueueing it again
    by its id is a no-op even after its own record expired (docs/workflows.md)."""
    holder = running.get()
    if holder is None:
        return False
    return bool(await _kept(app, holder[0], holder[1], [(queue, job_id)]))


async def dependency_jobs(app: Any, home: str, job_id: str) -> list[Ref]:
    """The dependencies job ``job_id`` of queue ``home`` waited for (its record's ``dl``, or
    its lone one, ``d1``)."""
    raw, lone = (await door(app, home).scripts.job_fields([job_id], ["dl", "d1"]))[0]
    if raw is None:
        return [split_member(lone.decode(errors="replace"))] if lone else []
    try:
        members = json.loads(raw)
    except ValueError:
        return []
    if not isinstance(members, list):  # cjson writes an empty array as {}
        return []
    return [split_member(str(m)) for m in members]
