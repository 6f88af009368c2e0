"""Why a job is not running (issue 28, point 6): ``Job.why()`` reads every block a claim would
meet in one atomic call (lua/why.lua), a test per reason, on a real server. Workers are
registered by driving the registry's scripts by hand (a "worker" nobody runs), as in
test_registry.py, so each reason is set up exactly."""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest
from redis.asyncio import Redis

from aioqueue import App, JobState, JobWhy, WhyReason
from aioqueue._queue.tasktable import register
from aioqueue.dashboard import basic_auth, create_app

from .support.prewarmed import run_aioqueue
from .support.server import RoundTrips, server_ms

LEASE_MS = 60_000
DEAD_TTL_MS = 3_600_000
INFO = ("h", 1, "0", "default", 4, 0, 0, 0, 0)


async def live_worker(app: App, wid: str = "w1", tasks: tuple[str, ...] = ("t",)) -> None:
    """Register worker ``wid`` on the default queue for a minute, declaring ``tasks``."""
    scripts = app.queue()._scripts
    await scripts.beat(wid, 60_000, LEASE_MS, 0, INFO, [], DEAD_TTL_MS)
    await register(scripts, wid, [x for name in tasks for x in (name, json.dumps({}))])


def reasons(w: JobWhy) -> list[WhyReason]:
    return [r.reason for r in w.rows]


async def test_a_job_that_does_not_exist_is_not_found(app: App) -> None:
    w = await app.queue().job("nope").why()
    assert (w.state, reasons(w)) == (None, [WhyReason.NOT_FOUND])
    assert "never enqueued" in w.sentence()


async def test_a_finished_job_says_when(app: App) -> None:
    q = app.queue()
    job = await q.enqueue("t")
    [r] = await q.reserve()
    await q.complete(r, 1)
    w = await job.why()
    assert (w.state, reasons(w)) == (JobState.COMPLETED, [WhyReason.FINISHED])
    row = w.rows[0]
    assert row.finished_ms is not None
    assert abs(row.finished_ms - w.now_ms) < 60_000
    assert w.sentence().startswith("It has finished")


async def test_a_running_job_names_its_worker_and_lease(app: App, redis: Redis) -> None:
    q = app.queue()
    await live_worker(app, "w1")
    job = await q.enqueue("t")
    res = await q._scripts.claim(1, LEASE_MS, DEAD_TTL_MS, "w1", 0, started=(0, 1))
    assert [c.id for c in res.jobs] == [job.id]
    w = await job.why()
    assert (w.state, reasons(w)) == (JobState.ACTIVE, [WhyReason.RUNNING])
    row = w.rows[0]
    assert (row.worker, row.worker_alive) == ("w1", True)
    assert row.until_ms == pytest.approx(w.now_ms + LEASE_MS, abs=30_000)
    assert "running on worker w1" in w.sentence()
    # its worker's registration runs out: the sentence says the job will come back
    await redis.zadd(q._keys.workers, {"w1": 1})
    w = await job.why()
    assert w.rows[0].worker_alive is False
    assert "missed its heartbeats" in w.sentence()


async def test_a_pull_api_reservation_is_running_on_a_consumer(app: App) -> None:
    q = app.queue()
    job = await q.enqueue("t")
    assert len(await q.reserve()) == 1
    w = await job.why()
    assert reasons(w) == [WhyReason.RUNNING]
    assert "a pull-API consumer" in w.sentence()


async def test_a_delayed_job_is_scheduled_until_its_due_time(app: App, redis: Redis) -> None:
    await live_worker(app)
    before = await server_ms(redis)
    job = await app.queue().enqueue("t", delay=600)
    w = await job.why()
    assert (w.state, reasons(w)) == (JobState.SCHEDULED, [WhyReason.SCHEDULED])
    assert w.rows[0].until_ms == pytest.approx(before + 600_000, abs=30_000)
    assert "scheduled until" in w.sentence()


async def test_a_batch_callback_waits_for_its_batch(app: App) -> None:
    @app.task()
    async def part(i: int) -> int:
        return i

    @app.task()
    async def collect() -> None:
        pass

    batch = await app.batch([part.call(i) for i in range(2)], on_complete=collect.call())
    assert batch.callback is not None
    w = await batch.callback.why()
    assert (w.state, reasons(w)) == (JobState.WAITING, [WhyReason.WAITING])
    assert w.rows[0].batch == batch.id
    assert f"batch {batch.id}" in w.sentence()


