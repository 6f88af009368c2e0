"""Adaptive backoff (issue 28, point 2; docs/flow-control.md): a task that raises
``RateLimited`` goes back uncharged, and its rate limit backs off for every worker (AIMD in the
scripts), converging on what a fake upstream allows: an in-test counter that admits N calls in
any second by the server's clock and refuses the rest."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from aioqueue import App, ConfigurationError, RateLimited, Worker

from .support.waiting import wait_until

N = 10  # the upstream's calls per second
DECLARED = 4 * N  # what the limiter is declared with: four times too many
JOBS = 100

# KEYS[1] the upstream's log of accepted calls (ZSET)   ARGV[1] N   ARGV[2] a unique member
# Returns {1 accepted / 0 refused, server ms}: at most N accepted in any 1,000 ms
UPSTREAM = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 1000)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return {0, now} end
redis.call('ZADD', KEYS[1], now, ARGV[2])
return {1, now}
"""


async def test_a_rate_limited_upstream_is_converged_on_and_no_attempt_is_charged(
    app: App, redis: Redis
) -> None:
    app.limiter("api", rate=(DECLARED, 1.0))
    log = f"{app.prefix}:upstream"
    calls: list[tuple[int, bool]] = []

    @app.task(name="call", limits=["api"])
    async def call(i: int) -> None:
        ok, now = await app.redis.eval(UPSTREAM, 1, log, N, f"{i}:{len(calls)}")
        calls.append((int(now), bool(ok)))
        if not ok:
            raise RateLimited(retry_after=0.05)

    jobs = await call.enqueue_many([{"i": i} for i in range(JOBS)])
    async with Worker(app, concurrency=20):

        async def done() -> bool:
            return (await app.queue().stats()).get("completed", 0) == JOBS

        await wait_until(done, timeout=JOBS / N * 4 + 30, interval=0.1, what="every call made")
    infos = [await app.queue().job_info(j.id) for j in jobs]
    assert {(i.state.value, i.attempts) for i in infos} == {("completed", 1)}  # none charged
    start = calls[0][0]
    accepted = [t for t, ok in calls if ok]
    refused = [t for t, ok in calls if not ok]
    late = [ok for t, ok in calls if t >= start + 2000]  # after the first two seconds
    span = (accepted[-1] - start - 2000) / 1000
    rate = sum(late) / span
    print(
        f"upstream {N}/s, declared {DECLARED}/s: {len(accepted)} accepted, {len(refused)} "
        f"refused ({len(refused) / len(calls):.0%}); after 2 s: {rate:.1f}/s accepted, "
        f"{late.count(False) / len(late):.0%} refused"
    )
    # without backoff three calls in four would be refused (the limit lets 4N/s through)
    assert late.count(False) / len(late) < 0.35
    # AIMD's sawtooth runs between half the upstream's rate and all of it: its mean is above
    # N / 2 (measured 5.7-8.8/s of 10/s, the low end on a machine busy with other tests)
    assert rate >= 0.5 * N


def test_retry_after_is_checked() -> None:
    assert RateLimited(2).retry_after == 2.0
    assert RateLimited().retry_after is None
    for bad in (-1, 4000, "1", True, float("nan")):
        with pytest.raises(ConfigurationError):
            RateLimited(bad)  # type: ignore[arg-type]
