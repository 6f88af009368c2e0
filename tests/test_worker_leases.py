"""Two worker guarantees of docs/guarantees.md that no other test would notice breaking
(issue 19 §5): the heartbeat renews the leases of prefetched jobs that wait for a slot longer
than the lease (I3), and a worker stops a running job cancelled from another client and
records it as ``cancelled`` (I4; the pull API's path is in test_pull_api.py).

In-process workers on a real server, with a 1 s lease; waits are on conditions, judged by
the server's clock.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from redis.asyncio import Redis

from aioqueue import App, JobCancelled, JobState, Worker

from .support.apps import open_app
from .support.invariants import check_invariants
from .support.server import server_ms
from .support.waiting import wait_until

LEASE = 1.0  # seconds


async def test_prefetched_jobs_keep_their_leases_while_they_wait_longer_than_the_lease(
    redis_url: str, redis: Redis
) -> None:
    async with open_app(redis_url, lease=LEASE) as app:
        q = app.queue()
        release = asyncio.Event()
        ran: list[str] = []

        @app.task
        async def slow() -> None:
            await asyncio.wait_for(release.wait(), timeout=60)

        @app.task
        async def quick(n: int) -> int:
            ran.append(f"quick-{n}")
            return n

        first = await slow.enqueue()
        jobs = [await quick.options(job_id=f"quick-{n}").enqueue(n) for n in range(3)]
        # one slot, busy with the slow job: the quick ones wait in the prefetch buffer
        async with Worker(app, concurrency=1, prefetch=3, max_batch=4) as w1:

            async def all_leased() -> bool:
                return int(await redis.zcard(q._keys.active)) == 4

            await wait_until(
                all_leased, timeout=30, what="the slow job running and the quick ones prefetched"
            )
            assert await first.state() is JobState.ACTIVE
            since = await server_ms(redis)
            # a second worker with free slots takes any of them whose lease ran out
            async with Worker(app, concurrency=4):

                async def three_leases_passed() -> bool:
                    return await server_ms(redis) - since >= 3 * LEASE * 1000

                await wait_until(three_leases_passed, timeout=30, what="three leases to pass")
                assert ran == [], "a prefetched job was handed to the other worker"
                assert all([await j.state() is JobState.ACTIVE for j in jobs])
                release.set()
                assert [await j.result(timeout=30) for j in jobs] == [0, 1, 2]
                await first.result(timeout=30)
            assert w1.completed == 4
        assert Counter(ran) == {f"quick-{n}": 1 for n in range(3)}  # each ran once
        assert (await q.stats()).get("expired", 0) == 0
        assert {(await j.info()).attempts for j in jobs} == {1}
        assert set((await check_invariants(redis, q._keys)).values()) == {"completed"}


async def test_a_running_job_cancelled_from_another_client_is_stopped_and_recorded_cancelled(
    redis_url: str, redis: Redis
) -> None:
    async with open_app(redis_url, lease=LEASE) as app:
        started = asyncio.Event()
        stopped: list[str] = []

        @app.task
        async def endless() -> None:
            started.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                stopped.append("cancelled")
                raise

        @app.task
        async def after() -> str:
            return "still working"

        job = await endless.enqueue()
        async with Worker(app, concurrency=2):
            await asyncio.wait_for(started.wait(), timeout=30)
            assert await job.state() is JobState.ACTIVE
            # another client (its own App and connections) asks for the cancellation
            async with App(redis_url, prefix=app.prefix, lease=LEASE) as other:
                assert await other.queue().job(job.id).cancel() is False  # running: flagged
            with pytest.raises(JobCancelled):
                await job.result(timeout=30)
            assert stopped == ["cancelled"]  # the body was stopped, not left to finish
            info = await job.info()
            assert info.state is JobState.CANCELLED
            assert info.error is not None
            assert info.error.type == "Cancelled"
            # the worker goes on with other jobs
            nxt = await after.enqueue()
            assert await nxt.result(timeout=30) == "still working"
        assert (await app.queue().stats()).get("cancelled", 0) == 1
        assert set((await check_invariants(redis, app.queue()._keys)).values()) == {
            "cancelled",
            "completed",
        }
