"""Where a sharded queue's shards land on a cluster whose slots are split evenly in order (as
``valkey-cli --cluster create`` and ``tests/support/cluster.py`` split them): the fact behind
the known issue "On a cluster of 2 primaries, shards s0 and s1 of any queue share a primary"
and docs/scaling.md's "Past one node". The slots are the server's own (redis-py's CRC-16 is
the cluster's, hash tags included), computed from the shards' real keys."""

from __future__ import annotations

from redis.crc import key_slot

from aioqueue import App

from .support.cluster import SLOTS

NAMES = ["hot", "emails", "thumbnails", "tenant-42", "q"] + [f"queue{i}" for i in range(200)]


def owners(app: App, name: str, shards: int, primaries: int) -> list[int]:
    """The primary (0..primaries-1) of each shard of ``name``, by the slot of its keys."""
    sharded = app.queue(name, shards=shards)
    step = SLOTS // primaries
    return [min(key_slot(q._keys.ready.encode()) // step, primaries - 1) for q in sharded.queues]


async def test_on_two_primaries_shards_0_and_1_always_share_one(app: App) -> None:
    for name in NAMES:
        s0, s1, s2, s3 = owners(app, name, 4, 2)
        assert s0 == s1, name  # the known issue: 2 shards use one of 2 primaries
        assert s2 == s3 != s0, name  # the advice: 4 shards put 2 on each


async def test_on_four_primaries_four_shards_always_spread(app: App) -> None:
    for name in NAMES:
        assert sorted(owners(app, name, 4, 4)) == [0, 1, 2, 3], name
