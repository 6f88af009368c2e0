"""The outbox entries of job dependencies (``lua/lib/deps.lua``): read by the forwarder
(``leases.forward_outbox``) and applied with ``deps.lua`` on the queue they name."""

from __future__ import annotations

from collections.abc import Sequence

from .._store.loader import SCRIPTS, ScriptCall


def forward_entry(fields: list[bytes]) -> tuple[str, str, list[bytes]] | None:
    """An outbox entry of lib/deps: (kind 'met' or 'more', the queue it is applied on, its
    values), None for a batch outcome; ValueError when it cannot be read."""
    if not fields or fields[0] not in (b"\x00d", b"\x00c"):
        return None
    if fields[0] == b"\x00d" and len(fields) == 4:
        queue, job_id = split_member(fields[1])
        return "met", queue, [job_id.encode(), fields[2], fields[3]]
    if fields[0] == b"\x00c" and len(fields) == 3:
        queue, job_id = split_member(fields[1])
        return "more", queue, [job_id.encode(), fields[2]]
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


def forward_call(lanes: Sequence[str], base: str, kind: str, values: list[bytes]) -> ScriptCall:
    """The deps.lua call that applies outbox entries of one kind on the queue of ``lanes``
    and key base ``base``."""
    return (SCRIPTS["deps"], lanes, [base, kind, *values])
