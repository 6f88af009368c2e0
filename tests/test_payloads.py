"""Large payloads (docs/tasks.md, "Large payloads"): compression above a threshold and the
claim-check of payloads to a store the application provides.

Real server, real (in-process) workers: values round-trip compressed; a planted decompression
bomb, a codec missing on the reader, a missing or tampered blob each dead-letter the job with
its reason; ``max_payload_bytes`` bounds the bytes stored; blobs go with their job (completion,
purge, the sweep of orphans); signing, encryption, compression and claim-check together.
"""

from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from aioqueue import (
    App,
    Backoff,
    Batch,
    ClaimCheck,
    Compression,
    ConfigurationError,
    CorruptRecord,
    PayloadTooLarge,
    sweep_payloads,
)
from aioqueue._model.claimcheck import MARKER as REF_MARKER
from aioqueue._model.claimcheck import job_key
from aioqueue._model.compress import MARKER as ZIP_MARKER
from aioqueue._model.keys import QueueKeys
from examples.payload_stores import FileStore, MemoryStore

from .support.apps import unique_prefix
from .support.waiting import wait_until
from .test_signing import outcome, working

zstandard = pytest.importorskip("zstandard")

SIG = "s" * 16 + "-signing-key-A"
ENC = "e" * 16 + "-encryption-key-A"
MB = 1 << 20


def rows(n: int) -> list[dict[str, Any]]:
    """JSON-like order rows, about 60 bytes each: repetitive, as real payloads are."""
    return [{"sku": f"sku-{i % 97}", "qty": i % 9, "status": "pending"} for i in range(n)]


def make_app(url: str, prefix: str, **options: Any) -> App:
    options.setdefault("max_attempts", 1)
    options.setdefault("backoff", Backoff(base=0.01, factor=1.0, max=0.01, jitter=0.0))
    app = App(url, prefix=prefix, **options)

    @app.task
    async def size(data: list[Any]) -> int:
        return len(json.dumps(data))

    @app.task
    async def echo(data: Any) -> Any:
        return data

    return app


def place() -> tuple[str, QueueKeys, MemoryStore]:
    """A fresh prefix, the keys of its default queue, and an empty in-memory store."""
    prefix = unique_prefix()
    return prefix, QueueKeys(prefix, "default"), MemoryStore()


def checked(url: str, prefix: str, store: MemoryStore) -> App:
    """An App that claim-checks payloads of 1,000 bytes or more to ``store``."""
    return make_app(url, prefix, payload_store=ClaimCheck(store, above=1000))


async def stored(redis: Redis, keys: QueueKeys, job_id: str, name: str = "p") -> bytes:
    value = await redis.hget(keys.job(job_id), name)
    assert isinstance(value, bytes)
    return value


# ---------------------------------------------------------------------------- compression
async def test_compressed_round_trip_above_the_threshold(redis_url: str, redis: Redis) -> None:
    prefix = unique_prefix()
    keys = QueueKeys(prefix, "default")
    async with make_app(redis_url, prefix, compression="zstd") as app:
        small = await app.tasks["echo"].enqueue("tiny")
        big = await app.tasks["size"].enqueue(rows(20_000))
        answer = await app.tasks["echo"].enqueue(rows(5_000))
        assert not (await stored(redis, keys, small.id)).startswith(ZIP_MARKER)
        p = await stored(redis, keys, big.id)
        raw = len(json.dumps([[rows(20_000)], {}], separators=(",", ":")))
        assert p.startswith(ZIP_MARKER)
        assert len(p) * 10 < raw
        async with working(app):
            assert await big.result(timeout=30) == len(json.dumps(rows(20_000)))
            assert await answer.result(timeout=30) == rows(5_000)
            assert await small.result(timeout=30) == "tiny"
        assert (await stored(redis, keys, answer.id, "r")).startswith(ZIP_MARKER)


