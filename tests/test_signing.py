"""Signing covers everything a worker or a producer trusts (docs/security.md, I9's last part).

Each attack is made the way someone who can write to Redis (but has no key) would: by editing
the records of genuine, signed jobs, batches and results with plain Redis commands. Code run
by a planted pickle is detected by the file its unpickling creates; a wrong input by what the
task was called with.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import pathlib
import pickle
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from aioqueue import App, Backoff, BadSignature, Batch, ConfigurationError, JobState, Worker
from aioqueue._model.keys import QueueKeys
from aioqueue._model.signing import Signer, _Hmac

from .support.apps import unique_prefix
from .support.invariants import check_invariants
from .support.waiting import wait_until

KEY = "k" * 16 + "-current-signing-key"
OTHER_KEY = "x" * 16 + "-someone-elses-key"


class Touch:
    """Unpickling this creates a file: proof that code ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (pathlib.Path.touch, (pathlib.Path(self.path),))


@dataclass
class Bank:
    """An App whose tasks record what they were called with."""

    app: App
    paid: list[tuple[int, str]] = field(default_factory=list)
    seen: list[Any] = field(default_factory=list)

    @property
    def keys(self) -> QueueKeys:
        return self.app.queue()._keys


def bank(url: str, prefix: str | None = None, **options: Any) -> Bank:
    options.setdefault("signing_key", KEY)
    options.setdefault("max_attempts", 1)
    options.setdefault("backoff", Backoff(base=0.01, factor=1.0, max=0.01, jitter=0.0))
    app = App(url, prefix=prefix or unique_prefix(), **options)
    b = Bank(app)

    @app.task
    async def pay(amount: int, who: str) -> str:
        b.paid.append((amount, who))
        return f"paid {amount} to {who}"

    @app.task
    async def double(x: int) -> int:
        return 2 * x

    @app.task
    async def take(value: Any, tag: str) -> str:
        b.seen.append(value)
        return f"{value}{tag}"

    @app.task(queue="other")
    async def triple(x: int) -> int:
        return 3 * x

    @app.task
    async def collect() -> list[Any]:
        from aioqueue import current_job

        batch = current_job().batch
        assert batch is not None
        values = [i.result for i in await batch.results()]
        b.seen.append(values)
        return values

    return b


@contextlib.asynccontextmanager
async def working(app: App, *queues: str) -> AsyncIterator[Worker]:
    qs = list(queues) or [app.default_queue]
    async with Worker(app, queues=qs, concurrency=4, idle_block=0.1, grace=1) as worker:
        yield worker


async def outcome(redis: Redis, keys: QueueKeys, job_id: str, timeout: float = 15.0) -> str:
    """Wait until the job has finished: ``completed`` or ``<state>:<reason type>``."""
    seen: list[Any] = [None, None]

    async def done() -> bool:
        seen[:] = await redis.hmget(keys.job(job_id), ["s", "e"])
        return seen[0] in (b"completed", b"failed", b"cancelled")

    await wait_until(done, timeout=timeout, what=f"job {job_id} to finish: {seen}")
    if seen[0] == b"completed":
        return "completed"
    return f"{seen[0].decode()}:{json.loads(seen[1])['type']}"


async def plant_fake_batch(
    redis: Redis, keys: QueueKeys, job_id: str, result: bytes, bid: str = "fake"
) -> None:
    """Point a job's options at a batch of the attacker's making, whose one result is
    ``result``: the job then runs as a chain step fed that result."""
    opts = json.dumps({"batch": bid, "bq": keys.queue, "chain": 1})
    await redis.hset(keys.job(job_id), "o", opts)
    await redis.zadd(keys.batch(bid) + ":all", {"m": 0})
    await redis.hset(keys.batch(bid) + ":res", "m", result)


