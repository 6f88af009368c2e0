"""The invariant checker: I1 on a real server, for the store tests and the worker tests alike.

``check_records`` asserts that every job of a quiescent queue is in exactly one state
structure, in agreement with its hash, and returns each job's ``JobRecord`` (state, attempts,
lease deadline); ``check_invariants`` is the same check returning only the states.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from redis.asyncio import Redis

from aioqueue._model.keys import QueueKeys

from .server import text

#: the structure a job id must be in, by its hash's ``s`` field (None: in no structure)
_HOME: dict[str, frozenset[str]] = {
    "queued": frozenset({"ready", "prio"}),  # or its group's lane, "g:<group>"
    "scheduled": frozenset({"scheduled"}),
    "active": frozenset({"active"}),
    "failed": frozenset({"dead"}),
    "completed": frozenset(),
    "cancelled": frozenset(),  # a runnable lane may still name it until claim drops it
    "waiting": frozenset(),  # a batch's callback, released when the batch finishes
}
_RUNNABLE = frozenset({"ready", "prio"})
_ZSETS = ("prio", "scheduled", "active", "dead")


@dataclass(frozen=True, slots=True)
class JobRecord:
    """The stored state of one job, as ``check_records`` found it."""

    state: str
    attempts: int
    lease_deadline_ms: int | None  # active jobs: when their lease runs out


def garbled(key: bytes | str) -> bool:
    """A key a script renamed aside as garbage (``<key>:garbled:<ms>``, see lua/lib/core)."""
    return ":garbled:" in text(key)


async def job_keys(redis: Redis, keys: QueueKeys) -> list[str]:
    """The ids of every job hash of a queue (SCAN, so only for a quiescent queue); keys set
    aside as garbage are not jobs."""
    prefix = keys.base + "job:"
    found = redis.scan_iter(match=prefix + "*", count=1000)
    return [text(k)[len(prefix) :] async for k in found if not garbled(k)]


async def _structures(
    redis: Redis, keys: QueueKeys
) -> tuple[dict[str, str], dict[str, dict[str, float]]]:
    """``({job id: the structure holding it}, {"active": {job id: lease deadline},
    "scheduled": {job id: due time}})``, asserting that no id is in two structures (or twice
    in the ready list)."""
    # a structure holding the wrong type is garbage no script has met yet (it is set aside
    # then): it holds no job
    ready: list[bytes | str] = []
    if await redis.type(keys.ready) in (b"list", b"none"):
        ready = await redis.lrange(keys.ready, 0, -1)
    members: dict[str, list[str]] = {"ready": [text(m) for m in ready]}
    assert len(members["ready"]) == len(set(members["ready"])), "an id is twice in ready"
    scores: dict[str, dict[str, float]] = {"active": {}, "scheduled": {}}
    for name in _ZSETS:
        if await redis.type(getattr(keys, name)) not in (b"zset", b"none"):
            continue
        pairs = cast(
            list[tuple[bytes, float]],
            await redis.zrange(getattr(keys, name), 0, -1, withscores=True),
        )
        members[name] = [text(m) for m, _ in pairs]
        if name in scores:
            scores[name] = {text(m): float(score) for m, score in pairs}
    # groups' lanes (base.."g:"..group ZSETs), where a queued job with a group waits
    async for lane in redis.scan_iter(match=keys.base + "g:*", count=1000):
        if garbled(lane) or await redis.type(lane) != b"zset":
            continue
        name = text(lane)[len(keys.base) :]
        members[name] = [text(m) for m in await redis.zrange(lane, 0, -1)]
    where: dict[str, str] = {}
    for name, held in members.items():
        for job_id in held:
            assert job_id not in where, f"job {job_id} is in both {where[job_id]} and {name}"
            where[job_id] = name
    return where, scores


async def _hashes(redis: Redis, keys: QueueKeys) -> dict[str, list[bytes | None]]:
    """``{job id: [s, pr, l, g, a, due]}`` of every job hash of the queue."""
    ids = await job_keys(redis, keys)
    records: dict[str, list[bytes | None]] = {}
    for start in range(0, len(ids), 1000):
        chunk = ids[start : start + 1000]
        pipe = redis.pipeline(transaction=False)
        for job_id in chunk:
            pipe.hmget(keys.job(job_id), ["s", "pr", "l", "g", "a", "due"])
        for job_id, fields in zip(chunk, await pipe.execute(), strict=True):
            if fields[0] is not None:  # None: expired between SCAN and HMGET
                records[job_id] = fields
    return records


def _check_home(
    job_id: str, state: str, found: str | None, pr: bytes | None, group: bytes | None
) -> None:
    """Assert that a job in ``state`` is in the structure it belongs in (``found``)."""
    assert state in _HOME, f"job {job_id} has unknown state {state!r}"
    if state == "queued":
        lane = "ready" if int(pr or 0) == 0 else "prio"
        expected = "g:" + group.decode() if group else lane
        assert found == expected, f"queued job {job_id} (priority {pr!r}) is in {found}"
    elif state == "cancelled":
        lazy = found is None or found in _RUNNABLE or found.startswith("g:")
        assert lazy, f"cancelled job {job_id} is still in {found}"
    elif _HOME[state]:
        assert found in _HOME[state], f"{state} job {job_id} is in {found or 'no structure'}"
    else:
        assert found is None, f"{state} job {job_id} is still in {found}"


async def check_records(
    redis: Redis, keys: QueueKeys, *, allow_expired_dead: bool = True
) -> dict[str, JobRecord]:
    """Assert I1 for one queue and return ``{job id: JobRecord}`` of every job hash.

    Checks that each id is in at most one of ready/prio/scheduled/active/dead or a group's
    lane (and at most once in the ready list); that a queued job is in its group's lane, or
    without a group in ready (priority 0) or prio (otherwise); a scheduled one in scheduled,
    scored by its record's due time, an active one in active (holding a lease token and a
    lease deadline, so that maintenance hands it back if nobody renews it), a failed one in
    dead, a completed or waiting one in none, a cancelled one in none but a runnable lane
    (dropped lazily); that every job handed to a parked worker is active under the lease it
    was handed with; and that no structure names a job whose hash is gone, except dead letters
    whose record expired before ``reap`` trimmed the dead set; and that the indexes of
    completed and cancelled jobs name jobs in their state or whose record is gone. Call it
    only when nothing else is changing the queue: it reads with several commands.
    """
    where, scores = await _structures(redis, keys)
    hashes = await _hashes(redis, keys)
    for job_id, name in where.items():
        if job_id not in hashes:
            expired_dead = allow_expired_dead and name == "dead"
            assert expired_dead, f"{name} holds job {job_id}, which has no record"
    records: dict[str, JobRecord] = {}
    for job_id, (s, pr, lease, group, attempts, due) in hashes.items():
        state = text(s)
        _check_home(job_id, state, where.get(job_id), pr, group)
        if state == "scheduled":
            # promotion reads the score, the record's readers its due time: they must agree
            # (a debounce that moved one and not the other would run the job early or late)
            score = scores["scheduled"][job_id]
            assert due is not None, f"scheduled job {job_id} has no due time"
            assert int(due) == score, f"scheduled job {job_id}: due {text(due)}, score {score}"
        deadline = None
        # an active job always holds a lease token; the last token stays after it leaves
        # active, so that an ack resent after a lost reply is recognised (lua/lib/core.lua)
        if state == "active":
            assert lease is not None, f"active job {job_id} has no lease token"
            deadline = int(scores["active"][job_id])
        records[job_id] = JobRecord(state, int(attempts or 0), deadline)
    # the indexes of finished jobs (listing only) name jobs in their state, or whose record
    # is gone (expired, or deleted at once when its result was not kept)
    for index, want in ((keys.completed, "completed"), (keys.cancelled, "cancelled")):
        if await redis.type(index) != b"zset":
            continue
        for member in await redis.zrange(index, 0, -1):
            job_id = text(member)
            if job_id in hashes:
                state = text(hashes[job_id][0])
                assert state == want, f"the {want} index holds job {job_id}, which is {state}"
    # jobs handed to a parked worker (7 values each, as claim replies) hold its current lease
    async for hand in redis.scan_iter(match=keys.base + "hand:*", count=1000):
        if garbled(hand) or await redis.type(hand) != b"list":
            continue
        values = await redis.lrange(hand, 0, -1)
        assert len(values) % 7 == 0, f"{text(hand)} holds a partial record"
        for i in range(0, len(values), 7):
            job_id, token = text(values[i]), text(values[i + 1])
            fields = hashes.get(job_id, [b"gone", None, None, None, None, None])
            state = text(fields[0])
            assert state == "active", f"job {job_id} handed over in {text(hand)} is {state}"
            assert text(fields[2]) == token, f"job {job_id} handed over with a stale lease"
    return records


async def check_invariants(
    redis: Redis, keys: QueueKeys, *, allow_expired_dead: bool = True
) -> dict[str, str]:
    """``check_records``, returning only ``{job id: state}``."""
    records = await check_records(redis, keys, allow_expired_dead=allow_expired_dead)
    return {job_id: record.state for job_id, record in records.items()}
