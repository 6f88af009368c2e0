"""The outbox entries of job dependencies (``lua/lib/deps.lua``): read by the forwarder
(``leases.forward_outbox``) and applied with ``deps.lua`` on the queue they name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._model.keys import QueueKeys
from .._store.loader import SCRIPTS, ScriptCall
from .._store.scripts import QueueScripts


@dataclass(frozen=True, slots=True)
class Door:
    """One queue's keys and scripts, made from an App's public parts."""

    keys: QueueKeys
    scripts: QueueScripts


def door(app: Any, queue: str) -> Door:
    """The door to ``queue`` of ``app`` (its prefix and its client)."""
    keys = QueueKeys(app.prefix, queue)
    return Door(keys, QueueScripts(app.redis, keys))


def deps_call(d: Door, *args: Any) -> ScriptCall:
    """One deps.lua call on the queue of ``d``, for a pipeline."""
    return (SCRIPTS["deps"], d.scripts.lanes, [d.keys.base, *args])


def forward_entry(fields: list[bytes]) -> tuple[str, str, list[bytes]] | None:
    """An outbox entry of lib/deps: (kind 'met' or 'more', the queue it is applied on, its
    values), None for a batch outcome; ValueError when it cannot be read. The last field, the
    dependency's result (kept for its dependents), is missing from an entry stored before
    results were carried: read as none."""
    if not fields or fields[0] not in (b"\x00d", b"\x00c"):
        return None
    if fields[0] == b"\x00d" and len(fields) in (4, 5):
        queue, job_id = split_member(fields[1])
        return "met", queue, [job_id.encode(), fields[2], fields[3], (fields[4:] or [b""])[0]]
    if fields[0] == b"\x00c" and len(fields) in (3, 4):
        queue, job_id = split_member(fields[1])
        return "more", queue, [job_id.encode(), fields[2], (fields[3:] or [b""])[0]]
    raise ValueError("a dependency entry of the wrong shape")


def split_member(raw: bytes | str) -> tuple[str, str]:
    """A member's queue name and job id (a prefix has no braces: ``check_prefix``).

    Raises:
        ValueError: it names no job.
    """
    text = raw.decode() if isinstance(raw, bytes) else raw
    if "{" not in text or "}:" not in text:
        raise ValueError("not a job member")
    name, _, job_id = text.split("{", 1)[1].partition("}:")
    return name, job_id


def forward_call(app: Any, queue: str, kind: str, values: list[bytes]) -> ScriptCall:
    """The deps.lua call that applies outbox entries of one kind on ``queue``."""
    return deps_call(door(app, queue), kind, *values)
