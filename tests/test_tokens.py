"""Lease tokens cannot be guessed, and a token that gave its job back is spent (issue 19 §4).

A token is a sequence number and a random nonce of the claim that made it: a consumer that
knows its own token cannot build its neighbour's (token + 1 used to be the neighbour's), and
every fenced script compares tokens exactly. A released token is recorded on the job (rl), so
a later fail() or complete() with it answers STALE instead of a silent success.
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from aioqueue import App, JobState, LeaseLost
from aioqueue._store.outcomes import FailMode, Outcome

from .support.invariants import check_invariants
from .support.server import text

DEAD_TTL_MS = 3_600_000


def _bump(token: str) -> str:
    """The token a sequential scheme would have given the next job: its number plus one."""
    seq, _, rest = token.partition("-")
    return f"{int(seq) + 1}-{rest}" if rest else str(int(seq) + 1)


async def test_a_neighbours_token_cannot_be_derived_from_ones_own(app: App, redis: Redis) -> None:
    q = app.queue()
    mine_job = await q.enqueue("t", args=[1])
    theirs_job = await q.enqueue("t", args=[2])
    [mine] = await q.reserve(1)
    [theirs] = await q.reserve(1)  # another consumer's claim
    assert (mine.id, theirs.id) == (mine_job.id, theirs_job.id)
    assert mine.token != theirs.token
    # the numbers follow each other, the nonces do not repeat
    assert mine.token.split("-")[1] != theirs.token.split("-")[1]
    assert len(mine.token.split("-")[1]) == 16
    leases = q.leases
    # token + 1, the neighbour's under sequential tokens, and the bare sequence number
    for guess in (_bump(mine.token), theirs.token.split("-")[0], mine.token):
        assert await leases.complete([(theirs.id, guess, b"1", 60_000)]) == [Outcome.STALE]
        assert await leases.extend([(theirs.id, guess)], 60_000) == [Outcome.STALE]
        assert await leases.release([(theirs.id, guess)]) == [Outcome.STALE]
        assert await leases.fail(theirs.id, guess, "x", FailMode.DEAD) is Outcome.STALE
    # nothing of that touched the neighbour's job; its own token still holds it
    assert (await check_invariants(redis, q._keys))[theirs.id] == "active"
    await q.complete(theirs, "theirs")
    await q.complete(mine, "mine")
    assert await theirs_job.result(timeout=1) == "theirs"


async def test_tokens_of_one_reserve_share_no_random_part(app: App, redis: Redis) -> None:
    # issue 24 point 9: the tokens of one reserve(n) used to share the claim's nonce, so one
    # token gave away its neighbour's (its number plus one, the same nonce)
    q = app.queue()
    for i in range(5):
        await q.enqueue("t", args=[i])
    got = await q.reserve(5)
    assert len(got) == 5
    numbers = [int(r.token.split("-")[0]) for r in got]
    tails = [r.token.split("-")[1] for r in got]
    assert numbers == list(range(numbers[0], numbers[0] + 5))  # one claim, consecutive
    assert len(set(tails)) == 5
    assert all(len(t) == 16 for t in tails)
    mine, theirs = got[0], got[1]
    leases = q.leases
    # the sequential guess: the neighbour's number with my random part
    guess = _bump(mine.token)
    assert guess != theirs.token
    assert await leases.complete([(theirs.id, guess, b"1", 60_000)]) == [Outcome.STALE]
    assert await leases.extend([(theirs.id, guess)], 60_000) == [Outcome.STALE]
    assert await leases.fail(theirs.id, guess, "x", FailMode.DEAD) is Outcome.STALE
    assert (await check_invariants(redis, q._keys))[theirs.id] == "active"
    for r in got:
        await q.complete(r, "done")


async def test_tokens_handed_to_a_parked_worker_carry_its_nonce(app: App, redis: Redis) -> None:
    scripts = app.queue()._scripts
    await scripts.claim(2, 60_000, DEAD_TTL_MS, "w1", 60_000)
    await app.queue().enqueue("t")
    values = await redis.lrange(app.queue()._keys.hand("w1"), 0, -1)
    token = text(values[1])
    seq, nonce = token.split("-")
    assert seq.isdigit()
    assert len(nonce) == 16
    res = await scripts.claim(2, 60_000, DEAD_TTL_MS, "w1", 0)
    assert [c.token for c in res.jobs] == [token]


async def test_fail_after_release_with_the_same_token_is_stale(app: App, redis: Redis) -> None:
    q = app.queue()
    job = await q.enqueue("t", max_attempts=3)
    [r] = await q.reserve(1)
    await q.release(r)
    with pytest.raises(LeaseLost):
        await q.fail(r, RuntimeError("after release"))
    with pytest.raises(LeaseLost):
        await q.complete(r, "after release")
    # the release stands, and nothing was recorded by the stale calls
    info = await job.info()
    assert (info.state, info.attempts, info.error) == (JobState.QUEUED, 0, None)
    # a release resent with the same token (its reply was lost) is still answered OK
    assert await q.leases.release([(r.id, r.token)]) == [Outcome.OK]
    [again] = await q.reserve(1)
    assert again.id == job.id
    assert again.token != r.token
    assert again.attempt == 1
    await q.complete(again, 7)
    assert await job.result(timeout=1) == 7
