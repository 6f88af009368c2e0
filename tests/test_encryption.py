"""Encryption at rest and key rotation (docs/security.md, "Encryption at rest and key rotation").

Real server, real (in-process) workers: payloads and results round-trip encrypted through
``result()``, chains, batches and their callbacks, the pull API and ``job_detail``; Redis holds
no plaintext of the arguments or results; ciphertext tampered with, moved between jobs or
given other options dead-letters the job with the reason; rotation of both keys with
``Queue.rekey()`` and ``python -m aioqueue rekey``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from aioqueue import App, Backoff, BadSignature, Batch, ConfigurationError, DecryptionFailed
from aioqueue._model.keys import QueueKeys

from .support.apps import unique_prefix
from .support.invariants import check_invariants
from .support.prewarmed import run_aioqueue
from .test_signing import outcome, working

pytest.importorskip("cryptography")

ENC_A = "a" * 16 + "-encryption-key-A"
ENC_B = "b" * 16 + "-encryption-key-B"
SIG_A = "s" * 16 + "-signing-key-A"
SIG_B = "t" * 16 + "-signing-key-B"
SECRET = "TOP-SECRET-7f3a9c"  # the marker no record may contain in clear


def make_app(url: str, prefix: str, **options: Any) -> App:
    options.setdefault("max_attempts", 1)
    options.setdefault("backoff", Backoff(base=0.01, factor=1.0, max=0.01, jitter=0.0))
    app = App(url, prefix=prefix, **options)
    ran: list[Any] = []
    app.ran = ran  # type: ignore[attr-defined]

    @app.task
    async def greet(name: str, note: str = "") -> str:
        ran.append(name)
        return f"hello {name} {note}"

    @app.task
    async def double(x: int) -> int:
        return 2 * x

    @app.task(queue="other")
    async def triple(x: int) -> int:
        return 3 * x

    @app.task
    async def take(value: Any, tag: str) -> str:
        return f"{value}{tag}"

    @app.task
    async def collect() -> list[Any]:
        from aioqueue import current_job

        batch = current_job().batch
        assert batch is not None
        return [i.result for i in await batch.results()]

    @app.task
    async def boom(x: str) -> None:
        raise RuntimeError("failing on purpose")

    return app


async def field(redis: Redis, key: str, name: str) -> bytes:
    value = await redis.hget(key, name)
    assert isinstance(value, bytes), (key, name, value)
    return value


async def error_message(redis: Redis, keys: QueueKeys, job_id: str) -> str:
    return str(json.loads(await field(redis, keys.job(job_id), "e"))["message"])


async def raw_values(redis: Redis, prefix: str) -> list[bytes]:
    """Every value stored under ``prefix`` that could hold a payload or a result."""
    out: list[Any] = []
    async for key in redis.scan_iter(match=f"{prefix}:*", count=1000):
        kind = await redis.type(key)
        if kind == b"hash":
            out += list((await redis.hgetall(key)).values())
        elif kind == b"list":
            out += await redis.lrange(key, 0, -1)
        elif kind == b"string":
            out.append(await redis.get(key))
    return [v for v in out if isinstance(v, bytes)]


@pytest.mark.cluster
# ---------------------------------------------------------------------- round trips
@pytest.mark.parametrize("signing", [False, True], ids=["encrypted", "encrypted+signed"])
async def test_payloads_and_results_round_trip_encrypted_and_redis_holds_no_plaintext(
    redis_url: str, redis: Redis, signing: bool
) -> None:
    prefix = unique_prefix()
    extra = {"signing_key": SIG_A} if signing else {}
    app = make_app(redis_url, prefix, encryption_key=ENC_A, **extra)
    async with app:
        q = app.queue()
        greet, d, t, take, collect = (
            app.tasks[n] for n in ("greet", "double", "triple", "take", "collect")
        )
        async with working(app, "default", "other"):
            job = await greet.options(result_ttl=600).enqueue(SECRET, note="n1")
            assert await job.result(timeout=15) == f"hello {SECRET} n1"
            chain = await d.call(4).then(take, SECRET).enqueue()
            assert await chain.result(timeout=15) == f"8{SECRET}"
            across = await t.call(5).then(take, "?").enqueue()  # first step on another queue
            assert await across.result(timeout=15) == "15?"
            batch: Batch[Any] = await app.batch(
                [d.call(1), t.call(2), greet.call(SECRET)], on_complete=collect.call()
            )
            assert batch.callback is not None
            expected = [2, 6, f"hello {SECRET} "]
            assert await batch.callback.result(timeout=15) == expected
            assert [i.result for i in await batch.results()] == expected
        # the pull API: reserve decrypts, complete encrypts
        pulled = await q.enqueue("greet", [SECRET])
        (res,) = await q.reserve(1)
        assert res.args == (SECRET,)
        await q.complete(res, {"secret": SECRET})
        assert await pulled.result(timeout=5) == {"secret": SECRET}
        # job_detail with the key: arguments and result
        detail = await q.job_detail(job.id)
        assert detail.info.encrypted
        assert detail.info.args == (SECRET,)
        assert detail.info.kwargs == {"note": "n1"}
        assert detail.info.garbled == ()
        assert detail.result == f"hello {SECRET} n1"
        # without the key: shown as encrypted, not as garbage
        async with App(redis_url, prefix=prefix, signing_key=extra.get("signing_key")) as keyless:
            blind = await keyless.queue().job_detail(job.id)
            assert blind.info.encrypted
            assert blind.info.args is None
            assert blind.result is None
            assert blind.info.garbled == ()
            with pytest.raises(DecryptionFailed, match="has no encryption_key"):
                await keyless.queue().job(job.id).result(timeout=5)
        await check_invariants(redis, q._keys)
    values = await raw_values(redis, prefix)
    assert values, "nothing stored?"
    assert not [v for v in values if SECRET.encode() in v], "plaintext found in Redis"
    p, r = [await field(redis, q._keys.job(job.id), f) for f in ("p", "r")]
    sealed = b"\x00aqe1"
    assert sealed in p
    assert sealed in r
    assert p.startswith(b"\x00aqs2" if signing else sealed)


async def test_the_cli_job_command_shows_encrypted_values_as_encrypted(
    redis_url: str, redis: Redis
) -> None:
    prefix = unique_prefix()
    app = make_app(redis_url, prefix, encryption_key=ENC_A)
    async with app:
        job = await app.queue().enqueue("greet", [SECRET])
    command = ["job", job.id, "--url", redis_url, "--prefix", prefix]
    proc = await asyncio.to_thread(run_aioqueue, command)
    assert proc.returncode == 0, proc.stderr
    assert "(encrypted)" in proc.stdout
    assert SECRET not in proc.stdout


# ---------------------------------------------------------------------- attacks
@pytest.mark.parametrize("signing", [False, True], ids=["encrypted", "encrypted+signed"])
async def test_tampered_swapped_or_reoptioned_ciphertext_is_dead_lettered_unrun(
    redis_url: str, redis: Redis, signing: bool
) -> None:
    prefix = unique_prefix()
    extra = {"signing_key": SIG_A} if signing else {}
    app = make_app(redis_url, prefix, encryption_key=ENC_A, **extra)
    async with app:
        q = app.queue()
        keys = q._keys
        await q.pause()
        flipped = await q.enqueue("greet", ["flipped"])
        one = await q.enqueue("greet", ["one"])
        two = await q.enqueue("greet", ["two"])
        reopt = await q.enqueue("greet", ["reopt"])
        good = await q.enqueue("greet", ["good"])
        p = bytearray(await field(redis, keys.job(flipped.id), "p"))
        p[-20] ^= 0x01  # one bit of the ciphertext
        await redis.hset(keys.job(flipped.id), "p", bytes(p))
        p1, p2 = (
            await field(redis, keys.job(one.id), "p"),
            await field(redis, keys.job(two.id), "p"),
        )
        await redis.hset(keys.job(one.id), "p", p2)  # swapped between jobs
        await redis.hset(keys.job(two.id), "p", p1)
        await redis.hset(keys.job(reopt.id), "o", json.dumps({"timeout": 1}))  # options added
        await q.resume()
        reason = "failed:BadSignature" if signing else "failed:DecryptionFailed"
        async with working(app):
            for job in (flipped, one, two, reopt):
                assert await outcome(redis, keys, job.id) == reason
            assert await good.result(timeout=15) == "hello good "
        if not signing:
            assert "does not decrypt" in await error_message(redis, keys, flipped.id)
            assert "options changed" in await error_message(redis, keys, reopt.id)
        # a result moved to another job does not decrypt there
        r_good = await field(redis, keys.job(good.id), "r")
        await redis.hset(keys.job(one.id), mapping={"s": "completed", "r": r_good})
        with pytest.raises(BadSignature, match=r"another job's|does not decrypt") as caught:
            await q.job(one.id).result(timeout=5)
        assert isinstance(caught.value, DecryptionFailed) is not signing
    assert app.ran == ["good"]  # type: ignore[attr-defined]


async def test_workers_and_producers_that_disagree_on_encryption_get_typed_errors(
    redis_url: str, redis: Redis
) -> None:
    prefix = unique_prefix()
    sealed = make_app(redis_url, prefix, encryption_key=ENC_A)
    plain = make_app(redis_url, prefix)
    wrong = make_app(redis_url, prefix, encryption_key=ENC_B)
    async with sealed, plain, wrong:
        keys = sealed.queue()._keys
        from_sealed = await sealed.queue().enqueue("greet", ["x"])
        async with working(plain):  # a worker without the key
            assert await outcome(redis, keys, from_sealed.id) == "failed:DecryptionFailed"
        assert "has no encryption_key" in await error_message(redis, keys, from_sealed.id)
        from_plain = await plain.queue().enqueue("greet", ["y"])
        async with working(sealed):  # an encrypting worker meets a plaintext payload
            assert await outcome(redis, keys, from_plain.id) == "failed:DecryptionFailed"
        assert "is not encrypted" in await error_message(redis, keys, from_plain.id)
        # the pull API: reserve dead-letters what it cannot decrypt, and hands out nothing
        pulled = await sealed.queue().enqueue("greet", ["pulled"])
        assert await plain.queue().reserve(1) == []
        assert await outcome(redis, keys, pulled.id) == "failed:DecryptionFailed"
        for_wrong = await sealed.queue().enqueue("greet", ["z"])
        async with working(wrong):  # a worker with another key
            assert await outcome(redis, keys, for_wrong.id) == "failed:DecryptionFailed"
        assert "key not listed" in await error_message(redis, keys, for_wrong.id)
        # results: an encrypted one read without the key, a plaintext one read with it
        async with working(sealed):
            done = await sealed.queue().enqueue("double", [2])
            assert await done.result(timeout=15) == 4
        with pytest.raises(DecryptionFailed, match="has no encryption_key"):
            await plain.queue().job(done.id).result(timeout=5)
        async with working(plain):
            clear = await plain.queue().enqueue("double", [3])
            assert await clear.result(timeout=15) == 6
        with pytest.raises(DecryptionFailed, match="not encrypted"):
            await sealed.queue().job(clear.id).result(timeout=5)
    assert sealed.ran == plain.ran == wrong.ran == []  # type: ignore[attr-defined]


def test_key_options_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="at least 16 bytes"):
        App(encryption_key="short")
    with pytest.raises(ConfigurationError, match="empty list"):
        App(encryption_key=[])
    with pytest.raises(ConfigurationError, match="empty list"):
        App(signing_key=[])
    with pytest.raises(ConfigurationError, match="twice"):
        App(encryption_key=[ENC_A, ENC_A])
    App(signing_key=[SIG_B, SIG_A], encryption_key=[ENC_B, ENC_A])


@pytest.mark.cluster
# ---------------------------------------------------------------------- rotation
async def test_rotation_rekey_and_dropping_the_old_keys(redis_url: str, redis: Redis) -> None:
    """Jobs written with keys A; rotate to [B, A]: workers run old and new jobs; ``rekey``
    seals everything with B; drop A: everything still reads; a job sealed with A alone (after
    the rekey) is dead-lettered with the reason."""
    prefix = unique_prefix()
    old = make_app(redis_url, prefix, encryption_key=ENC_A, signing_key=SIG_A)
    rotating = make_app(
        redis_url, prefix, encryption_key=[ENC_B, ENC_A], signing_key=[SIG_B, SIG_A]
    )
    new = make_app(redis_url, prefix, encryption_key=ENC_B, signing_key=SIG_B)
    async with old, rotating, new:
        q_old, q = old.queue(), rotating.queue()
        keys = q._keys
        # written with A: a completed job (its result), a dead letter, queued and scheduled jobs
        async with working(old):
            finished = await q_old.enqueue("double", [21])
            assert await finished.result(timeout=15) == 42
            dead = await q_old.enqueue("boom", ["x"])
            assert await outcome(redis, keys, dead.id) == "failed:RuntimeError"
            batch: Batch[Any] = await old.batch([old.tasks["double"].call(5)])
            await batch.wait(timeout=15)
            assert [i.result for i in await batch.results()] == [10]
        await q_old.pause()
        scheduled = await q_old.enqueue("greet", ["old-scheduled"], delay=3600)
        ran_before = await q_old.enqueue("greet", ["old-run-by-rotating"])
        new_job = await q.enqueue("greet", ["new"])  # written with B by the rotating app
        await q_old.resume()
        async with working(rotating):  # old and new jobs both run
            # read by an App that accepts B (the worker seals results with B now)
            assert await q.job(ran_before.id).result(timeout=15) == "hello old-run-by-rotating "
            assert await new_job.result(timeout=15) == "hello new "
            assert await q.job(finished.id).result(timeout=5) == 42  # A's result, read
        await q.pause()
        queued_old = await q_old.enqueue("greet", ["old-queued"])  # queued, sealed with A
        report = await q.rekey(batch=3)  # small steps: several SCAN batches
        assert report.unreadable == 0, report
        assert report.changed == 0, report
        # sealed with A: the payloads of finished, dead, the batch's member, queued_old,
        # scheduled and ran_before; the results of finished and of the batch's member (in
        # its record and in the batch); ran_before's result was written with B
        assert report.payloads >= 5
        assert report.results >= 1
        assert report.batch_results == 1
        again = await q.rekey()
        assert (again.payloads, again.results, again.batch_results) == (0, 0, 0)
        assert again.current == report.jobs + 1  # every job, and the batch's result
        # A dropped: everything still reads
        assert await new.queue().job(finished.id).result(timeout=5) == 42
        assert [i.result for i in await Batch(new.queue(), batch.id).results()] == [10]
        info = await new.queue().job_info(scheduled.id)
        assert info.args == ("old-scheduled",)
        assert info.garbled == ()
        # a job sealed with A only, after the rekey: dead-lettered with the reason
        stale = await q_old.enqueue("greet", ["sealed-with-A-only"])
        await q.resume()
        assert await new.queue().requeue([dead.id]) == 1
        async with working(new):
            assert await new.queue().job(queued_old.id).result(timeout=15) == "hello old-queued "
            assert await outcome(redis, keys, dead.id) == "failed:RuntimeError"  # ran again
            assert await outcome(redis, keys, stale.id) == "failed:BadSignature"
        assert "key not accepted here" in await error_message(redis, keys, stale.id)
        await check_invariants(redis, keys)
    assert "sealed-with-A-only" not in new.ran  # type: ignore[attr-defined]
    assert "old-queued" in new.ran  # type: ignore[attr-defined]


async def test_rekey_without_signing_names_a_value_sealed_with_a_dropped_key(
    redis_url: str, redis: Redis
) -> None:
    prefix = unique_prefix()
    old = make_app(redis_url, prefix, encryption_key=ENC_A)
    new = make_app(redis_url, prefix, encryption_key=ENC_B)
    async with old, new:
        await old.queue().pause()
        lost = await old.queue().enqueue("greet", ["lost"])
        report = await new.queue().rekey()
        assert (report.jobs, report.unreadable, report.payloads) == (1, 1, 0)
        assert report.reasons
        assert "key not listed" in report.reasons[0]
        assert lost.id in report.reasons[0]
        await new.queue().resume()
        async with working(new):
            assert await outcome(redis, new.queue()._keys, lost.id) == "failed:DecryptionFailed"


async def test_rekey_does_not_clobber_a_record_changed_meanwhile(
    redis_url: str, redis: Redis
) -> None:
    """rekey.lua writes an entry only if every value it replaces is the one read."""
    prefix = unique_prefix()
    app = make_app(redis_url, prefix, encryption_key=ENC_A)
    async with app:
        q = app.queue()
        await q.pause()
        job = await q.enqueue("greet", ["x"])
        key = q._keys.job(job.id)
        stored = await redis.hget(key, "p")
        sub = f"job:{job.id}"
        run = q._scripts.run
        base = q._scripts.base
        res = await run("rekey", (base, sub, 1, "p", b"not what is stored", b"NEW"))
        assert list(res) == [0, 1]
        assert await redis.hget(key, "p") == stored
        res = await run("rekey", (base, "job:missing", 1, "p", stored, b"NEW"))
        assert list(res) == [0, 1]
        assert not await redis.exists(q._keys.job("missing"))
        res = await run("rekey", (base, sub, 1, "p", stored, b"NEW"))
        assert list(res) == [1, 0]
        assert await redis.hget(key, "p") == b"NEW"


async def test_the_rekey_command(redis_url: str, redis: Redis, tmp_path: Path) -> None:
    prefix = unique_prefix()
    (tmp_path / "rekeyapp.py").write_text(
        textwrap.dedent(
            f"""
            from aioqueue import App
            app = App(prefix={prefix!r}, encryption_key=[{ENC_B!r}, {ENC_A!r}],
                      signing_key=[{SIG_B!r}, {SIG_A!r}])
            """
        )
    )
    old = make_app(redis_url, prefix, encryption_key=ENC_A, signing_key=SIG_A)
    async with old:
        await old.queue().pause()
        jobs = [await old.queue().enqueue("greet", [f"n{i}"]) for i in range(5)]
        await old.queue("other").pause()
        await old.queue("other").enqueue("triple", [1])
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "aioqueue",
                "rekey",
                "rekeyapp:app",
                "--url",
                redis_url,
                *list(extra),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=tmp_path,
        )

    async def cli(*extra: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(run, *extra)

    proc = await cli("--json")
    assert proc.returncode == 0, proc.stderr
    reports = {r["queue"]: r for r in json.loads(proc.stdout)["queues"]}
    assert reports["default"]["payloads"] == 5
    assert reports["other"]["payloads"] == 1
    proc = await cli("-q", "default")
    assert proc.returncode == 0, proc.stderr
    assert "0 payloads" in proc.stdout
    assert "5 already current" in proc.stdout
    new = make_app(redis_url, prefix, encryption_key=ENC_B, signing_key=SIG_B)
    async with new:
        await new.queue().resume()
        async with working(new):
            got = [await new.queue().job(j.id).result(timeout=15) for j in jobs]
            assert got == [f"hello n{i} " for i in range(5)]
    # a value no listed key reads: exit 1, and it is named
    await redis.hset(QueueKeys(prefix, "default").job(jobs[0].id), "r", b"\x00aqs2" + b"0" * 40)
    proc = await cli("-q", "default")
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert jobs[0].id in proc.stdout


async def test_rekey_while_a_worker_drains_the_queue_loses_nothing(
    redis_url: str, redis: Redis
) -> None:
    """Workers finishing jobs (writing results with B) while ``rekey`` rewrites the same
    records: every result reads with B alone afterwards, none is replaced by a stale one."""
    prefix = unique_prefix()
    old = make_app(redis_url, prefix, encryption_key=ENC_A)
    rotating = make_app(redis_url, prefix, encryption_key=[ENC_B, ENC_A])
    new = make_app(redis_url, prefix, encryption_key=ENC_B)
    async with old, rotating, new:
        jobs = await old.tasks["double"].enqueue_many([{"x": i} for i in range(300)])
        async with working(rotating):
            reports = [await rotating.queue().rekey(batch=20) for _ in range(2)]
            for job in jobs:
                await rotating.queue().job(job.id).result(timeout=30)
        report = await rotating.queue().rekey()
        assert report.unreadable == 0, (reports, report)
        assert report.payloads == 0, report  # every payload is now sealed with B
        got = [await new.queue().job(j.id).result(timeout=5) for j in jobs]
        assert got == [2 * i for i in range(300)]
