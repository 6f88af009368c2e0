"""Durable steps (issue 27, point 4): ``ctx.step`` records a step's result under the job, only
by the current lease holder; a later run returns the recorded result without running the step;
names are unique per run; the record lives and dies with the job (I8); on a signing or
encrypting app it is sealed for its place, and a planted record runs nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

from aioqueue import App, Backoff, DuplicateStep, JobFailed, JobState, Worker, current_job
from aioqueue._model.keys import QueueKeys
from aioqueue._model.sealed import seal_value

from .stepapp import Keys
from .support.apps import open_app
from .support.server import text
from .support.waiting import wait_until

FAST = Backoff(base=0.01, jitter=0.0)
SIGNING = "s" * 32


async def _execs(redis: Redis, app: App) -> dict[str, int]:
    raw = await redis.hgetall(Keys(app.prefix).execs)
    return {text(k): int(v) for k, v in raw.items()}


@pytest.mark.cluster
async def test_a_retried_job_does_not_run_its_completed_steps_again(app: App, redis: Redis) -> None:
    fails = {"left": 1}
    execs = Keys(app.prefix).execs

    @app.task(max_attempts=3, backoff=FAST)
    async def flaky(order_id: str) -> list[Any]:
        ctx = current_job()
        a = await ctx.step("reserve", lambda: f"reserved {order_id}")
        b = await ctx.step("charge", _count, redis, execs, ctx.id, "charge")
        if fails["left"]:
            fails["left"] -= 1
            raise ConnectionError("the notify service is down")
        return [a, b]

    async with Worker(app, concurrency=2, grace=2):
        job = await flaky.enqueue("o-1")
        result = await job.result(timeout=30)
    assert result == ["reserved o-1", 1]  # recorded on attempt 1, returned on attempt 2
    assert (await job.info()).attempts == 2
    assert await _execs(redis, app) == {f"{job.id}:charge": 1}


async def _count(redis: Redis, key: str, job_id: str, step: str) -> int:
    return int(await redis.hincrby(key, f"{job_id}:{step}", 1))


async def test_a_sync_step_function_and_a_tuple_come_back_the_same_every_run(app: App) -> None:
    seen: list[Any] = []

    @app.task(max_attempts=2, backoff=FAST)
    async def t() -> None:
        value = await current_job().step("pair", lambda: (1, "x"))
        seen.append(value)
        if current_job().attempt == 1:
            raise ValueError("again")

    async with Worker(app, concurrency=1, grace=2):
        job = await t.enqueue()
        await job.result(timeout=30)
    assert seen == [[1, "x"], [1, "x"]]  # JSON's form, in the first run too


async def test_a_step_name_used_twice_in_one_run_is_a_typed_error(app: App) -> None:
    @app.task(max_attempts=1)
    async def twice() -> None:
        ctx = current_job()
        await ctx.step("a", lambda: 1)
        await ctx.step("a", lambda: 2)

    async with Worker(app, concurrency=1, grace=2):
        job = await twice.enqueue()
        with pytest.raises(JobFailed) as failed:
            await job.result(timeout=30)
    assert failed.value.error_type == "DuplicateStep"
    assert issubclass(DuplicateStep, ValueError)


@pytest.mark.cluster
async def test_a_stale_lease_holders_step_write_is_refused(app: App, redis: Redis) -> None:
    @app.task
    async def held() -> None:
        return None

    q = app.queue()
    job = await held.enqueue()
    (first,) = await q.reserve(lease=0.2)
    scripts = q._scripts
    assert (await scripts.step(job.id, first.token, "s", b"v1"))[0] == 1
    # the lease runs out and the job is handed to another consumer: a new token
    second: list[Any] = []

    async def leased_again() -> bool:
        second.extend(await q.reserve(lease=30))
        return bool(second)

    deadline = asyncio.get_running_loop().time() + 20
    while not await leased_again():
        assert asyncio.get_running_loop().time() < deadline, "the job was not leased again"
        await asyncio.sleep(0.05)
    assert second[0].token != first.token
    assert await scripts.step(job.id, first.token, "t", b"stale") == [-2]  # refused
    assert await scripts.step(job.id, first.token, "s", None) == [-2]
    assert await redis.hget(QueueKeys(app.prefix, "default").steps(job.id), "s:t") is None
    assert await scripts.step(job.id, second[0].token, "s", None) == [1, b"v1"]
    assert await scripts.step("no-such-job", second[0].token, "s", None) == [-1]


@pytest.mark.parametrize("result_ttl", [0.0, 60.0])
async def test_the_step_record_lives_and_dies_with_the_job(
    redis: Redis, redis_url: str, result_ttl: float
) -> None:
    async with open_app(redis_url, result_ttl=result_ttl) as app:

        @app.task
        async def one() -> int:
            current_job().log("hello")
            return int(await current_job().step("s", lambda: 5))

        k = QueueKeys(app.prefix, "default")
        async with Worker(app, concurrency=1, grace=2):
            job = await one.enqueue()
            if result_ttl == 0:  # no result kept: wait for the record to go

                async def gone() -> bool:
                    return not await redis.exists(k.job(job.id))

                await wait_until(gone, timeout=30, what="the job's record removed")
            else:
                assert await job.result(timeout=30) == 5
        if result_ttl == 0:
            assert not await redis.exists(k.job(job.id), k.steps(job.id), k.job_log(job.id))
        else:
            for key in (k.job(job.id), k.steps(job.id), k.job_log(job.id)):
                ttl = await redis.pttl(key)
                assert 0 < ttl <= 60_000, key
            await app.queue().purge(job_ids=[job.id])
            assert not await redis.exists(k.job(job.id), k.steps(job.id), k.job_log(job.id))


async def test_dead_letters_and_cancelled_jobs_keep_their_steps_as_long_as_their_record(
    redis: Redis, redis_url: str
) -> None:
    async with open_app(redis_url, dead_ttl=120) as app:

        @app.task(max_attempts=1)
        async def doomed() -> None:
            await current_job().step("s", lambda: 1)
            raise ValueError("no")

        async with Worker(app, concurrency=1, grace=2):
            job = await doomed.enqueue()
            with pytest.raises(JobFailed):
                await job.result(timeout=30)
        k = QueueKeys(app.prefix, "default")
        assert 0 < await redis.pttl(k.steps(job.id)) <= 120_000
        # an operator's requeue gives the record its life back: the steps follow
        await app.queue().requeue([job.id])
        assert await redis.pttl(k.steps(job.id)) == -1
        assert await redis.pttl(k.job(job.id)) == -1


async def test_steps_of_an_earlier_job_with_the_same_id_are_not_read(
    app: App, redis: Redis
) -> None:
    @app.task
    async def fresh() -> int:
        return int(await current_job().step("s", lambda: 7))

    k = QueueKeys(app.prefix, "default")
    # left over by a job of that id whose record was removed behind the scripts' back
    planted = seal_value(app.codec, ("default", "j1", "fresh"), "st", "s", 999)
    await redis.hset(k.steps("j1"), mapping={"ct": "1", "s:s": planted})
    async with Worker(app, concurrency=1, grace=2):
        job = await fresh.options(job_id="j1").enqueue()
        assert await job.result(timeout=30) == 7


@pytest.mark.parametrize("keys", [{"signing_key": SIGNING}, {"encryption_key": "e" * 32}])
async def test_sealed_steps_round_trip_and_a_planted_record_runs_nothing(
    redis: Redis, redis_url: str, keys: dict[str, str]
) -> None:
    pytest.importorskip("cryptography") if "encryption_key" in keys else None
    async with open_app(redis_url, **keys) as app:
        ran: list[str] = []

        @app.task(max_attempts=2, backoff=FAST)
        async def sealed(tag: str) -> str:
            ctx = current_job()

            def make() -> str:
                ran.append(tag)
                return f"made {tag}"

            value = str(await ctx.step("s", make))
            if tag == "retry" and ctx.attempt == 1:
                raise ValueError("again")
            return value

        async with Worker(app, concurrency=1, grace=2):
            ok = await sealed.enqueue("retry")
            assert await ok.result(timeout=30) == "made retry"
            assert ran == ["retry"]
            stored = await redis.hget(QueueKeys(app.prefix, "default").steps(ok.id), "s:s")
            assert (stored is not None and b"made retry" not in stored) or "signing_key" in keys
            # a record planted by someone without the key (or moved from another job)
            job = await sealed.options(delay=60).enqueue("planted")
            ct = await redis.hget(QueueKeys(app.prefix, "default").job(job.id), "ct")
            assert ct is not None
            assert stored is not None
            await redis.hset(
                QueueKeys(app.prefix, "default").steps(job.id), mapping={"ct": ct, "s:s": stored}
            )
            await app.queue().promote([job.id])
            with pytest.raises(JobFailed) as failed:
                await job.result(timeout=30)
        assert failed.value.error_type in ("BadSignature", "DecryptionFailed")
        assert ran == ["retry"]  # the planted record was not run past, nor the step re-run
        assert (await job.info()).state is JobState.FAILED


def test_a_step_key_is_stable_and_tells_steps_and_jobs_apart() -> None:
    from aioqueue._app.steps import step_key

    a = step_key("aq", "q", "j1", "charge")
    assert a == step_key("aq", "q", "j1", "charge")
    assert len(a) == 64
    others = {step_key("aq", "q", "j1", "refund"), step_key("aq", "q", "j2", "charge")}
    others |= {step_key("aq", "q2", "j1", "charge"), step_key("aq", "q", "j1c", "harge")}
    assert a not in others
    assert len(others) == 4