async def test_lz4_and_a_reader_without_the_setting(redis_url: str) -> None:
    pytest.importorskip("lz4")
    prefix = unique_prefix()
    async with make_app(redis_url, prefix, compression=Compression("lz4", above=100)) as app:
        job = await app.tasks["echo"].enqueue(rows(1_000))
    # a worker with compression off still reads compressed values (by their marker)
    async with make_app(redis_url, prefix) as reader, working(reader):
        assert await reader.queue("default").job(job.id).result(timeout=30) == rows(1_000)


async def test_max_payload_bytes_bounds_the_bytes_stored(redis_url: str) -> None:
    data = rows(40_000)  # about 2 MB as JSON, about 100 KB compressed
    async with make_app(redis_url, unique_prefix(), max_payload_bytes=MB) as plain:
        with pytest.raises(PayloadTooLarge, match="compressed"):
            await plain.tasks["size"].enqueue(data)
    opts: dict[str, Any] = {"max_payload_bytes": MB, "compression": "zstd"}
    async with make_app(redis_url, unique_prefix(), **opts) as app, working(app):
        job = await app.tasks["size"].enqueue(data)
        assert await job.result(timeout=30) == len(json.dumps(data))


async def test_a_planted_decompression_bomb_is_dead_lettered(redis_url: str, redis: Redis) -> None:
    prefix = unique_prefix()
    keys = QueueKeys(prefix, "default")
    frame = zstandard.ZstdCompressor(level=19).compress(b"[" + b" " * (200 * MB) + b"]")
    assert len(frame) < 100_000  # 200 MB of blanks in a few KB
    # honest about its size: over the cap (8x max_payload_bytes, at least 64 MiB)
    honest = ZIP_MARKER + b"z" + (200 * MB + 2).to_bytes(8, "big") + frame
    # lying about its size: the reader stops one byte past what it declares
    lying = ZIP_MARKER + b"z" + (1000).to_bytes(8, "big") + frame
    async with make_app(redis_url, prefix, compression="zstd") as app:
        a = await app.tasks["echo"].enqueue(rows(100))
        b = await app.tasks["echo"].enqueue(rows(100))
        await redis.hset(keys.job(a.id), "p", honest)
        await redis.hset(keys.job(b.id), "p", lying)
        async with working(app):
            assert await outcome(redis, keys, a.id) == "failed:DecompressionBomb"
            assert await outcome(redis, keys, b.id) == "failed:CorruptPayload"