async def test_a_paused_queue_is_the_first_reason(app: App) -> None:
    q = app.queue()
    await live_worker(app)
    job = await q.enqueue("t")
    await q.pause()
    w = await job.why()
    assert reasons(w) == [WhyReason.QUEUE_PAUSED, WhyReason.POSITION]
    assert w.blocked
    assert w.sentence().startswith("The queue is paused.")
    await q.resume()
    assert reasons(await job.why()) == [WhyReason.POSITION]


async def test_a_paused_group(app: App) -> None:
    q = app.queue()
    await live_worker(app)
    job = await q.enqueue("t", group="acme")
    await q.pause("acme")
    w = await job.why()
    assert reasons(w) == [WhyReason.GROUP_PAUSED, WhyReason.POSITION]
    assert w.rows[0].group == "acme"
    assert "group acme is paused" in w.sentence()


async def test_a_group_at_its_limit_names_who_holds_the_slots(app: App) -> None:
    q = app.queue()
    await live_worker(app)
    await q.set_group_limit("acme", 2)
    first = [await q.enqueue("t", group="acme") for _ in range(2)]
    job = await q.enqueue("t", group="acme")
    res = await q._scripts.claim(2, LEASE_MS, DEAD_TTL_MS, "w1", 0, started=(0, 2))
    assert sorted(c.id for c in res.jobs) == sorted(j.id for j in first)
    w = await job.why()
    assert reasons(w) == [WhyReason.GROUP_FULL, WhyReason.POSITION]
    row = w.rows[0]
    assert (row.group, row.limit, row.active) == ("acme", 2, 2)
    assert sorted(row.holders) == sorted((j.id, "w1") for j in first)
    assert "at its limit: 2 running of 2" in w.sentence()
    assert w.rows[1].ahead == 0


@pytest.mark.parametrize(
    ("group", "reason", "words"),
    [
        ("acme", WhyReason.GROUP_RATE, "Its group acme used up its rate"),
        (None, WhyReason.QUEUE_RATE, "The queue used up its rate"),
    ],
    ids=["group", "queue"],
)
async def test_a_rate_window_used_up_says_until_when(
    app: App, group: str | None, reason: WhyReason, words: str
) -> None:
    q = app.queue()
    await live_worker(app)
    await q.set_rate_limit(1, 600, group=group)
    await q.enqueue("t", group=group)
    job = await q.enqueue("t", group=group)
    assert len(await q.reserve()) == 1
    w = await job.why()
    assert reasons(w) == [reason, WhyReason.POSITION]
    until = w.rows[0].until_ms
    assert until is not None
    assert w.now_ms < until <= w.now_ms + 600_000
    assert words in w.sentence()


async def test_no_live_worker_serves_the_queue(app: App, redis: Redis) -> None:
    q = app.queue()
    job = await q.enqueue("t")
    w = await job.why()
    assert reasons(w) == [WhyReason.NO_WORKER, WhyReason.POSITION]
    # a worker whose registration ran out is no live worker either
    await live_worker(app)
    await redis.zadd(q._keys.workers, {"w1": 1})
    assert reasons(await job.why()) == [WhyReason.NO_WORKER, WhyReason.POSITION]


async def test_live_workers_that_do_not_know_the_task(app: App) -> None:
    q = app.queue()
    await live_worker(app, "w1", tasks=("other",))
    job = await q.enqueue("t", allow_unknown=True)
    w = await job.why()
    assert reasons(w) == [WhyReason.UNKNOWN_TASK, WhyReason.POSITION]
    assert w.rows[0].workers == 1
    assert "do not declare its task" in w.sentence()


async def test_the_position_in_each_lane(app: App) -> None:
    q = app.queue()
    await live_worker(app)
    plain = [await q.enqueue("t") for _ in range(3)]
    high = await q.enqueue("t", priority=5)
    low = await q.enqueue("t", priority=-5)
    grouped = [await q.enqueue("t", group="acme") for _ in range(2)]

    async def ahead(job_id: str) -> int | None:
        w = await q.job(job_id).why()
        assert reasons(w) == [WhyReason.POSITION]
        return w.rows[0].ahead

    # take() serves priority above 0, then the plain list, then priority below 0
    assert await ahead(high.id) == 0
    assert [await ahead(j.id) for j in plain] == [1, 2, 3]
    assert await ahead(low.id) == 4
    assert [await ahead(j.id) for j in grouped] == [0, 1]
    w = await grouped[1].why()
    assert w.rows[0].group == "acme"
    assert "group acme's lane with 1 job(s) ahead" in w.sentence()
    assert (await high.why()).sentence() == "It is next in the queue's lane."


