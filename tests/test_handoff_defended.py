"""Guarantees that no test defended (issue 24, point 11): each was found by breaking the code
on purpose and running the suite, and each has a direct test here.

- a debounced *scheduled* job: the scheduled set's score follows the record's new due time
  (and ``check_invariants`` compares the two for every scheduled job);
- a promotion does not skip a job due in the claim's own millisecond;
- a coalesced enqueue call that the server refuses answers every one of its callers, at once;
- durability mode sends ``WAIT`` for the coalesced enqueues on Sentinel and on Cluster;
- a cluster primary that forgot its scripts and functions reloads them on the next call.

(A killed worker's prefetched jobs come back with their attempt refunded: in
``test_handoff_bounds.py``, with real processes.)
"""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis

from aioqueue import App, Job, JobState
from aioqueue._model.exceptions import ServerRefused
from aioqueue._model.record import parse_claim
from aioqueue._store.loader import SCRIPTS
from aioqueue._store.wire import evalsha_command

from .support.apps import unique_prefix
from .support.cluster import LocalCluster
from .support.invariants import check_invariants
from .support.sentinel import SentinelGroup
from .support.server import server_ms

LEASE_MS = 60_000
DEAD_TTL_MS = 3_600_000


# ---------------------------------------------------------------------- debounce
async def test_check_invariants_catches_a_scheduled_score_that_disagrees_with_the_due_time(
    app: App, redis: Redis
) -> None:
    q = app.queue()
    job = await q.enqueue("t", delay=3600)
    assert (await check_invariants(redis, q._keys))[job.id] == "scheduled"
    due = int(await redis.hget(q._keys.job(job.id), "due") or 0)
    # the score a debounce that forgot the set would leave: the job would be promoted early
    await redis.zadd(q._keys.scheduled, {job.id: due - 1000})
    with pytest.raises(AssertionError, match="score"):
        await check_invariants(redis, q._keys)


async def test_a_debounce_of_a_scheduled_job_moves_its_score(app: App, redis: Redis) -> None:
    q = app.queue()

    @app.task
    async def reindex(doc: str, version: int) -> None: ...

    def debounced(delay: float) -> Any:
        return reindex.options(unique_key="reindex:d1", on_conflict="debounce", delay=delay)

    first = await debounced(60).enqueue("d1", 1)
    before = await redis.zscore(q._keys.scheduled, first.id)
    start = await server_ms(redis)
    again = await debounced(3600).enqueue("d1", 2)
    assert again.id == first.id
    score = await redis.zscore(q._keys.scheduled, first.id)
    assert before is not None
    assert score is not None
    # moved to the new delay from now, and the record's due time says the same
    assert score >= start + 3_600_000 > before + 3_000_000
    assert int(await redis.hget(q._keys.job(first.id), "due") or 0) == score
    assert (await check_invariants(redis, q._keys))[first.id] == "scheduled"
    # not promoted at the old due time: a claim at any time before the new one gets nothing
    assert await q.reserve(1) == []
    assert (await first.info()).args == ("d1", 2)