async def test_a_reader_without_the_codec_dead_letters_the_job(
    redis_url: str, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = unique_prefix()
    keys = QueueKeys(prefix, "default")
    async with make_app(redis_url, prefix, compression="zstd") as app:
        job = await app.tasks["echo"].enqueue(rows(1_000))
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import zstandard: ImportError
    with pytest.raises(ConfigurationError, match="aioqueue\\[compression\\]"):
        make_app(redis_url, prefix, compression="zstd")
    async with make_app(redis_url, prefix) as reader, working(reader):
        assert await outcome(redis, keys, job.id) == "failed:CompressionUnavailable"
        info = await reader.queue("default").job(job.id).info()
        assert info.error is not None
        assert "aioqueue[compression]" in info.error.message


async def test_a_result_that_cannot_be_inflated_raises_corrupt_record(
    redis_url: str, redis: Redis
) -> None:
    prefix = unique_prefix()
    keys = QueueKeys(prefix, "default")
    frame = zstandard.ZstdCompressor(level=19).compress(b'"' + b"x" * (100 * MB) + b'"')
    async with make_app(redis_url, prefix, compression="zstd") as app:
        job = await app.tasks["echo"].enqueue("x")
        async with working(app):
            assert await job.result(timeout=30) == "x"
        bomb = ZIP_MARKER + b"z" + (100 * MB + 2).to_bytes(8, "big") + frame
        await redis.hset(keys.job(job.id), "r", bomb)
        with pytest.raises(CorruptRecord, match="DecompressionBomb"):
            await job.result(timeout=5)


# ---------------------------------------------------------------------------- claim-check
async def test_five_megabytes_through_a_file_store(
    redis_url: str, redis: Redis, tmp_path: Path
) -> None:
    prefix = unique_prefix()
    keys = QueueKeys(prefix, "default")
    store = FileStore(tmp_path / "blobs")
    data = [f"{i:08d}-{zlib.crc32(str(i).encode()):x}" for i in range(300_000)]  # ~5 MB
    async with make_app(redis_url, prefix, payload_store=store, max_payload_bytes=0) as app:
        job = await app.tasks["size"].enqueue(data)
        p = await stored(redis, keys, job.id)
        assert p.startswith(REF_MARKER)
        assert len(p) < 200
        key = job_key(prefix, "default", job.id)
        blob = await store.get(key)
        assert blob is not None
        assert len(blob) > 5_000_000
        async with working(app):
            assert await job.result(timeout=60) == len(json.dumps(data))

            async def removed() -> bool:
                return await store.get(key) is None

            await wait_until(removed, timeout=15, what="the blob to be deleted on completion")


async def test_missing_and_tampered_blobs_dead_letter(redis_url: str, redis: Redis) -> None:
    prefix, keys, store = place()
    async with checked(redis_url, prefix, store) as app:
        gone = await app.tasks["size"].enqueue(rows(200))
        bad = await app.tasks["size"].enqueue(rows(200))
        other = await app.tasks["size"].enqueue(rows(300))
        await store.delete([job_key(prefix, "default", gone.id)])
        bad_key = job_key(prefix, "default", bad.id)
        store.blobs[bad_key] = store.blobs[bad_key].replace(b"pending", b"shipped")
        async with working(app):
            assert await outcome(redis, keys, gone.id) == "failed:MissingPayload"
            assert await outcome(redis, keys, bad.id) == "failed:TamperedPayload"
            assert await other.result(timeout=30) == len(json.dumps(rows(300)))
        # a dead letter keeps its blob (it can be requeued); the completed job's is deleted
        assert bad_key in store.blobs
        await wait_until(lambda: job_key(prefix, "default", other.id) not in store.blobs)


async def test_purge_and_sweep_remove_blobs_with_their_jobs(redis_url: str, redis: Redis) -> None:
    prefix, keys, store = place()
    async with checked(redis_url, prefix, store) as app:
        q = app.queue("default")
        later = [await app.tasks["size"].options(delay=3600).enqueue(rows(100)) for _ in range(4)]
        key = [job_key(prefix, "default", j.id) for j in later]
        assert all(k in store.blobs for k in key)
        assert await q.purge(job_ids=[later[0].id]) == 1
        assert key[0] not in store.blobs
        assert key[1] in store.blobs
        # a record Redis deleted itself (retention): its blob is an orphan until the sweep
        await redis.delete(keys.job(later[1].id))
        deleted, cursor = await sweep_payloads(q, limit=100, grace=0.2)
        assert (deleted, cursor) == (1, "")
        assert key[1] not in store.blobs
        assert key[2] in store.blobs
        assert key[3] in store.blobs
        assert await q.purge("scheduled", task="size") == 2
        assert not store.blobs


async def test_every_layer_together(redis_url: str, redis: Redis, tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    prefix = unique_prefix()
    keys = QueueKeys(prefix, "default")
    store = FileStore(tmp_path)
    opts: dict[str, Any] = {
        "signing_key": SIG,
        "encryption_key": ENC,
        "compression": "zstd",
        "payload_store": ClaimCheck(store, above=10_000),
    }
    async with make_app(redis_url, prefix, **opts) as app:
        a = await app.tasks["echo"].enqueue(rows(20_000))
        b = await app.tasks["echo"].enqueue(rows(20_000))
        ka, kb = job_key(prefix, "default", a.id), job_key(prefix, "default", b.id)
        blob_a = await store.get(ka)
        assert blob_a is not None
        assert b"pending" not in blob_a
        assert b"pending" not in await stored(redis, keys, a.id)
        swapped = await app.tasks["echo"].enqueue(rows(20_000))
        await store.put(job_key(prefix, "default", swapped.id), blob_a)  # another job's blob
        async with working(app):
            assert await a.result(timeout=30) == rows(20_000)
            assert await b.result(timeout=30) == rows(20_000)
            assert await outcome(redis, keys, swapped.id) == "failed:TamperedPayload"
        r = await stored(redis, keys, a.id, "r")
        assert b"pending" not in r
        await wait_until(lambda: store._get(kb) is None, what="the blob deleted on completion")


async def test_the_blocking_producer_refuses_claim_checked_payloads(redis_url: str) -> None:
    store = MemoryStore()
    app = make_app(redis_url, unique_prefix(), payload_store=ClaimCheck(store, above=1000))
    sync = app.sync()
    try:
        small = sync.enqueue(app.tasks["size"], rows(2))
        assert small.id
        with pytest.raises(PayloadTooLarge, match="blocking producer"):
            sync.enqueue(app.tasks["size"], rows(200))
        assert not store.blobs
        assert not app.codec.claim.pending  # type: ignore[union-attr]
    finally:
        sync.close()


async def test_enqueue_many_unique_and_batches_put_their_blobs(redis_url: str) -> None:
    store = MemoryStore()
    prefix = unique_prefix()
    async with checked(redis_url, prefix, store) as app:
        size = app.tasks["size"]
        many = await size.enqueue_many([{"data": rows(100)} for _ in range(3)])
        unique = await size.options(unique=True).enqueue(rows(150))
        batch: Batch[Any] = await app.batch([size.call(rows(120)), size.call(rows(130))])
        assert len(store.blobs) == 6
        assert not app.codec.claim.pending  # type: ignore[union-attr]
        async with working(app):
            for job in [*many, unique]:
                assert await job.result(timeout=30) > 1000
            info = await batch.wait(timeout=30)
            assert info.state.value == "completed"
        await wait_until(lambda: not store.blobs, what="every blob deleted on completion")


def test_every_payload_marker_starts_with_a_zero_byte() -> None:
    """A worker without signing and encryption reads a payload that does not start with a
    zero byte as it is (Codec.load_job's shortcut): so every layer's marker must."""
    from aioqueue._model import claimcheck, compress, encryption, signing

    markers = (claimcheck.MARKER, compress.MARKER, encryption.FAMILY, signing.FAMILY)
    assert all(m[:1] == b"\x00" for m in markers)
    # a JSON payload never does; a compressed one without the codec's layer is still read
    app = App("redis://127.0.0.1:1/0", compression=Compression(above=10))
    small = app.codec.dump_args("q", "j", "t", (1,), {})
    assert app.codec.load_job("q", "j", "t", small, b"")[:2] == ((1,), {})
    big = app.codec.dump_args("q", "j", "t", ("x" * 100,), {})
    assert big[:1] == b"\x00"
    plain = App("redis://127.0.0.1:1/0").codec  # its reader still inflates it
    assert plain.load_job("q", "j", "t", big, b"")[0] == ("x" * 100,)


def test_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="'zstd' or 'lz4'"):
        App(compression="gzip")
    with pytest.raises(ConfigurationError, match="PayloadStore"):
        App(payload_store=object())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="above"):
        App(payload_store=ClaimCheck(MemoryStore(), above=0))


