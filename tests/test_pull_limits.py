"""The pull API's per-call cap (docs/pull-api.md): one ``reserve`` leases at most 1,000 jobs
(``MAX_JOBS_PER_CALL``) whatever ``n``, and leaves the rest queued for the next call."""

from __future__ import annotations

from redis.asyncio import Redis

from aioqueue import App
from aioqueue._model.limits import MAX_JOBS_PER_CALL

from .support.invariants import check_invariants


async def test_reserve_leases_at_most_1000_jobs_a_call_and_leaves_the_rest_queued(
    app: App, redis: Redis
) -> None:
    assert MAX_JOBS_PER_CALL == 1000  # the figure pull-api.md gives
    q = app.queue()

    @app.task
    async def item(n: int) -> int:
        return n

    await item.enqueue_many({"n": i} for i in range(1200))
    first = await q.reserve(5000, lease=60)
    assert len(first) == 1000
    assert [r.kwargs["n"] for r in first[:3]] == [0, 1, 2]  # FIFO: the oldest first
    counts = await q.counts()
    assert (counts["active"], counts["queued"]) == (1000, 200)
    rest = await q.reserve(5000, lease=60)
    assert len(rest) == 200
    assert {r.id for r in first}.isdisjoint(r.id for r in rest)
    assert await q.reserve(5000) == []
    states = await check_invariants(redis, q._keys)
    assert list(states.values()).count("active") == 1200
