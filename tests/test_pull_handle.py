"""Reservation handles (``_handle.py``): a reservation as a short string that another App, in
another request or process, turns back into a reservation to complete, fail, release or
extend; garbled, tampered and foreign handles are refused, stale ones lose their lease."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import os
import sys
import textwrap
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from aioqueue import (
    App,
    Batch,
    ConfigurationError,
    InvalidHandle,
    JobFailed,
    JobState,
    LeaseLost,
    Queue,
    Reservation,
)

from .support.apps import open_app, unique_prefix
from .support.invariants import check_invariants

KEY = "handle-key-" + "x" * 16
OLD_KEY = "older-key-" + "y" * 16


async def reserve_one(queue: Queue, **kwargs: Any) -> Reservation:
    got = await queue.reserve(**kwargs)
    assert len(got) == 1, f"expected one reservation, got {got}"
    return got[0]


def edit_body(handle: str, change: Callable[[list[Any]], None]) -> str:
    """``handle`` with its fields edited (its MAC, if any, kept as it was)."""
    head, _, rest = handle.partition(".")
    body_text, dot, mac = rest.partition(".")
    fields = json.loads(base64.urlsafe_b64decode(body_text + "=" * (-len(body_text) % 4)))
    change(fields)
    body = base64.urlsafe_b64encode(json.dumps(fields).encode()).rstrip(b"=").decode()
    return f"{head}.{body}{dot}{mac}"


@pytest.mark.parametrize("signing_key", [None, KEY], ids=["unsigned", "signed"])
async def test_a_handle_completes_the_job_from_another_app(
    redis_url: str, redis: Redis, signing_key: str | None
) -> None:
    prefix = unique_prefix()
    async with (
        open_app(redis_url, prefix=prefix, signing_key=signing_key) as web1,
        open_app(redis_url, prefix=prefix, signing_key=signing_key) as web2,
    ):
        job = await web1.queue("review").enqueue("review_photo", ["p1"], max_attempts=3)
        r = await reserve_one(web1.queue("review"), lease=60)
        handle = r.handle()
        assert handle.startswith("aq1s." if signing_key else "aq1.")
        assert len(handle) < 250
        assert handle.isascii()
        assert handle == r.handle()  # the same reservation, the same handle

        again = web2.queue("review").reservation_from(handle)
        assert (again.id, again.token, again.task, again.queue) == (
            job.id,
            r.token,
            "review_photo",
            "review",
        )
        assert (again.attempt, again.max_attempts) == (1, 3)
        assert (again.args, again.kwargs) == ((), {})  # not carried: read them by id
        assert again.handle() == handle

        await web2.queue("review").extend(again, lease=120)
        await web2.queue("review").complete(again, {"approved": True})
        assert await job.result(timeout=10) == {"approved": True}
        assert await check_invariants(redis, web1.queue("review")._keys) == {job.id: "completed"}


async def test_a_handle_works_in_another_process(redis_url: str, redis: Redis) -> None:
    prefix = unique_prefix()
    async with open_app(redis_url, prefix=prefix, signing_key=KEY) as app:
        job = await app.queue().enqueue("moderate", ["p2"])
        handle = (await reserve_one(app.queue(), lease=60)).handle()
        script = textwrap.dedent(
            """
            import asyncio, sys
            from aioqueue import App

            async def main() -> None:
                url, prefix, key, handle = sys.argv[1:]
                async with App(url, prefix=prefix, signing_key=key) as app:
                    q = app.queue()
                    await q.complete(q.reservation_from(handle), "done elsewhere")

            asyncio.run(main())
            """
        )
        env = {**os.environ, "PYTHONPATH": os.getcwd()}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            script,
            redis_url,
            prefix,
            KEY,
            handle,
            env=env,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(proc.communicate(), timeout=120)
        assert proc.returncode == 0, err.decode()
        assert await job.result(timeout=10) == "done elsewhere"


async def test_release_and_fail_through_handles(app: App) -> None:
    q = app.queue()
    job = await q.enqueue("t", max_attempts=2)
    first = await reserve_one(q, lease=60)
    await q.release(q.reservation_from(first.handle()))
    assert await job.state() is JobState.QUEUED
    second = await reserve_one(q, lease=60)
    assert second.attempt == 1  # release refunds the attempt
    assert await q.fail(q.reservation_from(second.handle()), "nope", retry=True, delay=0)
    third = await reserve_one(q, wait=10, lease=60)
    assert third.attempt == 2
    assert not await q.fail(q.reservation_from(third.handle()), "still nope")  # last attempt
    with pytest.raises(JobFailed, match="still nope"):
        await job.result(timeout=10)


async def test_a_stale_handle_answers_lease_lost_like_its_token(
    redis_url: str, redis: Redis
) -> None:
    prefix = unique_prefix()
    async with open_app(redis_url, prefix=prefix, signing_key=KEY) as app:
        q = app.queue()
        job = await q.enqueue("t")
        old = await reserve_one(q, lease=0.3)
        stale = old.handle()
        new = await reserve_one(q, wait=10, lease=60)  # blocks until the lease runs out
        assert (new.id, new.attempt) == (job.id, 2)
        calls: list[Callable[[Reservation], Awaitable[Any]]] = [
            lambda r: q.complete(r, "late"),
            lambda r: q.fail(r, "late"),
            q.release,
            q.extend,
        ]
        for call in calls:
            with pytest.raises(LeaseLost):
                await call(q.reservation_from(stale))
        await q.complete(q.reservation_from(new.handle()), "on time")
        assert await job.result(timeout=10) == "on time"


async def test_garbage_is_refused_with_a_typed_error(app: App) -> None:
    q = app.queue()
    await q.enqueue("t")
    handle = (await reserve_one(q, lease=60)).handle()
    body = handle[len("aq1.") :]
    bad: list[Any] = [
        "",
        "hello",
        "aq1.",
        "aq1.!!!",
        "aq1." + body[:-5],  # cut
        "aq2." + body,
        "aq1." + base64.urlsafe_b64encode(b"[1,2,3]").decode(),
        "aq1." + base64.urlsafe_b64encode(b'{"a": 1}').decode(),
        "aq1." + base64.urlsafe_b64encode("é".encode()).decode(),
        edit_body(handle, lambda f: f.__setitem__(4, 0)),  # attempt 0
        edit_body(handle, lambda f: f.__setitem__(5, "3")),  # attempts not a number
        edit_body(handle, lambda f: f.__setitem__(1, "")),  # no job id
        edit_body(handle, lambda f: f.__setitem__(2, "")),  # no token
        edit_body(handle, lambda f: f.__setitem__(6, {"timeout": 1})),  # an option not kept
        "aq1." + "A" * 5000,
        "aq1.\uff41\uff42\uff43",  # not ASCII
        None,
        b"aq1." + body.encode(),
    ]
    for text in bad:
        with pytest.raises(InvalidHandle):
            q.reservation_from(text)
    assert issubclass(InvalidHandle, ValueError)


async def test_a_handle_of_another_queue_is_refused(redis_url: str) -> None:
    for key in (None, KEY):
        async with open_app(redis_url, signing_key=key) as app:
            await app.queue("a").enqueue("t")
            handle = (await reserve_one(app.queue("a"), lease=60)).handle()
            with pytest.raises(InvalidHandle, match="is for queue 'a', not 'b'"):
                app.queue("b").reservation_from(handle)
            # with a key, editing the queue in the handle breaks its signature
            moved = edit_body(handle, lambda f: f.__setitem__(0, "b"))
            with pytest.raises(InvalidHandle, match="signature" if key else "for queue 'b'"):
                app.queue("a").reservation_from(moved)
            if key:
                with pytest.raises(InvalidHandle, match="signature"):
                    app.queue("b").reservation_from(moved)


async def test_signed_handles_cannot_be_edited_or_moved(redis_url: str) -> None:
    prefix = unique_prefix()
    async with (
        open_app(redis_url, prefix=prefix, signing_key=KEY) as app,
        open_app(redis_url, prefix=prefix) as unsigned,
        open_app(redis_url, prefix=prefix, signing_key="another-key-" + "z" * 16) as other_key,
        open_app(redis_url, signing_key=KEY) as other_prefix,
    ):
        q = app.queue()
        await q.enqueue("t")
        r = await reserve_one(q, lease=60)
        handle = r.handle()
        edits = [
            edit_body(handle, lambda f: f.__setitem__(1, "another-job")),
            edit_body(handle, lambda f: f.__setitem__(3, "other.task")),
            edit_body(handle, lambda f: f.__setitem__(4, 7)),
            edit_body(handle, lambda f: f.__setitem__(6, {"member": ["default", "b1"]})),
            handle[:-2] + ("AA" if not handle.endswith("AA") else "BB"),  # the MAC
            handle.rpartition(".")[0],  # no MAC
            "aq1." + handle[len("aq1s.") :].rpartition(".")[0],  # passed off as unsigned
        ]
        for edited in edits:
            with pytest.raises(InvalidHandle, match=r"signature|not signed"):
                q.reservation_from(edited)
        with pytest.raises(InvalidHandle, match="no signing_key"):
            unsigned.queue().reservation_from(handle)
        with pytest.raises(InvalidHandle, match="signature"):
            other_key.queue().reservation_from(handle)
        with pytest.raises(InvalidHandle, match="signature"):  # the prefix is signed too
            other_prefix.queue().reservation_from(handle)
        async with open_app(
            redis_url, prefix=prefix, signing_key="new-key-" + "n" * 16, verify_keys=[KEY]
        ) as rotated:  # key rotation: handles signed with an older key still work
            await rotated.queue().complete(rotated.queue().reservation_from(handle), "ok")


async def test_without_a_key_a_handle_is_as_secret_as_its_token(app: App) -> None:
    """An unsigned handle can be edited, but a lease is only ever taken with its token."""
    q = app.queue()
    job = await q.enqueue("t")
    r = await reserve_one(q, lease=60)
    guessed = edit_body(r.handle(), lambda f: f.__setitem__(2, "1-00000000"))
    with pytest.raises(LeaseLost):
        await q.complete(q.reservation_from(guessed), "forged")
    assert await job.state() is JobState.ACTIVE


async def test_a_batch_member_completed_by_handle_feeds_its_signed_batch(redis_url: str) -> None:
    async with open_app(redis_url, signing_key=KEY) as app:

        @app.task
        async def label(photo: str) -> str:
            return photo

        batch: Batch[Any] = await app.batch([label.call("a")], retention=60, queue="home")
        q = app.queue()
        r = await reserve_one(q, lease=60)
        assert "member" in r.options
        again = q.reservation_from(r.handle())
        assert again.options == {"member": r.options["member"]}
        await q.complete(again, "labelled")
        await batch.wait(timeout=10)
        (item,) = await batch.results()  # verified as made for this batch
        assert (item.ok, item.result) == (True, "labelled")


async def test_result_retention_travels_with_the_handle(app: App, redis: Redis) -> None:
    q = app.queue()
    job = await q.enqueue("t", result_ttl=1000)
    r = await reserve_one(q, lease=60)
    again = q.reservation_from(r.handle())
    assert again.options == {"result_ttl": 1000.0}
    await q.complete(again, "kept")
    ttl = await redis.pttl(q._keys.job(job.id))
    assert 900_000 < ttl <= 1_000_000


async def test_a_reservation_built_by_hand_has_no_handle(app: App) -> None:
    r = Reservation("id", "1-ab", "t", (), {}, 1, 1, "default")
    with pytest.raises(ConfigurationError, match="by hand"):
        r.handle()
    await app.queue().enqueue("t", [1])
    held = await reserve_one(app.queue(), lease=60)
    # the queue it came from is no field: compared, shown, copied and dumped as before
    assert "Queue" not in repr(held)
    assert dataclasses.asdict(held)["args"] == (1,)
    assert set(dataclasses.asdict(held)) == {f.name for f in dataclasses.fields(held)}
    assert held == dataclasses.replace(held)
    assert held == Reservation(*(getattr(held, f.name) for f in dataclasses.fields(held)))
    with pytest.raises(ConfigurationError, match="by hand"):
        dataclasses.replace(held).handle()
