"""Durable waits and signals (issue 27, point 5): ``ctx.sleep`` and ``ctx.wait_for_event``
park the job (lease given back, attempt not charged, no worker holding it) and it runs again
from the top, its steps returning their records; ``app.signal`` wakes the waiters with a
payload (sealed for the queue and key on a signing app); a wait that times out raises
``WaitTimedOut``; a signal wakes at most 1,000 jobs per script call (I13)."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from aioqueue import App, JobFailed, JobState, WaitTimedOut, WhyReason, Worker, current_job
from aioqueue._model.keys import QueueKeys
from aioqueue._model.sealed import seal_value

from .stepapp import Keys, register
from .support.apps import open_app
from .support.server import text
from .support.waiting import wait_until

SIGNING = "s" * 32


async def _reached(redis: Redis, app: App, job_id: str, place: str) -> bool:
    at = [text(x) for x in await redis.lrange(Keys(app.prefix).at, 0, -1)]
    return any(a.startswith(f"{job_id}:{place}:") for a in at)


async def _execs(redis: Redis, app: App) -> dict[str, int]:
    raw = await redis.hgetall(Keys(app.prefix).execs)
    return {text(k): int(v) for k, v in raw.items()}


@pytest.mark.cluster
async def test_a_sleeping_job_is_parked_and_resumes_with_its_steps(app: App, redis: Redis) -> None:
    register(app)
    async with Worker(app, concurrency=2, grace=2):
        job = await app.tasks["napper"].enqueue(1.0)

        async def parked() -> bool:
            return await _reached(redis, app, job.id, "parking") and (
                await job.state() is JobState.SCHEDULED
            )

        await wait_until(parked, timeout=30, what="the job parked in scheduled")
        info = await job.info()
        assert info.attempts == 0  # the parked run's attempt was refunded
        assert (await job.why()).rows[0].reason is WhyReason.SCHEDULED  # a sleep: its due time
        assert await job.result(timeout=30) == "ba"
    assert (await job.info()).attempts == 1
    execs = await _execs(redis, app)
    assert execs == {f"{job.id}:before": 1, f"{job.id}:after": 1}


@pytest.mark.cluster
async def test_a_signal_wakes_its_waiters_with_the_payload(app: App, redis: Redis) -> None:
    register(app)
    async with Worker(app, concurrency=4, grace=2):
        jobs = [await app.tasks["waiter"].enqueue("shipped:o-1", 600) for _ in range(3)]
        other = await app.tasks["waiter"].enqueue("shipped:o-2", 600)

        async def all_parked() -> bool:
            states = [await j.state() for j in (*jobs, other)]
            return all(s is JobState.SCHEDULED for s in states) and all(
                [await _reached(redis, app, j.id, "waiting") for j in (*jobs, other)]
            )

        await wait_until(all_parked, timeout=30, what="four waiters parked")
        why = await other.why()  # "why is it not running?": it waits for its event
        assert why.rows[0].reason is WhyReason.EVENT
        assert why.rows[0].event == "shipped:o-2"
        assert "waits for event shipped:o-2" in why.sentence()
        assert await app.signal("shipped:o-1", {"carrier": "ups", "n": 1}) == 3
        for j in jobs:
            assert await j.result(timeout=30) == {"carrier": "ups", "n": 1}
        assert await other.state() is JobState.SCHEDULED  # another key: still waiting
        assert await app.signal("shipped:o-1", "again") == 0  # nobody waits any more
        assert await app.signal("shipped:o-2") == 1
        assert await other.result(timeout=30) is None
    execs = await _execs(redis, app)
    assert all(execs[f"{j.id}:before"] == 1 for j in (*jobs, other))


async def test_a_wait_that_times_out_raises_in_the_task(app: App) -> None:
    seen: list[BaseException] = []

    @app.task
    async def impatient() -> str:
        try:
            await current_job().wait_for_event("never", timeout=0.3)
        except WaitTimedOut as exc:
            seen.append(exc)
            return "gave up"
        return "woken"

    async with Worker(app, concurrency=1, grace=2):
        job = await impatient.enqueue()
        assert await job.result(timeout=30) == "gave up"
    assert isinstance(seen[0], TimeoutError)
    assert seen[0].key == "never"  # type: ignore[attr-defined]


async def test_a_signal_wakes_at_most_1000_jobs_per_call(app: App, redis: Redis) -> None:
    q = app.queue()
    scripts = q._scripts
    ek = QueueKeys(app.prefix, "default").event("flood")
    await redis.sadd(ek, *[f"ghost{i}" for i in range(1500)])  # no such jobs: dropped
    assert await scripts.signal("flood", b"x") == (0, 500)
    assert await scripts.signal("flood", b"x") == (0, 0)
    await redis.sadd(ek, *[f"ghost{i}" for i in range(2500)])
    assert await app.signal("flood", "x") == 0  # went on in further calls
    assert not await redis.exists(ek)


async def test_a_planted_signal_on_a_signing_app_runs_nothing(redis: Redis, redis_url: str) -> None:
    async with open_app(redis_url, signing_key=SIGNING) as app:
        register(app)
        async with Worker(app, concurrency=2, grace=2):
            job = await app.tasks["waiter"].enqueue("webhook", 600)

            async def parked() -> bool:
                return await job.state() is JobState.SCHEDULED and await _reached(
                    redis, app, job.id, "waiting"
                )

            await wait_until(parked, timeout=30, what="the waiter parked")
            # someone with write access but not the key signals: an unsigned payload, and
            # one sealed for another key
            forged = seal_value(
                App(signing_key="x" * 32).codec, ("default", "", ""), "sg", "webhook", 1
            )
            assert await app.queue()._scripts.signal("webhook", forged) == (1, 0)
            with pytest.raises(JobFailed) as failed:
                await job.result(timeout=30)
            # the key holder's signal is taken
            genuine = await app.tasks["waiter"].enqueue("webhook", 600)

            async def waiting() -> bool:
                return await genuine.state() is JobState.SCHEDULED and await _reached(
                    redis, app, genuine.id, "waiting"
                )

            await wait_until(waiting, timeout=30, what="the second waiter parked")
            assert await app.signal("webhook", {"ok": True}) == 1
            assert await genuine.result(timeout=30) == {"ok": True}
        assert failed.value.error_type == "BadSignature"


@pytest.mark.parametrize("bad", [-1, float("nan"), "soon"])
async def test_a_bad_duration_fails_the_attempt_with_a_clear_error(app: App, bad: Any) -> None:
    @app.task(max_attempts=1)
    async def odd() -> None:
        await current_job().sleep(bad)

    async with Worker(app, concurrency=1, grace=2):
        job = await odd.enqueue()
        with pytest.raises(JobFailed) as failed:
            await job.result(timeout=30)
    assert failed.value.error_type == "ConfigurationError"