async def test_an_unreadable_state(app: App, redis: Redis) -> None:
    q = app.queue()
    job = await q.enqueue("t")
    await redis.hset(q._keys.job(job.id), "s", "\x1b[31mbogus")
    w = await job.why()
    assert (w.state, reasons(w)) == (None, [WhyReason.UNREADABLE])


async def test_why_is_one_round_trip(
    app: App, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = app.queue()
    await live_worker(app)
    await q.set_group_limit("acme", 1)
    await q.enqueue("t", group="acme")
    job = await q.enqueue("t", group="acme")
    assert len((await q._scripts.claim(1, LEASE_MS, DEAD_TTL_MS, "w1", 0)).jobs) == 1
    await q.pause()
    with RoundTrips(monkeypatch) as trips:
        w = await job.why()
    assert trips.n == 1
    assert reasons(w) == [WhyReason.QUEUE_PAUSED, WhyReason.GROUP_FULL, WhyReason.POSITION]


async def test_the_cli_prints_every_reason_and_json(app: App, redis_url: str) -> None:
    q = app.queue()
    job = await q.enqueue("t", group="acme")
    await q.pause()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return run_aioqueue(["why", *args, "--url", redis_url])

    res = run(job.id, "--prefix", app.prefix)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == f"{job.id}  queued"
    assert [line.split()[0] for line in lines[1:]] == ["queue_paused", "no_worker", "position"]
    assert "The queue is paused." in lines[1]
    res = run(job.id, "--prefix", app.prefix, "--json")
    data = json.loads(res.stdout)
    assert (data["reason"], data["state"]) == ("queue_paused", "queued")
    assert [r["reason"] for r in data["rows"]] == ["queue_paused", "no_worker", "position"]
    assert data["sentence"].startswith("The queue is paused. No live worker serves this queue.")
    res = run("gone", "--prefix", app.prefix)
    assert res.returncode == 0
    assert "missing" in res.stdout


async def test_the_dashboards_job_page_has_the_why_line_escaped(app: App) -> None:
    q = app.queue()
    job = await q.enqueue("t", group="<b>g</b>")
    await q.pause("<b>g</b>")
    web = create_app(app, auth=basic_auth("ops", "pw-123"))
    transport = httpx.ASGITransport(app=web)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://dash.test", auth=("ops", "pw-123")
    ) as c:
        page = (await c.get(f"/queues/default/jobs/{job.id}")).text
    assert "<tr><th>Why</th><td>Its group &lt;b&gt;g&lt;/b&gt; is paused." in page
    assert "<b>g</b>" not in page


async def test_a_dependent_names_what_it_waits_for(app: App) -> None:
    @app.task
    async def step(i: int) -> int:
        return i

    q = app.queue()
    a, b = await step.enqueue(1), await step.enqueue(2)
    total = await step.options(depends_on=[a, b]).enqueue(3)
    w = await total.why()
    assert (w.state, reasons(w)) == (JobState.WAITING, [WhyReason.DEPENDENCIES])
    row = w.rows[0]
    assert row.left == 2
    assert sorted(row.waits_for) == sorted([(q.name, a.id), (q.name, b.id)])
    assert "It waits for 2 job(s) it depends on: " in w.sentence()
    # one done: one left
    [r] = await q.reserve()
    await q.complete(r, 1)
    w = await total.why()
    assert w.rows[0].left == 1


@pytest.mark.parametrize("kind", ["rate", "conc"])
async def test_a_named_limit_that_does_not_admit_it_says_which_and_until_when(
    app: App, kind: str
) -> None:
    if kind == "rate":
        app.limiter("api", rate=(1, 600.0), key=lambda who: who)  # one start per 10 minutes
    else:
        app.limiter("api", concurrency=1, key=lambda who: who)

    @app.task(name="call", limits=["api"])
    async def call(who: str) -> None: ...

    q = app.queue()
    await live_worker(app, tasks=("call",))
    await call.enqueue("ann")
    job = await call.enqueue("ann")
    assert len(await q.reserve()) == 1  # the first is leased and charged to ann's limit
    w = await job.why()
    assert reasons(w)[0] == WhyReason.LIMITER
    row = w.rows[0]
    assert (row.limiter, row.limit_key, row.limited_by) == ("api", "ann", kind)
    assert row.until_ms is not None
    assert w.now_ms < row.until_ms <= w.now_ms + 600_000
    assert "limiter api (key ann)" in w.sentence()
    other = await call.enqueue("bob")  # another key of the same limiter is free
    assert WhyReason.LIMITER not in reasons(await other.why())
