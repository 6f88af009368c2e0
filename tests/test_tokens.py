"""Lease tokens cannot be guessed, and a token that gave its job back is spent (issue 19 §4).

A token is 16 hex digits of the claiming worker's random material, each used once (an older
client's short nonce: a sequence number and half a SHA-1 of it): a consumer that knows its own
token cannot build its neighbour's (token + 1 used to be the neighbour's), and every fenced
script compares tokens exactly. A released token is recorded on the job (rl), so
a later fail() or complete() with it answers STALE instead of a silent success.
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from aioqueue import App, JobState, LeaseLost
from aioqueue._model.record import parse_claim
from aioqueue._store.outcomes import FailMode, Outcome

from .support.invariants import check_invariants
from .support.server import text

DEAD_TTL_MS = 3_600_000


def _bump(token: str) -> str:
    """The token a sequential scheme would have given the next job: its number plus one."""
    seq, _, rest = token.partition("-")
    if rest:  # <seq>-<half a SHA-1>
        return f"{int(seq) + 1}-{rest}"
    return f"{(int(token, 16) + 1) % 16**16:016x}"


def _is_material(token: str) -> bool:
    """A token cut from the worker's random material: 16 lowercase hex digits."""
    return len(token) == 16 and all(c in "0123456789abcdef" for c in token)


async def test_a_neighbours_token_cannot_be_derived_from_ones_own(app: App, redis: Redis) -> None:
    q = app.queue()
    mine_job = await q.enqueue("t", args=[1])
    theirs_job = await q.enqueue("t", args=[2])
    [mine] = await q.reserve(1)
    [theirs] = await q.reserve(1)  # another consumer's claim
    assert (mine.id, theirs.id) == (mine_job.id, theirs_job.id)
    assert mine.token != theirs.token
    assert _is_material(mine.token)
    assert _is_material(theirs.token)
    leases = q.leases
    # token + 1, the neighbour's under sequential tokens, half of it, and one's own
    for guess in (_bump(mine.token), theirs.token[:8], mine.token):
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
    tokens = [r.token for r in got]
    assert len(set(tokens)) == 5
    assert all(_is_material(t) for t in tokens)
    # no half of one is a half of another (each is its own 64 random bits)
    halves = [t[:8] for t in tokens] + [t[8:] for t in tokens]
    assert len(set(halves)) == 10
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


async def test_tokens_handed_to_a_parked_worker_are_new_parts_of_its_material(
    app: App, redis: Redis
) -> None:
    q = app.queue()
    scripts = q._scripts
    await q.enqueue("t")
    # the claim leases one job of the two it asked for, and parks with what it left unused
    first = await scripts.claim(2, 60_000, DEAD_TTL_MS, "w1", 60_000)
    [own] = first.jobs
    registration = text(await redis.hget(q._keys.base + "idlew", "w1"))
    material = registration.split()[-1]
    assert registration.split()[0] == "1"  # it may take one more
    assert _is_material(own.token)
    assert own.token not in material
    await q.enqueue("t")
    values = await redis.lrange(q._keys.hand("w1"), 0, -1)
    token = text(values[1])
    assert _is_material(token)
    assert token != own.token
    assert material.startswith(token)  # the next part of the worker's own material
    res = await scripts.claim(2, 60_000, DEAD_TTL_MS, "w1", 0)
    assert [c.token for c in res.jobs] == [token]


async def _claim_with(app: App, n: int, nonce: str) -> list[str]:
    """The tokens of a claim of ``n`` jobs made with this random material (an older client
    sends a 32-digit nonce whatever n is)."""
    scripts = app.queue()._scripts
    args = (scripts.base, n, 60_000, DEAD_TTL_MS, "", 0, nonce, "", "")
    return [c.token for c in parse_claim(await scripts.run("claim", args)).jobs]


async def test_a_claim_with_too_little_material_derives_its_tokens_and_hands_none_of_it_out(
    app: App, redis: Redis
) -> None:
    q = app.queue()
    for i in range(5):
        await q.enqueue("t", args=[i])
    nonce = "0123456789abcdef" * 2  # 128 bits: enough for 2 tokens, not for 5
    tokens = await _claim_with(app, 5, nonce)
    assert len(set(tokens)) == 5
    for token in tokens:
        seq, _, part = token.partition("-")
        assert seq.isdigit()
        assert len(part) == 16
        assert part not in nonce  # derived (SHA-1), never a piece of the nonce
    # the sequence numbers follow each other, the derived parts share nothing
    seqs = [int(t.split("-")[0]) for t in tokens]
    assert seqs == list(range(seqs[0], seqs[0] + 5))
    assert len({t.split("-")[1] for t in tokens}) == 5
    for t in tokens:
        assert _bump(t) not in tokens[tokens.index(t) + 1 :]
    # garbage material (not hex, empty) still gives each lease its own token
    for i in range(4):
        await q.enqueue("t", args=[i])
    assert len(set(await _claim_with(app, 2, "")) | set(await _claim_with(app, 2, "zz"))) == 4


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