async def test_the_pull_api_reads_and_removes_claim_checked_payloads(
    redis_url: str, redis: Redis
) -> None:
    prefix, keys, store = place()
    async with checked(redis_url, prefix, store) as app:
        q = app.queue("default")
        job = await app.tasks["size"].enqueue(rows(200))
        key = job_key(prefix, "default", job.id)
        [r] = await q.reserve(1)
        assert r.args == (rows(200),)
        await q.complete(r, 7)
        assert await job.result(timeout=10) == 7
        await wait_until(lambda: key not in store.blobs, what="the blob deleted on complete")
        failing = await app.tasks["size"].enqueue(rows(200))
        fkey = job_key(prefix, "default", failing.id)
        saved = store.blobs[fkey]

        class Down(MemoryStore):
            async def get(self, key: str) -> bytes | None:
                raise ConnectionError("store down")

        app.codec.claim.store = Down()  # type: ignore[union-attr]
        assert await q.reserve(1) == []
        assert await redis.hget(keys.job(failing.id), "s") == b"queued"
        app.codec.claim.store = store  # type: ignore[union-attr]
        [r] = await q.reserve(1)
        assert r.attempt == 1  # the failed read gave its attempt back
        assert store.blobs[fkey] == saved


async def test_a_worker_without_a_store_dead_letters_claim_checked_jobs(
    redis_url: str, redis: Redis
) -> None:
    prefix, keys, store = place()
    async with checked(redis_url, prefix, store) as app:
        job = await app.tasks["size"].enqueue(rows(200))
    async with make_app(redis_url, prefix) as reader, working(reader):
        assert await outcome(redis, keys, job.id) == "failed:MissingPayload"
        info = await reader.queue("default").job(job.id).info()
        assert info.error is not None
        assert "no payload_store" in info.error.message