# ---------------------------------------------------------------------- promotion
#: set a scheduled job's due time to the server's "now" (ms, as the scripts compute it)
_DUE_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], 'XX', now, ARGV[1])
redis.call('HSET', KEYS[2], 'due', now)
return now
"""


async def test_a_claim_promotes_a_job_due_in_its_own_millisecond(app: App, redis: Redis) -> None:
    """A job due at the claim's own server millisecond is due: the claim promotes and leases
    it. One transaction sets the due time to the server's "now" and claims; the check counts
    only the runs where both saw the same millisecond (nearly all of them)."""
    q = app.queue()
    scripts = q._scripts
    client = app.redis  # the App's client: it knows how the server runs the scripts
    await q.reserve(1)  # and they are loaded
    same_ms = 0
    for _ in range(50):
        job = await q.enqueue("t", delay=3600)
        claim = evalsha_command(
            client,
            SCRIPTS["claim"],
            scripts.lanes,
            (scripts.base, 1, LEASE_MS, DEAD_TTL_MS, "", 0, "abc123", "", ""),
        )
        pipe = client.pipeline(transaction=True)
        pipe.execute_command("EVAL", _DUE_NOW, 2, q._keys.scheduled, q._keys.job(job.id), job.id)
        pipe.execute_command(*claim)
        due, reply = await pipe.execute()
        res = parse_claim(reply)
        if res.now_ms == int(due):
            assert [c.id for c in res.jobs] == [job.id], "a job due this millisecond was skipped"
            same_ms += 1
            if same_ms >= 3:
                break
        else:  # the claim ran a millisecond later: the job was overdue, and leased too
            assert [c.id for c in res.jobs] == [job.id]
    assert same_ms >= 1, "no transaction ran within one millisecond"
    await check_invariants(redis, q._keys)


# ---------------------------------------------------------------------- coalesced enqueue
async def test_a_coalesced_enqueue_the_server_refuses_answers_every_caller_promptly(
    redis_url: str, redis: Redis
) -> None:
    """Concurrent enqueues share one call; the first job of that call is one this client's
    ACL user may not write, so the server refuses the call (NOPERM) before it writes
    anything: the call is retried job by job, the bad job's caller gets ``ServerRefused``,
    every other caller its job, well within 5 s (not at pytest's global timeout)."""
    prefix = unique_prefix()
    user, password = f"u{prefix}", "pw-" + prefix
    base = f"{prefix}:{{co}}:"
    # every key of the app but the record of job "zbad" of queue "co" (ACL key patterns
    # only allow): other queues; after co's base anything but "job:z..."
    allowed = [f"~{prefix}:{{[^c]*", f"~{base}[^j]*", f"~{base}j[^o]*", f"~{base}jo[^b]*"]
    allowed += [f"~{base}job[^:]*", f"~{base}job:[^z]*"]
    acl: Any = redis  # redis-py's execute_command is untyped
    await acl.execute_command("ACL", "SETUSER", user, "on", f">{password}", "+@all", "&*", *allowed)
    try:
        url = redis_url.replace("redis://", f"redis://{user}:{password}@", 1)
        async with App(url, prefix=prefix) as app:
            q = app.queue("co")
            # the first call goes alone; the others wait for it and go together, "zbad" first
            ids = ["first", "zbad", *(f"j{i}" for i in range(20))]
            calls = {i: asyncio.create_task(q.enqueue("t", job_id=i)) for i in ids}
            try:
                with anyio.fail_after(5):
                    await asyncio.wait(calls.values())
            finally:
                for task in calls.values():
                    task.cancel()
    finally:
        await acl.execute_command("ACL", "DELUSER", user)
    results: dict[str, Any] = {i: t.exception() or t.result() for i, t in calls.items()}
    bad = results.pop("zbad")
    assert isinstance(bad, ServerRefused), bad
    assert "permission" in str(bad).lower()
    assert all(isinstance(j, Job) and j.id == name for name, j in results.items()), results
    assert await redis.exists(q._keys.job("zbad")) == 0
    states = await check_invariants(redis, q._keys)
    assert sorted(states) == sorted(results)
    assert set(states.values()) == {"queued"}


# ---------------------------------------------------------------------- durability mode
async def _waits_sent_for_coalesced_enqueues(url: str, prefix: str, primary_port: int) -> int:
    """How many WAITs the primary (of the queue's slot) ran while 20 concurrent enqueues in
    durability mode were stored (after one enqueue that loaded the scripts)."""
    primary = Redis(port=primary_port, socket_timeout=None)

    async def waits() -> int:
        stats = await primary.info("commandstats")
        return int(stats.get("cmdstat_wait", {}).get("calls", 0))

    try:
        async with App(url, prefix=prefix, wait_replicas=1) as app:
            q = app.queue()
            await q.enqueue("noop", job_id="warm")
            before = await waits()
            jobs = await asyncio.gather(*(q.enqueue("noop", job_id=f"j{i}") for i in range(20)))
            after = await waits()
            for j in jobs:
                assert (await j.info()).state is JobState.QUEUED
        return after - before
    finally:
        await primary.aclose()


# every call that stored jobs waited for the replica: at least the first one, sent alone, and
# one for the enqueues coalesced behind it


async def test_durability_mode_sends_wait_for_coalesced_enqueues_on_sentinel(
    sentinels: SentinelGroup,
) -> None:
    port = sentinels.primary.port
    assert await _waits_sent_for_coalesced_enqueues(sentinels.url, unique_prefix(), port) >= 2


async def test_durability_mode_sends_wait_for_coalesced_enqueues_on_cluster(
    local_cluster: LocalCluster,
) -> None:
    prefix = unique_prefix()
    port = local_cluster.primary_for(f"{prefix}:{{default}}:job:j0").port
    assert await _waits_sent_for_coalesced_enqueues(local_cluster.url, prefix, port) >= 2


# ---------------------------------------------------------------------- cluster scripts
async def test_a_cluster_primary_that_forgot_its_scripts_reloads_them_on_the_next_call(
    local_cluster: LocalCluster,
) -> None:
    """``SCRIPT FLUSH`` and ``FUNCTION FLUSH`` on the primary of the queue's slot (a restart
    without persistence, a new primary): the next enqueue and the next claim on it load the
    scripts again and succeed."""
    prefix = unique_prefix()
    node = local_cluster.primary_for(f"{prefix}:{{default}}:job:x")
    async with App(local_cluster.url, prefix=prefix) as app:
        q = app.queue()
        first = await q.enqueue("t")
        with node.client() as raw:

            def forget() -> None:
                raw.execute_command("SCRIPT", "FLUSH")
                raw.execute_command("FUNCTION", "FLUSH")
                assert raw.execute_command("FUNCTION", "LIST") == []

            forget()
            second = await q.enqueue("t")  # reloads and succeeds
            forget()
            got = await q.reserve(2)  # so does a claim
        assert sorted(r.id for r in got) == sorted([first.id, second.id])
        for r in got:
            await q.complete(r, None)
        assert [(await j.info()).state for j in (first, second)] == [JobState.COMPLETED] * 2
