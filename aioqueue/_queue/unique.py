"""Unique jobs: at most one job per key holds the key's lock (docs/unique.md).

The lock is ``<prefix>:{<queue>}:unique:<key>``, a STRING naming the job that holds it, with a
TTL (``unique_for``). ``enqueue.lua`` takes it or names its holder, atomically; on a conflict
the new call returns the holder (``on_conflict="existing"``), or ``replace.lua`` gives the
holder the new call's arguments, and to debounce its delay, while the holder still waits.
The scripts that finish, cancel or dead-letter a job free its lock (scope ``running``), or the
claim that starts it (scope ``queued``); scope ``ttl`` only ends with the TTL.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from .._model.checks import check_text, to_ms
from .._model.claimcheck import put_blobs
from .._model.exceptions import ConfigurationError
from .._model.job import Job
from .._model.record import JobRecord, UniqueOptions
from .._store.loader import text_of
from .._store.outcomes import ReplaceOutcome

if TYPE_CHECKING:
    from .owner import OwnedQueue

UniqueScope = Literal["queued", "running", "ttl"]
OnConflict = Literal["existing", "replace", "debounce"]

SCOPES: tuple[str, ...] = ("queued", "running", "ttl")
CONFLICTS: tuple[str, ...] = ("existing", "replace", "debounce")
#: the lock's TTL when ``unique_for`` is not given, seconds
DEFAULT_UNIQUE_FOR = 3600.0
# a lock that moves between a conflict and its replace (its holder finished meanwhile) makes
# the call enqueue again; after this many rounds the last holder is returned as it is
_ROUNDS = 10


def unique_options(
    unique: bool,
    key: str | None,
    unique_for: float | timedelta | None,
    scope: str | None,
    on_conflict: str | None,
    has_delay: bool,
) -> UniqueOptions | None:
    """The options' unique settings, checked (None: not a unique job)."""
    if not unique and key is None:
        if unique_for is not None or scope is not None or on_conflict is not None:
            raise ConfigurationError(
                "unique_for=, unique_scope= and on_conflict= need unique=True or unique_key="
            )
        return None
    if key is not None:
        check_text(key, "unique_key")
    scope = "running" if scope is None else scope
    on_conflict = "existing" if on_conflict is None else on_conflict
    if scope not in SCOPES:
        raise ConfigurationError(f"unique_scope must be one of {SCOPES}, not {scope!r}")
    if on_conflict not in CONFLICTS:
        raise ConfigurationError(f"on_conflict must be one of {CONFLICTS}, not {on_conflict!r}")
    if on_conflict == "debounce" and not has_delay:
        raise ConfigurationError(
            'on_conflict="debounce" needs delay= (or at=): the due time it pushes back'
        )
    ttl = to_ms(DEFAULT_UNIQUE_FOR if unique_for is None else unique_for, "unique_for")
    if ttl <= 0:
        raise ConfigurationError("unique_for must be more than 0 seconds")
    return UniqueOptions(key or "", ttl, scope, on_conflict)


def derived_key(task: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """The lock key of ``unique=True``: the task's name and a SHA-256 of the arguments'
    canonical JSON (keys sorted, no spaces), so equal arguments give equal keys."""
    try:
        text = json.dumps(
            [list(args), dict(kwargs)], sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"unique=True keys a job by its arguments as JSON, and these are not JSON ({exc}): "
            "give unique_key= instead"
        ) from exc
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{task}:{digest}"


async def enqueue_unique(
    queue: OwnedQueue,
    records: Sequence[JobRecord],
    spec: UniqueOptions,
    remake: Callable[[int, str], JobRecord],
    convert: Callable[[Any], Any] | None = None,
) -> list[Job[Any]]:
    """Store unique jobs in order, resolving each conflict by ``spec.on_conflict``.

    ``remake(i, holder)``: the record of call ``i`` made for the holder's id (its payload is
    signed for that id), which ``replace``/``debounce`` store in the holder.
    """
    scripts = queue.door
    hooks = queue.app.hooks
    event = None
    if hooks.on_enqueue and records:
        event = hooks.before(queue.name, records[0].template.task, tuple(r.id for r in records))
    out: list[Job[Any] | None] = [None] * len(records)
    pending = list(range(len(records)))
    await put_blobs(queue.app.codec.claim, queue.name, (r.id for r in records))
    for round_ in range(_ROUNDS):
        again: list[int] = []
        if len(pending) == 1:  # shares a round trip with concurrent enqueues (_coalesce.py)
            code = await queue.coalescer.enqueue(records[pending[0]])
            holders = [text_of(code) if isinstance(code, bytes) else None]
        else:
            holders = await scripts.enqueue_unique([records[i] for i in pending])
        for i, holder in zip(pending, holders, strict=True):
            if holder is None:
                out[i] = Job(queue, records[i].id, convert)
                continue
            out[i] = Job(queue, holder, convert)
            if spec.on_conflict == "existing":
                continue
            t = records[i].template
            debounce = (t.delay_ms, t.at_ms) if spec.on_conflict == "debounce" else None
            key = records[i].unique_key
            job = remake(i, holder)
            await put_blobs(queue.app.codec.claim, queue.name, (holder,))
            outcome = await scripts.replace(key, holder, job, debounce, spec.ttl_ms)
            if outcome is ReplaceOutcome.LOCK_MOVED and round_ < _ROUNDS - 1:
                again.append(i)
        pending = again
        if not pending:
            break
    if event is not None:
        hooks.after(event)
    return [job for job in out if job is not None]
