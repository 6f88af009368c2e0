"""Every job has an author (I12, issue 24 point 2): each path by which a worker or a tool
creates or changes a job either carries a MAC made by a key holder or is declared in code.

``INVENTORY`` is the list of those paths (docs/security.md shows it as a table). Each row names
the scripts that write job records on that path, what authenticates it, and its test: the test
plants the unsigned (or wrongly signed) variant the way a writer without the key would (plain
Redis commands, or aioqueue itself run without the key or with another one) and proves that a
signing worker never runs it: the task body records every execution, and the planted work is
dead-lettered (``BadSignature``) or set aside with its reason, never executed.

The inventory is complete by construction where the code allows: ``test_every_script_that_
writes_a_job_record_has_a_row`` reads every Lua script and library part, finds each write to a
job record (``HSET`` on a job key) and fails if one has no row; one that writes what decides
which code runs with which input (task, payload, options) must be on a row authenticated by a
MAC or by code, not on a state-only row.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from aioqueue import App, Batch, BatchState, JobState, Queue, ResultState, Worker, current_job
from aioqueue._model.sealed import seal_value
from aioqueue._queue.leases import forward_outbox
from aioqueue.dashboard._actions import run_action
from aioqueue.dashboard._data import job_page

from .support.apps import open_app, unique_prefix
from .support.clirun import aioqueue_cli
from .support.waiting import wait_until

KEY = "author-signing-key-0123456789abcdef"
OTHER_KEY = "someone-elses-key-0123456789abcdef"
LUA = Path(__file__).resolve().parent.parent / "aioqueue" / "_store" / "lua"


@dataclass(frozen=True)
class Row:
    """One path that creates or changes a job."""

    path: str
    #: the Lua scripts (``name`` or ``lib/name``) that write job records on this path
    scripts: tuple[str, ...]
    #: "creates": it writes what decides which code runs with which input (task, payload,
    #: options); "state": it changes only a job's state, attempts, due time or bookkeeping
    kind: str
    authenticated_by: str
    test: str


INVENTORY: tuple[Row, ...] = (
    Row(
        "enqueue: Task.enqueue, Queue.enqueue, sharded queues (a job goes to its shard by the "
        "same script), CLI `aioqueue enqueue`",
        ("enqueue",),
        "creates",
        "MAC of payload + options by the producer (a key holder); checked by the worker and "
        "`reserve` before decoding",
        "test_an_enqueue_without_the_key_is_dead_lettered_never_run",
    ),
    Row(
        "unique jobs: `on_conflict='replace'` / `'debounce'` replacing a waiting job's input",
        ("replace",),
        "creates",
        "MAC of the new payload + options by the producer that replaces",
        "test_a_replacement_without_the_key_is_dead_lettered_never_run",
    ),
    Row(
        "batches, chain steps and batch callbacks (stored with the batch; a callback released "
        "when the batch ends)",
        ("batch", "lib/batches"),
        "creates",
        "MAC of each sub-job and of the callback by the producer; the callback's input: results "
        "signed for that batch",
        "test_a_batch_and_chain_without_the_key_never_run",
    ),
    Row(
        "dependents and workflow steps (`depends_on=`, `app.workflow`), stored waiting and "
        "released by their dependencies; a parked parent (`wait_for_children`)",
        ("deps", "lib/deps"),
        "creates",
        "MAC of each dependent's payload + options by the producer; released work is checked "
        "by the worker like any job; a park only changes the state of the job it holds",
        "test_a_dependent_or_workflow_without_the_key_never_runs",
    ),
    Row(
        "dynamic schedules (`app.schedules.add`): the scheduler makes each tick's job",
        ("schedule",),
        "creates",
        "MAC of the stored definition by a key holder, checked by the scheduler before it makes "
        "a job; a failing one is set aside in `garbled`",
        "test_a_planted_schedule_is_set_aside_and_never_fires",
    ),
    Row(
        "static schedules (`@app.cron`, `app.schedule`)",
        ("schedule",),
        "creates",
        "declared in code: the worker fires its own declaration, whatever is stored",
        "test_a_declared_schedule_fires_as_declared_whatever_is_stored",
    ),
    Row(
        "batch outcomes forwarded from another queue's outbox to the batch's home queue (a "
        "sub-job or chain step on another queue; `forward_outbox`, `batch.lua` apply)",
        ("batch", "lib/batches"),
        "state",
        "state only for the counts; the result it carries keeps the MAC of the worker that "
        "made it (for its job and batch), verified before a callback or chain step reads it",
        "test_a_planted_batch_outcome_never_feeds_a_chain_step",
    ),
    Row(
        "rekey: an operator's `Queue.rekey()` / `aioqueue rekey` sealing stored payloads and "
        "results again with the first keys (`rekey.lua`)",
        ("rekey",),
        "creates",
        "the operator's App holds the keys: it re-seals only values that verify with a listed "
        "key; any other is reported unreadable and left as it is",
        "test_rekey_never_reseals_a_planted_payload",
    ),
    Row(
        "retries, lease recovery and promotion of delayed jobs (`fail`, `reap`, a worker's "
        "maintenance, `promote`, `release`)",
        ("fail", "lib/acks", "lib/maintenance", "promote", "release"),
        "state",
        "state only: the payload keeps its author's MAC, checked again at every claim",
        "test_a_retry_of_a_job_whose_input_was_swapped_is_dead_lettered",
    ),
    Row(
        "requeue from dead letters: `Queue.requeue`, CLI `aioqueue retry`, the dashboard's "
        "retry, promote, cancel and purge actions",
        ("requeue", "cancel"),
        "state",
        "state only: the payload keeps its author's MAC, checked again at every claim (the CLI "
        "refuses `retry` without the key when the workers sign)",
        "test_requeued_dead_letters_and_dashboard_actions_never_run_planted_input",
    ),
    Row(
        "leasing, completion, cancellation, progress, watch, history, dead-lettering",
        (
            "lib/leasing",
            "lib/lanes",
            "lib/deadletter",
            "lib/history",
            "progress",
            "watch",
        ),
        "state",
        "state only: never chooses code or input; a result is signed (MAC by the worker)",
        "test_job_detail_verifies_the_result_with_the_jobs_queue_and_id",
    ),
    Row(
        "durable steps, durable waits and job logs of a running job (`ctx.step`, `ctx.sleep`, "
        "`ctx.wait_for_event`, `ctx.log`), signals waking waiters (`app.signal`, CLI "
        "`aioqueue signal`)",
        ("step", "joblog", "wait", "signal", "lib/giveback"),
        "state",
        "fenced by the lease like an ack; a step's result is sealed (MAC) by the worker that "
        "ran it for its job, task and name, a signal's payload by the signaller for its queue "
        "and key: verified before the task reads either, a planted one dead-letters the job",
        "test_a_planted_step_record_or_signal_never_feeds_a_task",
    ),
    Row(
        "change a waiting job: `Job.change`, CLI `aioqueue change`, the dashboard's change form",
        ("change",),
        "state",
        "state only (priority, due time): the payload keeps its author's MAC, checked at claim",
        "test_a_changed_unsigned_job_is_still_dead_lettered_never_run",
    ),
)

#: the fields of a job record that decide which code runs with which input
INPUT_FIELDS = {"t", "p", "o"}


def _job_writes() -> dict[str, set[str]]:
    """Every script (or library part) that writes a job record, with the fields it writes
    ("*" for a list built elsewhere in the script)."""
    out: dict[str, set[str]] = {}
    files = sorted([*LUA.glob("*.lua"), *(LUA / "lib").glob("*.lua")])
    for path in files:
        name = str(path.relative_to(LUA)).removesuffix(".lua")
        source = path.read_text()
        keys = set(re.findall(r"local (\w+) = job_key\(", source)) | {"jk", "ck"}
        # a hash named by the caller under the key base (a job's, among others)
        keys |= set(re.findall(r"local (\w+) = ARGV\[1\] \.\. ", source))
        for m in re.finditer(r"call\('HSET', (\w+|job_key\([^)]*\)),? ?([^\n]*)", source):
            key, rest = m.group(1), m.group(2)
            if key not in keys and not key.startswith("job_key("):
                continue
            fields = out.setdefault(name, set())
            if "unpack(" in rest:
                fields.add("*")
            args = [a.strip() for a in rest.split(",")]
            if args and not re.fullmatch(r"'\w+'|unpack\(.*", args[0]):
                fields.add("*")  # a field named by the caller
            fields.update(a.strip("'") for a in args[0::2] if re.fullmatch(r"'\w+'", a))
    return out


def test_every_script_that_writes_a_job_record_has_a_row() -> None:
    writes = _job_writes()
    assert {"enqueue", "batch", "replace", "schedule"} <= set(writes)  # the parser finds them
    rowed = {s for row in INVENTORY for s in row.scripts}
    missing = sorted(set(writes) - rowed)
    assert not missing, f"scripts that write job records without a row in INVENTORY: {missing}"
    creators = {s for row in INVENTORY if row.kind == "creates" for s in row.scripts}
    for script, fields in writes.items():
        if fields & (INPUT_FIELDS | {"*"}):
            assert script in creators, f"{script} writes {fields & INPUT_FIELDS} on a state row"
    for row in INVENTORY:
        assert row.test in globals(), f"row {row.path!r} names no test"


def test_no_python_code_writes_a_job_record_directly() -> None:
    # every job write goes through a script listed above: Python only reads job records
    pkg = LUA.parent.parent
    hits = [
        f"{p.relative_to(pkg)}: {line.strip()}"
        for p in pkg.rglob("*.py")
        for line in p.read_text().splitlines()
        if re.search(r"\.(hset|hsetnx|hmset|hincrby)\(\s*[^,]*\bjob\(", line)
    ]
    assert not hits


def test_security_md_shows_the_inventory() -> None:
    doc = (LUA.parent.parent.parent / "docs" / "security.md").read_text()
    for row in INVENTORY:
        assert row.test in doc, f"docs/security.md lacks the row tested by {row.test}"


# --------------------------------------------------------------------- the rows' tests
@dataclass
class Pair:
    """A signing App (workers with the key) and, on the same prefix, writers without it."""

    app: App
    unsigned: App
    wrong: App
    ran: list[Any] = field(default_factory=list)


@contextlib.asynccontextmanager
async def pair(redis_url: str) -> AsyncIterator[Pair]:
    prefix = unique_prefix()
    async with (
        open_app(redis_url, prefix=prefix, signing_key=KEY) as app,
        open_app(redis_url, prefix=prefix) as unsigned,
        open_app(redis_url, prefix=prefix, signing_key=OTHER_KEY) as wrong,
    ):
        p = Pair(app, unsigned, wrong)
        for a in (app, unsigned, wrong):

            @a.task(name="pay")
            async def pay(amount: int) -> int:
                p.ran.append(amount)
                return amount

            @a.task(name="report")
            async def report(results: Any = None) -> None:
                p.ran.append(("report", results))

        yield p


async def dead_as_bad_signature(app: App, job_id: str) -> bool:
    info = await app.queue().job_info(job_id)
    return (
        info.state is JobState.FAILED
        and info.error is not None
        and (info.error.type == "BadSignature")
    )


async def test_an_enqueue_without_the_key_is_dead_lettered_never_run(redis_url: str) -> None:
    async with pair(redis_url) as p:
        planted = [
            await p.unsigned.queue().enqueue("pay", [666]),
            await p.wrong.queue().enqueue("pay", [667]),
            await p.unsigned.queue("hot", shards=2).enqueue("pay", [668], job_id="s1"),
        ]
        good = await p.app.queue().enqueue("pay", [1])
        hot = p.app.queue("hot", shards=2)
        async with Worker(p.app, queues=["default", "hot"], concurrency=2):
            assert await good.result(timeout=60) == 1
            for job in planted[:2]:
                await wait_until(functools.partial(dead_as_bad_signature, p.app, job.id))
            shard = hot.shard_for("s1")
            await wait_until(lambda: _dead_on(shard, "s1"), timeout=60, what="the sharded job dead")
        assert p.ran == [1]


async def _dead_on(queue: Queue, job_id: str) -> bool:
    info = await queue.job_info(job_id)
    return (
        info.state is JobState.FAILED
        and info.error is not None
        and (info.error.type == "BadSignature")
    )


async def test_a_replacement_without_the_key_is_dead_lettered_never_run(redis_url: str) -> None:
    async with pair(redis_url) as p:

        def debounced(app: App) -> Any:
            return app.tasks["pay"].options(unique_key="acct:1", on_conflict="debounce", delay=3600)

        signed = await debounced(p.app).enqueue(1)
        replaced = await debounced(p.unsigned).enqueue(666)
        assert replaced.id == signed.id  # the planted input replaced the genuine one
        await p.app.queue().promote([signed.id])
        async with Worker(p.app, concurrency=2):
            await wait_until(lambda: dead_as_bad_signature(p.app, signed.id), timeout=60)
        assert p.ran == []


async def test_a_batch_and_chain_without_the_key_never_run(redis_url: str) -> None:
    async with pair(redis_url) as p:
        pay, report = p.unsigned.tasks["pay"], p.unsigned.tasks["report"]
        batch = await p.unsigned.batch([pay.call(666), pay.call(667)], on_complete=report.call())
        chain = await pay.call(668).then(report).enqueue()
        good = await p.app.queue().enqueue("pay", [1])
        async with Worker(p.app, concurrency=4):
            assert await good.result(timeout=60) == 1
            await wait_until(lambda: _batch_done(p.unsigned, batch), timeout=60, what="batch")
            await wait_until(lambda: _finished(p.app, chain.id), timeout=60, what="chain")
        assert p.ran == [1]
        members = [m for m in (await p.app.queue().jobs("failed")).items if m.task == "pay"]
        assert len(members) >= 3
        for m in members:
            assert await dead_as_bad_signature(p.app, m.id)


async def test_a_dependent_or_workflow_without_the_key_never_runs(redis_url: str) -> None:
    async with pair(redis_url) as p:
        good = await p.app.queue().enqueue("pay", [1])
        planted = [
            await p.unsigned.tasks["pay"].options(depends_on=[good.id]).enqueue(666),
            await p.wrong.tasks["pay"].options(depends_on=[good.id]).enqueue(667),
        ]
        wf = p.unsigned.workflow("planted")
        wf.step("a", p.unsigned.tasks["pay"].call(668))
        wf.step("b", p.unsigned.tasks["pay"].call(669), after=["a"])
        flow = await wf.enqueue()
        steps = (await flow.graph())["steps"]
        async with Worker(p.app, concurrency=4):
            assert await good.result(timeout=60) == 1
            for job_id in [j.id for j in planted] + [steps["a"]["id"]]:
                await wait_until(functools.partial(dead_as_bad_signature, p.app, job_id))
            await wait_until(lambda: _finished(p.app, steps["b"]["id"]), timeout=60)
        assert p.ran == [1]
        assert (await flow.nodes())["b"] == "cancelled"


async def _batch_done(app: App, batch: Batch[Any]) -> bool:
    return (await batch.info()).state is not BatchState.OPEN


async def _finished(app: App, job_id: str) -> bool:
    state = (await app.queue().job_info(job_id)).state
    return state in (JobState.FAILED, JobState.CANCELLED, JobState.COMPLETED)


async def _ran_at_least(p: Pair, n: int) -> bool:
    return len(p.ran) >= n


@pytest.mark.cluster
async def test_a_planted_schedule_is_set_aside_and_never_fires(
    redis_url: str, redis: Redis
) -> None:
    async with pair(redis_url) as p:
        k = p.app.queue()._keys
        # the attack of the issue, verbatim: no key, just two commands
        planted = {"task": "pay", "every_ms": 1000, "args": [666]}
        await redis.hset(k.cron_defs, "payroll", json.dumps(planted))
        await redis.zadd(k.cron_next, {"payroll": 0})
        # aioqueue itself, run with another key
        await p.wrong.schedules.add("pay", every=1, args=[667], name="payroll2")
        await p.app.schedules.add("pay", every=timedelta(milliseconds=200), args=[1], name="good")

        async def only_good_left() -> bool:
            return await redis.hkeys(k.cron_defs) == [b"good"]

        async with Worker(p.app, concurrency=2):
            await wait_until(lambda: _ran_at_least(p, 3), timeout=60, what="the good schedule")
            # payroll2's first tick is up to a second away: wait for it to be due and judged
            await wait_until(only_good_left, timeout=60, what="the planted ones set aside")
            after = len(p.ran)
            await wait_until(lambda: _ran_at_least(p, after + 2), timeout=60, what="more ticks")
        assert set(p.ran) == {1}
        reasons = [json.loads(v)["reason"] for v in (await redis.hgetall(k.garbled)).values()]
        for name in ("payroll", "payroll2"):
            assert any(f"schedule {name!r}: BadSignature" in r for r in reasons), reasons
        assert [s.name for s in await p.app.schedules.list()] == ["good"]


async def test_a_declared_schedule_fires_as_declared_whatever_is_stored(
    redis_url: str, redis: Redis
) -> None:
    async with pair(redis_url) as p:
        p.app.schedule("pay", every=timedelta(milliseconds=200), args=[1], name="nightly")
        k = p.app.queue()._keys
        async with Worker(p.app, concurrency=2):
            await wait_until(lambda: _ran_at_least(p, 1), timeout=60, what="a declared tick")
            # overwrite the stored definition, unsigned, with other arguments
            forged = {"task": "pay", "every_ms": 200, "args": [666], "declared": True}
            await redis.hset(k.cron_defs, "nightly", json.dumps(forged))
            seen = len(p.ran)
            await wait_until(lambda: _ran_at_least(p, seen + 3), timeout=60, what="more ticks")
        assert set(p.ran) == {1}


async def test_a_planted_batch_outcome_never_feeds_a_chain_step(
    redis_url: str, redis: Redis
) -> None:
    async with pair(redis_url) as p:
        pay, report = p.app.tasks["pay"], p.app.tasks["report"]
        last = await pay.options(queue="other").call(1).then(report).enqueue()
        other = p.app.queue("other")
        [first] = (await other.jobs("queued")).items
        bid, home, member = await redis.hmget(other._keys.job(first.id), "b", "bh", "bm")
        assert bid
        assert home
        assert member
        # the first step "finished" with 666: an outbox entry, as complete.lua writes them
        fields = [f if isinstance(f, bytes) else f.encode() for f in (bid, home, member)]
        fields += [b"1", b"666"]
        await redis.rpush(other._keys.outbox, b"".join(b"%d:%b" % (len(f), f) for f in fields))
        assert await forward_outbox(other) == 1
        async with Worker(p.app, queues=["default"], concurrency=2):
            await wait_until(functools.partial(dead_as_bad_signature, p.app, last.id))
        assert p.ran == []


async def test_rekey_never_reseals_a_planted_payload(redis_url: str) -> None:
    async with pair(redis_url) as p:
        planted = await p.unsigned.queue().enqueue("pay", [666], delay=3600)
        genuine = await p.app.queue().enqueue("pay", [1], delay=3600)
        report = await p.app.queue().rekey()
        assert report.unreadable == 1
        assert planted.id in " ".join(report.reasons)
        await p.app.queue().promote([planted.id, genuine.id])
        async with Worker(p.app, concurrency=2):
            assert await genuine.result(timeout=60) == 1
            await wait_until(functools.partial(dead_as_bad_signature, p.app, planted.id))
        assert p.ran == [1]


async def test_a_retry_of_a_job_whose_input_was_swapped_is_dead_lettered(
    redis_url: str, redis: Redis
) -> None:
    async with pair(redis_url) as p:
        genuine = await p.app.queue().enqueue("pay", [1], delay=3600)
        donor = await p.unsigned.queue().enqueue("pay", [666], delay=3600)
        k = p.app.queue()._keys
        # a job waiting for its retry (attempt 1 failed) gets the planted payload
        planted = await redis.hget(k.job(donor.id), "p")
        assert planted is not None
        await redis.hset(k.job(genuine.id), mapping={"a": 1, "p": planted})
        await p.app.queue().promote([genuine.id])
        async with Worker(p.app, concurrency=2):
            await wait_until(lambda: dead_as_bad_signature(p.app, genuine.id), timeout=60)
        assert p.ran == []


async def test_requeued_dead_letters_and_dashboard_actions_never_run_planted_input(
    redis_url: str,
) -> None:
    async with pair(redis_url) as p:
        q = p.app.queue()
        a = await p.unsigned.queue().enqueue("pay", [666])
        b = await p.unsigned.queue().enqueue("pay", [667])
        async with Worker(p.app, concurrency=2):
            for job in (a, b):
                await wait_until(functools.partial(dead_as_bad_signature, p.app, job.id))
            assert await q.requeue([a.id]) == 1
            form = {"action": ["retry"], "state": ["failed"], "ids": [b.id]}
            assert "1 of 1" in await run_action(q, form)
            for job in (a, b):  # requeued, claimed, refused again
                await wait_until(functools.partial(_attempted_again, p.app, job.id))
        assert p.ran == []


async def _attempted_again(app: App, job_id: str) -> bool:
    info = await app.queue().job_info(job_id)
    return info.state is JobState.FAILED and info.attempts >= 1 and info.error is not None


async def test_job_detail_verifies_the_result_with_the_jobs_queue_and_id(
    redis_url: str, redis: Redis
) -> None:
    async with pair(redis_url) as p:
        q = p.app.queue()
        good = await q.enqueue("pay", [5])
        other = await q.enqueue("pay", [6])
        async with Worker(p.app, concurrency=2):
            assert await good.result(timeout=60) == 5
            assert await other.result(timeout=60) == 6
        d = await q.job_detail(good.id)
        assert (d.result, d.result_state, d.result_error) == (5, ResultState.OK, None)
        page = await job_page(p.app, q.name, good.id)
        assert page["result"] == "5"
        # another job's genuine result copied in: explicit, typed, never decoded
        k = q._keys
        await redis.hset(k.job(good.id), "r", await redis.hget(k.job(other.id), "r"))
        d = await q.job_detail(good.id)
        assert d.result is None
        assert d.result_state is ResultState.BAD_SIGNATURE
        assert "does not match its signature" in (d.result_error or "")
        assert "bad_signature" in (await job_page(p.app, q.name, good.id))["result"]


# --------------------------------------------------------------------- the CLI and the key
def _cli(url: str, prefix: str, *args: str, key: str | None = None) -> Any:
    return aioqueue_cli(
        url, prefix, *args, env=None if key is None else {"AIOQUEUE_SIGNING_KEY": key}
    )


async def _a_signing_worker_registered(app: App) -> bool:
    return any(w.alive and w.signs for w in await app.queue().workers())


async def test_the_cli_refuses_enqueue_and_retry_without_the_key_when_workers_sign(
    redis_url: str,
) -> None:
    async with pair(redis_url) as p:
        prefix, q = p.app.prefix, p.app.queue()
        dead = await p.unsigned.queue().enqueue("pay", [666])
        async with Worker(p.app, concurrency=2):
            await wait_until(lambda: _a_signing_worker_registered(p.app), timeout=60)
            await wait_until(lambda: dead_as_bad_signature(p.app, dead.id), timeout=60)

            async def run(*args: str, key: str | None = None) -> Any:
                return await asyncio.to_thread(_cli, redis_url, prefix, *args, key=key)

            for args in (("enqueue", "pay", "--args", "[3]"), ("retry", "--all")):
                res = await run(*args)
                assert res.returncode == 2, res
                assert "sign their jobs" in res.stderr
                assert "--signing-key" in res.stderr
                assert res.stdout == ""
            assert (await q.counts())["queued"] == 0  # nothing was enqueued or requeued
            assert (await q.job_info(dead.id)).state is JobState.FAILED
            # with the key (the option, then the environment variable) it signs
            res = await run("enqueue", "pay", "--args", "[3]", "--signing-key", KEY)
            assert res.returncode == 0, res.stderr
            assert await q.job(res.stdout.strip()).result(timeout=60) == 3
            res = await run("enqueue", "pay", "--args", "[4]", key=KEY)
            assert res.returncode == 0, res.stderr
            four = res.stdout.strip()
            assert await q.job(four).result(timeout=60) == 4
        assert p.ran == [3, 4]
        # aioqueue job ID: the verified result with the key, the reason without it
        shown = _cli(redis_url, prefix, "job", four, key=KEY)
        assert re.search(r"^result\s+4$", shown.stdout, re.M), shown.stdout
        shown = _cli(redis_url, prefix, "job", four)
        assert re.search(r"^result\s+\(bad_signature: ", shown.stdout, re.M), shown.stdout
        helped = _cli(redis_url, prefix, "enqueue", "--help")
        assert "--signing-key" in helped.stdout
        assert "AIOQUEUE_SIGNING_KEY" in helped.stdout


async def test_a_planted_step_record_or_signal_never_feeds_a_task(
    redis_url: str, redis: Redis
) -> None:
    async with pair(redis_url) as p:

        @p.app.task(name="flow")
        async def flow() -> None:
            ctx = current_job()

            def charge() -> str:
                p.ran.append(("charge", ctx.id))
                return "real"

            value = await ctx.step("charge", charge)
            got = await ctx.wait_for_event("paid", timeout=600)
            p.ran.append(("used", value, got))

        q = p.app.queue()
        k = q._keys
        planted = await flow.options(delay=3600).enqueue()
        ct = await redis.hget(k.job(planted.id), "ct")
        assert ct is not None
        # a step result sealed with another key, for this very place
        forged = seal_value(p.wrong.codec, ("default", planted.id, "flow"), "st", "charge", "fake")
        await redis.hset(k.steps(planted.id), mapping={"ct": ct, "s:charge": forged})
        waiting = await flow.enqueue()
        async with Worker(p.app, concurrency=2):
            await q.promote([planted.id])
            await wait_until(functools.partial(dead_as_bad_signature, p.app, planted.id))

            async def parked() -> bool:
                return await waiting.state() is JobState.SCHEDULED

            await wait_until(parked, timeout=60, what="the genuine job waiting")
            assert await p.unsigned.signal("paid", 666) == 1  # an unsigned payload
            await wait_until(functools.partial(dead_as_bad_signature, p.app, waiting.id))
        assert p.ran == [("charge", waiting.id)]  # its own step ran; nothing planted was used


async def test_a_changed_unsigned_job_is_still_dead_lettered_never_run(redis_url: str) -> None:
    async with pair(redis_url) as p:
        job = await p.unsigned.queue().enqueue("pay", [666], delay=3600)
        async with Worker(p.app, concurrency=2):
            assert await p.unsigned.queue().job(job.id).change(priority=5, delay=0) is (
                JobState.QUEUED
            )
            await wait_until(functools.partial(dead_as_bad_signature, p.app, job.id))
        assert p.ran == []