async def copy_fields(redis: Redis, source: str, target: str, *fields: str) -> None:
    """Copy fields of one job hash into another, byte for byte."""
    values = await redis.hmget(source, list(fields))
    await redis.hset(target, mapping={f: v for f, v in zip(fields, values, strict=True) if v})


# ---------------------------------------------------------------------- the reported attacks
async def test_a_pickle_planted_in_a_fake_batch_never_runs_in_the_worker(
    redis_url: str, redis: Redis, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned-worker"
    b = bank(redis_url, serializer="pickle")
    async with b.app:
        q = b.app.queue()
        await q.pause()
        job = await q.enqueue("pay", [11, "alice"])
        await plant_fake_batch(redis, b.keys, job.id, pickle.dumps(Touch(marker)))
        await q.resume()
        async with working(b.app):
            assert await outcome(redis, b.keys, job.id) == "failed:BadSignature"
            assert await (await q.enqueue("pay", [1, "bob"])).result(timeout=10) == "paid 1 to bob"
    assert not marker.exists(), "the planted pickle ran in the worker"
    assert b.paid == [(1, "bob")]


async def test_a_pickled_result_planted_in_a_job_never_runs_in_the_producer(
    redis_url: str, redis: Redis, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned-producer"
    b = bank(redis_url, serializer="pickle")
    async with b.app:
        job = await b.app.queue().enqueue("pay", [11, "alice"])
        await redis.hset(
            b.keys.job(job.id), mapping={"s": "completed", "r": pickle.dumps(Touch(marker))}
        )
        with pytest.raises(BadSignature, match="not signed"):
            await job.result(timeout=5)
    assert not marker.exists(), "the planted pickle ran in the producer"


async def test_options_pointing_at_a_fake_batch_cannot_change_a_jobs_arguments(
    redis_url: str, redis: Redis
) -> None:
    b = bank(redis_url)  # JSON
    async with b.app:
        q = b.app.queue()
        await q.pause()
        job = await q.enqueue("pay", [11, "alice"])
        await plant_fake_batch(redis, b.keys, job.id, b"999999")
        await q.resume()
        async with working(b.app):
            assert await outcome(redis, b.keys, job.id) == "failed:BadSignature"
        info = await job.info()
        assert info.error is not None
        assert "options" in info.error.message
    assert b.paid == []  # never pay(999999, "alice"), nor pay(11, ...) with forged options


async def test_a_signed_job_copied_to_another_queue_does_not_run_there(
    redis_url: str, redis: Redis
) -> None:
    b = bank(redis_url)
    async with b.app:
        home, other = b.app.queue(), b.app.queue("copies")
        await home.pause()
        job = await home.enqueue("pay", [11, "alice"])
        await other.pause()
        copy = await other.enqueue("pay", [0, "nobody"], job_id=job.id)  # the same id there
        await copy_fields(redis, b.keys.job(job.id), other._keys.job(copy.id), "t", "p")
        await other.resume()
        async with working(b.app, "copies"):
            assert await outcome(redis, other._keys, copy.id) == "failed:BadSignature"
        assert b.paid == []
        await home.resume()
        async with working(b.app):
            assert await job.result(timeout=10) == "paid 11 to alice"  # in its own place
    assert b.paid == [(11, "alice")]


async def test_a_signed_job_copied_to_another_prefix_does_not_run_there(
    redis_url: str, redis: Redis
) -> None:
    ours, theirs = bank(redis_url), bank(redis_url)  # two apps, one key, two prefixes
    async with ours.app, theirs.app:
        await ours.app.queue().pause()
        job = await ours.app.queue().enqueue("pay", [11, "alice"])
        q = theirs.app.queue()
        await q.pause()
        copy = await q.enqueue("pay", [0, "nobody"], job_id=job.id)
        await copy_fields(redis, ours.keys.job(job.id), theirs.keys.job(copy.id), "t", "p")
        await q.resume()
        async with working(theirs.app):
            assert await outcome(redis, theirs.keys, copy.id) == "failed:BadSignature"
    assert theirs.paid == []


# ---------------------------------------------------------------------- tampered fields
async def test_tampered_or_added_options_are_refused_by_workers_and_the_pull_api(
    redis_url: str, redis: Redis
) -> None:
    b = bank(redis_url)
    async with b.app:
        q = b.app.queue()
        await q.pause()
        slow = await b.app.tasks["pay"].options(timeout=30).enqueue(1, "a")
        plain = await q.enqueue("pay", [2, "b"])
        await redis.hset(b.keys.job(slow.id), "o", json.dumps({"timeout": 0.001}))
        await redis.hset(b.keys.job(plain.id), "o", json.dumps({"result_ttl": 0}))
        good = await q.enqueue("pay", [4, "d"])
        await q.resume()
        async with working(b.app):
            for job in (slow, plain):
                assert await outcome(redis, b.keys, job.id) == "failed:BadSignature"
            assert await good.result(timeout=10) == "paid 4 to d"
        # the pull API: options moved from another job are refused too
        src = await b.app.tasks["pay"].options(timeout=30).enqueue(5, "e")
        other = await q.enqueue("pay", [3, "c"])
        await redis.hset(b.keys.job(other.id), "o", await redis.hget(b.keys.job(src.id), "o"))
        assert [r.id for r in await q.reserve(5)] == [src.id]
        assert await outcome(redis, b.keys, other.id) == "failed:BadSignature"
    assert sorted(b.paid) == [(4, "d")]


async def test_a_tampered_or_moved_result_raises_bad_signature(
    redis_url: str, redis: Redis
) -> None:
    b = bank(redis_url)
    async with b.app:
        q = b.app.queue()
        async with working(b.app):
            one = await q.enqueue("double", [21])
            two = await q.enqueue("double", [5])
            assert await one.result(timeout=10) == 42
            assert await two.result(timeout=10) == 10
        r = await redis.hget(b.keys.job(one.id), "r")
        assert isinstance(r, bytes)
        assert r.endswith(b"42")
        await redis.hset(b.keys.job(one.id), "r", r[:-2] + b"99")  # tampered
        with pytest.raises(BadSignature, match="does not match"):
            await one.result(timeout=5)
        await redis.hset(b.keys.job(two.id), "r", r)  # another job's genuine result
        with pytest.raises(BadSignature):
            await two.result(timeout=5)
        await redis.hset(b.keys.job(two.id), "r", b"10")  # unsigned
        with pytest.raises(BadSignature, match="not signed"):
            await two.result(timeout=5)
        # a job's genuine signed payload is not a result (each MAC names its field)
        payload = await redis.hget(b.keys.job(one.id), "p")
        await redis.hset(b.keys.job(two.id), "r", payload)
        with pytest.raises(BadSignature):
            await two.result(timeout=5)


async def test_a_tampered_batch_result_raises_bad_signature(redis_url: str, redis: Redis) -> None:
    b = bank(redis_url)
    async with b.app:
        d, t = b.app.tasks["double"], b.app.tasks["triple"]
        batch: Batch[Any] = await b.app.batch([d.call(1), d.call(2), t.call(3)])
        async with working(b.app, "default", "other"):
            await batch.wait(timeout=15)
        assert [i.result for i in await batch.results()] == [2, 4, 9]
        res = b.keys.batch(batch.id) + ":res"
        first = (await batch.results())[0].job.id  # a member on the home queue: its id
        value = await redis.hget(res, first)
        assert isinstance(value, bytes)
        await redis.hset(res, first, value[:-1] + b"7")
        with pytest.raises(BadSignature):
            await batch.results()


async def test_another_jobs_genuine_result_is_not_a_chain_steps_input(
    redis_url: str, redis: Redis
) -> None:
    """The gap of an earlier attempt: results bound only to their job let an attacker make
    another job a member of a chain's batch, and feed its genuine result to the next step."""
    b = bank(redis_url)
    async with b.app:
        q = b.app.queue()
        async with working(b.app):
            x = await q.enqueue("double", [500])
            assert await x.result(timeout=10) == 1000
        d, take = b.app.tasks["double"], b.app.tasks["take"]
        await q.pause()
        step = await d.call(4).then(take, "!").enqueue()
        # the chain's batch: the one its second step's (signed) options name
        opts = json.loads(await redis.hget(b.keys.job(step.id), "o") or b"{}")
        bk = b.keys.batch(opts["batch"])
        await redis.zadd(bk + ":all", {x.id: 0})  # before the genuine first step
        await redis.hset(bk + ":res", x.id, await redis.hget(b.keys.job(x.id), "r") or b"")
        await q.resume()
        async with working(b.app):
            assert await outcome(redis, b.keys, step.id) == "failed:BadSignature"
    assert b.seen == []  # take() never ran, with 1000 or anything else


async def test_results_of_an_old_signature_format_get_a_clear_error(
    redis_url: str, redis: Redis
) -> None:
    b = bank(redis_url)
    async with b.app:
        q = b.app.queue()
        await q.pause()
        job = await q.enqueue("pay", [1, "a"])
        await redis.hset(b.keys.job(job.id), "p", b"\x00aqs1" + b"m" * 32 + b'[[1,"a"],{}]')
        await q.resume()
        async with working(b.app):
            assert await outcome(redis, b.keys, job.id) == "failed:BadSignature"
        info = await job.info()
        assert info.error is not None
        assert "old signature" in info.error.message
        assert b.paid == []


# ---------------------------------------------------------------------- what still works
@pytest.mark.parametrize("serializer", ["json", "pickle"])
async def test_signed_jobs_chains_and_batches_work(
    redis_url: str, redis: Redis, serializer: str
) -> None:
    b = bank(redis_url, serializer=serializer)
    async with b.app:
        d, t, take, collect = (b.app.tasks[n] for n in ("double", "triple", "take", "collect"))
        async with working(b.app, "default", "other"):
            job = await b.app.tasks["pay"].options(timeout=10, result_ttl=60).enqueue(7, "eve")
            assert await job.result(timeout=10) == "paid 7 to eve"
            chain = await d.call(4).then(take, "!").enqueue()
            assert await chain.result(timeout=15) == "8!"
            across = await t.call(5).then(take, "?").enqueue()  # first step on another queue
            assert await across.result(timeout=15) == "15?"
            batch = await b.app.batch([d.call(1), t.call(2), d.call(3)], on_complete=collect.call())
            assert batch.callback is not None
            assert await batch.callback.result(timeout=15) == [2, 6, 6]
            assert [i.result for i in await batch.results()] == [2, 6, 6]
            many = await d.enqueue_many([{"x": i} for i in range(20)])
            assert [await j.result(timeout=15) for j in many] == [2 * i for i in range(20)]
        assert b.seen == [8, 15, [2, 6, 6]]
        await check_invariants(redis, b.keys)


async def test_the_pull_api_signs_results_it_completes(redis_url: str, redis: Redis) -> None:
    b = bank(redis_url)
    async with b.app:
        q = b.app.queue()
        job = await q.enqueue("pay", [3, "c"])
        (res,) = await q.reserve(1)
        await q.complete(res, {"ok": True})
        assert await job.result(timeout=5) == {"ok": True}
        stored = await redis.hget(b.keys.job(job.id), "r")
        assert isinstance(stored, bytes)
        assert stored.startswith(b"\x00aqs2")


async def test_an_app_without_the_key_cannot_read_signed_results(
    redis_url: str, redis: Redis
) -> None:
    prefix = unique_prefix()
    signed = bank(redis_url, prefix)
    plain = bank(redis_url, prefix, signing_key=None)
    async with signed.app, plain.app:
        async with working(signed.app):
            job = await signed.app.queue().enqueue("double", [2])
            assert await job.result(timeout=10) == 4
        with pytest.raises(BadSignature, match="no signing_key"):
            await plain.app.queue().job(job.id).result(timeout=5)


# ---------------------------------------------------------------------- pickle and keys
def test_pickle_without_a_signing_key_is_refused_unless_forced(redis_url: str) -> None:
    with pytest.raises(ConfigurationError, match="allow_unsigned_pickle"):
        App(redis_url, serializer="pickle")
    App(redis_url, serializer="pickle", signing_key=KEY)
    App(redis_url, serializer="pickle", allow_unsigned_pickle=True)


def test_every_mac_is_bound_to_prefix_queue_job_task_and_field() -> None:
    s = Signer(KEY, prefix="aq")
    data = s.sign_payload("q", "1", "t", b"{}", b"[[],{}]")
    assert s.verify_payload("q", "1", "t", b"{}", data) == b"[[],{}]"
    rotated = Signer(OTHER_KEY, [KEY], prefix="aq")
    assert rotated.verify_payload("q", "1", "t", b"{}", data) == b"[[],{}]"
    for other in (
        (Signer(KEY, prefix="aq2"), ("q", "1", "t", b"{}")),
        (s, ("q2", "1", "t", b"{}")),
        (s, ("q", "2", "t", b"{}")),
        (s, ("q", "1", "t2", b"{}")),
        (s, ("q", "1", "t", b"")),
        (Signer(OTHER_KEY, prefix="aq"), ("q", "1", "t", b"{}")),
    ):
        signer, (queue, job_id, task, options) = other
        with pytest.raises(BadSignature):
            signer.verify_payload(queue, job_id, task, options, data)
    result = s.sign_result("q", "1", "t", ("home", "b1"), b"42")
    got = s.verify_result("q", "1", result)
    assert (got.task, got.batch_queue, got.batch_id, got.data) == ("t", "home", "b1", b"42")
    for signer, queue, job_id in (
        (s, "q", "2"),
        (s, "q2", "1"),
        (Signer(KEY, prefix="x"), "q", "1"),
    ):
        with pytest.raises(BadSignature):
            signer.verify_result(queue, job_id, result)
    with pytest.raises(BadSignature):  # a payload is not a result
        s.verify_result("q", "1", data)
    for garbage in (
        b"",
        b"\x00aqs2",
        b"\x00aqs2" + b"m" * 32 + b"99999:x",
        b"\x00aqs2" + b"m" * 40,
    ):
        with pytest.raises(BadSignature):
            s.verify_result("q", "1", garbage)


@pytest.mark.parametrize("size", [16, 63, 64, 65, 200])
def test_the_precomputed_hmac_is_hmac_sha256(size: int) -> None:
    key = bytes(range(256))[:size]
    for msg in (b"", b"x", b"m" * 1000):
        assert _Hmac(key).digest(msg) == hmac.digest(key, msg, "sha256")


async def test_a_chain_step_whose_input_was_deleted_does_not_run_without_it(
    redis_url: str, redis: Redis
) -> None:
    b = bank(redis_url)
    async with b.app:
        # the first step on queue "other", the second on the default queue: run one, then the
        # other, and delete the first step's result between the two
        step = await b.app.tasks["triple"].call(4).then(b.app.tasks["take"], "!").enqueue()
        opts = json.loads(await redis.hget(b.keys.job(step.id), "o") or b"{}")
        bk = b.keys.batch(opts["batch"])

        async def first_done() -> bool:
            return await redis.hget(bk, "s") == b"completed"

        async with working(b.app, "other"):
            await wait_until(first_done, timeout=15, what="the first step to finish")
        assert await step.state() is JobState.QUEUED
        await redis.delete(bk + ":all", bk + ":res")
        async with working(b.app):
            assert await outcome(redis, b.keys, step.id) == "failed:MissingInput"
    assert b.seen == []  # take() never ran with None for its input


GARBAGE = [b"", b"\x00aqs2", b"\x00aqs2" + b"\xff" * 40, b"\xff\xfe", b"{}", b"null", b"\x00aqs9x"]


async def test_garbage_in_signed_fields_is_refused_and_the_worker_carries_on(
    redis_url: str, redis: Redis
) -> None:
    b = bank(redis_url)
    async with b.app:
        q = b.app.queue()
        await q.pause()
        jobs = []
        for value in GARBAGE:
            for name in ("p", "o"):
                if name == "o" and not value:
                    continue  # no options is what was signed: an empty field is the same
                job = await q.enqueue("pay", [1, "x"])
                await redis.hset(b.keys.job(job.id), name, value)
                jobs.append(job)
        await q.resume()
        async with working(b.app):
            for job in jobs:
                assert await outcome(redis, b.keys, job.id) == "failed:BadSignature", job
            done = await q.enqueue("double", [1])
            assert await done.result(timeout=10) == 2
        for value in GARBAGE:
            await redis.hset(b.keys.job(done.id), "r", value)
            with pytest.raises(BadSignature):
                await done.result(timeout=5)
        await check_invariants(redis, b.keys)
    assert b.paid == []


# ---------------------------------------------------------------------- workflows (issue 27)
async def test_a_planted_dependency_result_is_refused_by_the_dependent(
    redis_url: str, redis: Redis, tmp_path: Path
) -> None:
    """A dependency's result replaced (a pickle that would run code, another job's genuine
    result, an unsigned value) before its dependent reads it: ``dependency_results`` raises
    BadSignature, the dependent is dead-lettered and never acts on it, and nothing in the
    planted pickle runs."""
    marker = tmp_path / "pwned-dependent"
    b = bank(redis_url, serializer="pickle")
    acted: list[Any] = []

    @b.app.task
    async def spend() -> str:
        from aioqueue import current_job

        results = await current_job().dependency_results()
        acted.append(results)
        return "spent"

    async with b.app:
        q = b.app.queue()
        planted = {
            "pickle": pickle.dumps(Touch(marker)),
            "unsigned": pickle.dumps(7),
            "moved": None,  # another job's genuine signed result
        }
        other = await q.enqueue("double", [50])
        [r] = await q.reserve(1)
        await q.complete(r, 100)
        genuine = await redis.hget(b.keys.job(other.id), "r")
        dependents, pairs = {}, {}
        for label in planted:
            dep = await q.enqueue("double", [1])
            gate = await q.enqueue("double", [2])
            dependents[label] = await spend.options(depends_on=[dep, gate]).enqueue()
            pairs[label] = (dep.id, gate.id)
        held = {r.id: r for r in await q.reserve(2 * len(planted))}
        assert len(held) == 2 * len(planted)
        for label, value in planted.items():
            dep_id, gate_id = pairs[label]
            await q.complete(held[dep_id], 2)
            bad = genuine if value is None else value
            await redis.hset(b.keys.job(dep_id), "r", bad)
            # and the copy kept for the dependent ("<task>\0<result>"), which it reads first
            kept = b.keys.dep_results(dependents[label].id)
            members = [m for m in await redis.hkeys(kept) if dep_id.encode() in m]
            assert len(members) == 1  # kept when the dependency completed
            was = await redis.hget(kept, members[0])
            assert isinstance(was, bytes)
            assert isinstance(bad, bytes)
            await redis.hset(kept, members[0], was.partition(b"\0")[0] + b"\0" + bad)
            await q.complete(held[gate_id], 4)  # the last dependency: the dependent is released
        async with working(b.app):
            for label, job in dependents.items():
                assert await outcome(redis, b.keys, job.id) == "failed:BadSignature", label
        await check_invariants(redis, b.keys)
    assert acted == []
    assert not marker.exists(), "the planted pickle ran in the dependent's worker"