async def test_the_sweep_spares_a_blob_whose_record_arrives_within_the_grace(
    redis_url: str, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aioqueue._queue import payloads as _claimcheck

    prefix, keys, store = place()
    late, orphan = job_key(prefix, "default", "late"), job_key(prefix, "default", "orphan")
    await store.put(late, b"blob of a job whose enqueue is in flight")
    await store.put(orphan, b"blob of a job that is gone")
    real = _claimcheck._gone
    checks: list[list[str]] = []

    async def gone_then_enqueued(scripts: Any, ids: Any) -> list[str]:
        found = await real(scripts, ids)
        checks.append(found)
        if len(checks) == 1:  # the producer stores the record right after the first check
            await redis.hset(keys.job("late"), "s", "queued")
        return found

    monkeypatch.setattr(_claimcheck, "_gone", gone_then_enqueued)
    async with checked(redis_url, prefix, store) as app:
        deleted, _ = await sweep_payloads(app.queue("default"), grace=0.05)
    assert sorted(checks[0]) == ["late", "orphan"]
    assert checks[1] == ["orphan"]
    assert deleted == 1
    assert late in store.blobs
    assert orphan not in store.blobs


async def test_a_workflow_puts_its_steps_blobs_before_each_part_it_sends(redis_url: str) -> None:
    """A workflow is stored in parts, one round trip in flight while the next is built: each
    part's claim-checked payloads are in the store before its records (a graph of several
    parts, every step's payload large), and every step reads its own back."""
    store = MemoryStore()
    prefix = unique_prefix()
    async with checked(redis_url, prefix, store) as app:
        size = app.tasks["size"]
        n = 3000  # 'adds' holds 500 of these steps a call, a part 4 calls: two parts and more
        wf = app.workflow("claim-checked")
        root = wf.step("root", size.call(rows(100)))
        for i in range(n):
            wf.step(f"s{i}", size.call(rows(100 + i % 3)), after=[root])
        handle = await wf.enqueue()
        assert len(store.blobs) == n + 1
        assert not app.codec.claim.pending  # type: ignore[union-attr]
        async with working(app):
            graph = await handle.graph()
            sinks = graph["sinks"]
            assert len(sinks) == n
            out = await handle.result(timeout=120)
        assert all(v > 1000 for v in out.values()), out
        await wait_until(lambda: not store.blobs, what="every blob deleted on completion")
