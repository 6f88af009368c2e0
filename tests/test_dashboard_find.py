"""The dashboard's finding and fixing (issue 29, point 3), over plain HTTP on a real server:
the search's bounded work with a cursor to continue, the bulk actions with a count and a
confirmation, the two roles, the job-id box, counts on every tab, previous-page links, and
the trends kept in Redis by the scripts and the workers' beats."""

from __future__ import annotations

import asyncio
import html
import re
from typing import Any, cast

import pytest

from aioqueue import App, JobState, Worker
from aioqueue.dashboard import basic_auth, create_app

from .support.waiting import wait_until
from .test_dashboard import AUTH, client, csrf_of

VIEWER = ("watcher", "pw-view")


def dashboard(app: App) -> Any:
    return create_app(app, auth=basic_auth(*AUTH, viewer=VIEWER))


def ids_in(page: str) -> set[str]:
    return set(re.findall(r'/jobs/([^"]+)">', page))


def link(page: str, rel: str) -> str:
    found = re.search(rf'rel="{rel}" href="([^"]+)"', page)
    assert found, f"no {rel} link"
    return html.unescape(found.group(1))


async def dead_letters(app: App, errors: dict[str, int]) -> dict[str, list[str]]:
    """Jobs dead-lettered by a burst worker, ``n`` of each error message: their ids."""

    @app.task(max_attempts=1)
    async def charge(order: int, why: str) -> None:
        raise RuntimeError(why)

    out: dict[str, list[str]] = {}
    for why, n in errors.items():
        calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [((i, why), {}) for i in range(n)]
        out[why] = [j.id for j in await charge.enqueue_many(calls)]
    await asyncio.wait_for(Worker(app, concurrency=20, burst=True).run(), 120)
    assert (await app.queue().counts())["failed"] == sum(errors.values())
    return out


# --------------------------------------------------------------------- bounded search
@pytest.mark.cluster
async def test_a_search_reads_at_most_its_budget_and_its_cursor_finds_every_match(
    app: App,
) -> None:
    q = app.queue()
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((f"order-{i}" + (" needle" if i % 250 == 7 else ""),), {}) for i in range(2500)
    ]

    @app.task
    async def ship(label: str) -> None: ...

    jobs = await ship.enqueue_many(calls)
    wanted = {j.id for j, c in zip(jobs, calls, strict=True) if "needle" in c[0][0]}
    assert len(wanted) == 10
    found: set[str] = set()
    cursor, rounds = None, 0
    while True:
        page = await q.search("queued", text="NEEDLE", cursor=cursor, budget=1000)
        rounds += 1
        assert page.scanned <= 1000
        found |= {s.id for s in page.items}
        cursor = page.cursor
        if cursor is None:
            break
    assert found == wanted
    assert rounds == 3  # 2,500 records at 1,000 a call
    # a search that matches early stops at its page size, its cursor going on from there
    page = await q.search("queued", cursor=None, limit=50)
    assert (len(page.items), page.scanned) == (50, 50)
    assert page.cursor is not None
    page = await q.search("queued", text="order", limit=50)  # every record matches
    assert 50 <= len(page.items) == page.scanned < 50 + 20
    assert page.cursor is not None


async def test_the_queue_page_says_how_much_it_searched_and_continues(app: App) -> None:
    q = app.queue()

    @app.task
    async def ship(label: str) -> None: ...

    await ship.enqueue_many(
        [((f"box {i}" + (" fragile" if i == 1500 else ""),), {}) for i in range(1600)]
    )
    async with client(dashboard(app)) as c:
        first = (await c.get("/queues/default?state=queued&text=fragile")).text
        assert "searched 1,000 of 1,600 queued jobs, continue for more" in first
        assert ids_in(first) == set()
        second = (await c.get(link(first, "next"))).text
        assert "searched 600 of 1,600 queued jobs to the end" in second
        (hit,) = ids_in(second)
        assert (await q.job_info(hit)).args == ("box 1500 fragile",)
        # the previous page's link leads back to the first window
        back = (await c.get(link(second, "prev"))).text
        assert "searched 1,000 of 1,600" in back


async def test_search_by_error_text_and_previous_links_over_pages(app: App) -> None:
    dead = await dead_letters(app, {"card declined": 60, "timeout talking to bank": 5})
    async with client(dashboard(app)) as c:
        page = (await c.get("/queues/default?state=failed&error=TIMEOUT")).text
        assert ids_in(page) == set(dead["timeout talking to bank"])
        # every tab has its count; plain paging: next, then previous back to the first page
        for state, n in (("failed", 65), ("queued", 0), ("completed", 0), ("cancelled", 0)):
            assert f'data-live="tab:{state}">{n}<' in page
        one = (await c.get("/queues/default?state=failed")).text
        two = (await c.get(link(one, "next"))).text
        assert not ids_in(one) & ids_in(two)
        assert ids_in(one) | ids_in(two) == set(
            dead["card declined"] + dead["timeout talking to bank"]
        )
        again = (await c.get(link(two, "prev"))).text
        assert ids_in(again) == ids_in(one)
        assert "Took</th>" in one  # the duration column of dead letters


# --------------------------------------------------------------------- bulk actions
async def test_retry_all_matching_shows_a_count_then_acts_on_confirmation(app: App) -> None:
    dead = await dead_letters(app, {"card declined": 4, "timeout talking to bank": 3})
    q = app.queue()
    async with client(dashboard(app)) as c:
        ask = await c.get("/queues/default/bulk?action=retry&state=failed&error=timeout")
        assert ask.status_code == 200
        assert re.search(r"<b data-count>3</b> matching", ask.text)
        assert (await q.counts())["failed"] == 7  # nothing happened yet
        token = await csrf_of(c, "/queues/default/bulk?action=retry&state=failed&error=timeout")
        form = {"action": "retry", "state": "failed", "error": "timeout", "csrf_token": token}
        done = await c.post("/queues/default/bulk", data=form)
        assert done.status_code == 303
        after = await c.get(done.headers["location"])
        assert "retry: 3 of 3 matching jobs" in after.text
        assert "Searched to the end" in after.text
        # no token: refused, nothing done
        refused = await c.post("/queues/default/bulk", data={**form, "csrf_token": "x"})
        assert refused.status_code == 403
    for job_id in dead["timeout talking to bank"]:
        assert (await q.job_info(job_id)).state is JobState.QUEUED
    for job_id in dead["card declined"]:
        assert (await q.job_info(job_id)).state is JobState.FAILED


async def test_delete_all_matching_goes_window_by_window(app: App) -> None:
    q = app.queue()

    @app.task
    async def later(n: int) -> None: ...

    jobs = await later.enqueue_many([((i,), {}) for i in range(2300)])
    assert len(jobs) == 2300
    async with client(dashboard(app)) as c:
        url = "/queues/default/bulk?action=delete&state=queued&task=later"
        token = await csrf_of(c, url)
        steps = 0
        while True:
            page = (await c.get(url)).text
            if "Searched to the end" in page:
                break
            count = int(re.search(r"<b data-count>(\d+)</b>", page).group(1))  # type: ignore[union-attr]
            assert count <= 1000
            form = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page))
            form["csrf_token"] = token
            r = await c.post("/queues/default/bulk", data=form)
            url = r.headers["location"]
            steps += 1
            assert steps <= 5
        assert "Done so far: 2300 jobs." in page
    assert steps == 3
    assert (await q.counts())["queued"] == 0


# --------------------------------------------------------------------- roles, job-id box
async def test_the_viewer_sees_everything_and_can_do_nothing(app: App) -> None:
    await dead_letters(app, {"card declined": 2})
    web = dashboard(app)
    async with client(web, VIEWER) as c:
        page = await c.get("/queues/default?state=failed")
        assert page.status_code == 200
        assert "card declined" in page.text
        assert ">viewer<" in page.text
        assert 'method="post"' not in page.text
        assert "all matching" not in page.text
        # its POSTs: 403, with or without a token of its session
        token = (await c.get("/")).cookies  # a session, but no form carries a token
        assert token is not None
        for path, form in (
            ("/queues/default/actions", {"action": "retry:all", "state": "failed"}),
            ("/queues/default/bulk", {"action": "retry", "state": "failed"}),
        ):
            r = await c.post(path, data=form)
            assert r.status_code == 403, path
        assert (await c.get("/queues/default/bulk?action=retry&state=failed")).status_code == 403
    async with client(web) as c:  # the admin has the buttons
        page = await c.get("/queues/default?state=failed")
        assert 'method="post"' in page.text
        assert "Retry all matching" in page.text
    assert (await app.queue().counts())["failed"] == 2
    with pytest.raises(ValueError, match="own"):
        basic_auth("ops", "a", viewer=("ops", "b"))


async def test_the_job_id_box_goes_to_the_job_in_its_queue(app: App) -> None:
    job = await app.queue("mail").enqueue("send", [1])
    await app.queue("default").enqueue("other", [2])
    web = create_app(app, auth=basic_auth(*AUTH), queues=["default", "mail"])
    async with client(web) as c:
        r = await c.get("/find", params={"id": f"  {job.id} "})
        assert r.status_code == 303
        assert r.headers["location"] == f"/queues/mail/jobs/{job.id}"
        missing = await c.get("/find", params={"id": "no-such-job"})
        assert missing.status_code == 404
        assert "no job &#39;no-such-job&#39; in any queue" in missing.text
        assert (await c.get("/find", params={"id": "x" * 5000})).status_code == 400
        home = (await c.get("/")).text
        assert 'action="/find"' in home
        assert 'rel="icon" href="/static/favicon.svg"' in home
        assert (await c.get("/static/favicon.svg")).headers["content-type"].startswith("image/svg")


async def test_the_job_page_has_no_empty_traceback_box(app: App) -> None:
    job = await app.queue().enqueue("send", [1])
    async with client(dashboard(app)) as c:
        page = (await c.get(f"/queues/default/jobs/{job.id}")).text
        assert re.search(r'<div class="traceback-box" data-hide-empty\s+hidden>', page)


# --------------------------------------------------------------------- trends
@pytest.mark.cluster
async def test_trends_count_per_queue_and_task_and_the_beat_samples_the_backlog(
    app: App,
) -> None:
    @app.task(max_attempts=1)
    async def good(n: int) -> int:
        return n

    @app.task(max_attempts=1)
    async def bad(n: int) -> None:
        raise ValueError(n)

    q = app.queue()
    await q.pause()  # the jobs wait: a backlog for the worker's beat to sample
    await good.enqueue_many([((i,), {}) for i in range(33)])
    await bad.enqueue_many([((i,), {}) for i in range(4)])
    async with Worker(app, concurrency=4):

        async def sampled() -> bool:
            return any(p.backlog == 37 for p in (await q.trends("hour")).points[-2:])

        await wait_until(sampled, timeout=30, what="the beat's backlog sample")
    await q.resume()
    await asyncio.wait_for(Worker(app, concurrency=8, burst=True).run(), 120)
    for span in ("hour", "day", "week"):
        t = await q.trends(span)
        assert sum(p.completed for p in t.points) == 33, span
        assert sum(p.failed for p in t.points) == 4, span
        assert {k: sum(p.completed for p in v) for k, v in t.tasks.items()} == {
            "good": 33,
            "bad": 0,
        }
        assert sum(p.failed for p in t.tasks["bad"]) == 4
        assert len(t.points) == {"hour": 60, "day": 24, "week": 168}[span]
    assert max(p.backlog or 0 for p in (await q.trends("day")).points) == 37
    assert max(p.wait or 0 for p in (await q.trends("hour")).points) > 0
    async with client(dashboard(app)) as c:
        page = await c.get("/queues/default/trends?span=day")
        assert page.status_code == 200
        assert '<div class="num" id="sum-completed">33</div>' in page.text
        one = await c.get("/queues/default/trends?span=week&task=bad")
        assert '<div class="num" id="sum-failed">4</div>' in one.text
        assert (await c.get("/queues/default/trends?span=year")).status_code == 400


async def test_a_tasks_trend_shows_its_backlog_and_the_longest_wait_of_its_starts(
    app: App,
) -> None:
    """Per task: the backlog the workers' beats sample (the exact count, Queue.backlog) and
    the longest wait (from due to start) of its jobs started in the bucket, written by the
    claim and taken by the next sample (lib/trends.lua task_sample)."""

    @app.task
    async def slow(n: int) -> int:
        return n

    @app.task
    async def quick(n: int) -> int:
        return n

    q = app.queue()
    await q.pause()
    await slow.enqueue_many([((i,), {}) for i in range(12)])
    await quick.enqueue_many([((i,), {}) for i in range(3)])
    async with Worker(app, concurrency=4):

        async def sampled() -> bool:
            t = await q.trends("hour")
            return any(p.backlog == 12 for p in t.tasks.get("slow", ())[-2:])

        await wait_until(sampled, timeout=30, what="the beat's per-task backlog sample")
        t = await q.trends("hour")
        assert max(p.backlog or 0 for p in t.tasks["quick"]) == 3
        await q.resume()

        async def waited() -> bool:
            t = await q.trends("hour")
            started = [t.tasks.get(n, ()) for n in ("slow", "quick")]
            return all(any((p.wait or 0) > 0 for p in points) for points in started)

        await wait_until(waited, timeout=60, what="the per-task waits sampled")
    t = await q.trends("day")
    assert max(p.backlog or 0 for p in t.tasks["slow"]) == 12
    slow_wait = max(p.wait or 0 for p in t.tasks["slow"])
    assert 0 < slow_wait < 600
    async with client(dashboard(app)) as c:
        one = await c.get("/queues/default/trends?span=day&task=slow")
        assert one.status_code == 200
        assert one.text.count('<svg class="chart') == 4  # a task's backlog and wait too
        assert "Longest wait" in one.text


async def test_a_bucket_counts_at_most_its_tasks_by_name(app: App) -> None:
    """Many task names: a bucket holds 100 counts by name, later tasks count together as
    '*'; a trend lists the 50 busiest."""
    q = app.queue()
    for i in range(130):

        @app.task(name=f"t{i:03d}")
        async def one() -> None: ...

        await q.enqueue(f"t{i:03d}")
    await asyncio.wait_for(Worker(app, concurrency=8, burst=True).run(), 120)
    t = await q.trends("day")  # one bucket, unless the hour turned meanwhile
    assert sum(p.completed for p in t.points) == 130
    assert len(t.tasks) == 50
    k = q._keys
    hour = await q._scripts.server_ms() // 3_600_000
    named = star = 0
    for h in (hour - 1, hour):  # the hour may have turned meanwhile
        got = cast(dict[bytes, bytes], await app.redis.hgetall(k.trend("h", h)))
        raw = {f.decode(): int(v) for f, v in got.items()}
        assert len(raw) <= 101  # 100 fields, then the '*' of the later tasks
        named += sum(1 for f in raw if f.startswith("c:t"))
        star += raw.get("c:*", 0)
        if sum(v for f, v in raw.items() if f.startswith("c:")) > 100:
            assert raw["c:*"] > 0
    assert named + star == 130
    # the minute's bucket has a TTL (the minute may have turned since the completions: then
    # the last minute's holds them and this one is not made yet)
    minute = await q._scripts.server_ms() // 60_000
    ttls = [await app.redis.pttl(k.trend("m", m)) for m in (minute - 1, minute)]
    assert all(ttl == -2 or 0 < ttl <= 3_660_000 for ttl in ttls), ttls
    assert any(ttl > 0 for ttl in ttls), ttls


async def test_the_limiters_page_shows_a_key_and_the_admin_changes_it(app: App) -> None:
    app.limiter("stripe", rate=(100, 1.0))
    app.limiter("per_customer", rate=(1, 600.0), concurrency=2, key=lambda who: who)

    @app.task(limits=["per_customer"])
    async def charge(who: str) -> None: ...

    await charge.enqueue("ann")
    await charge.enqueue("ann")
    q = app.queue()
    assert len(await q.reserve(2)) == 1  # ann's rate admits one; the other waits aside
    web = dashboard(app)
    async with client(web, VIEWER) as c:
        page = await c.get("/limiters")
        assert page.status_code == 200
        assert "stripe" in page.text
        assert "100 per 1 s" in page.text
        shown = await c.get("/limiters?name=per_customer&key=ann")
        assert re.search(r'id="holders">1<', shown.text)  # the leased job holds a slot
        assert re.search(r'id="waiting">1<', shown.text)  # the second waits aside
        assert 'id="limiter-set"' not in shown.text  # a viewer changes nothing
        r = await c.post("/limiters", data={"name": "per_customer", "burst": "3"})
        assert r.status_code == 403
    async with client(web) as c:
        token = await csrf_of(c, "/limiters?name=per_customer&key=ann")
        form = {
            "name": "per_customer",
            "key": "ann",
            "rate_n": "5",
            "rate_s": "1",
            "csrf_token": token,
        }
        done = await c.post("/limiters", data=form)
        assert done.status_code == 303
        after = await c.get(done.headers["location"])
        assert "per_customer: changed" in after.text
        assert "ms=1000" in after.text
        assert "n=5" in after.text
        assert (await app.limiters.state("per_customer", "ann")).overrides["n"] == "5"
        back = await c.post("/limiters", data={**form, "reset": "1"})
        assert back.status_code == 303
        assert not (await app.limiters.state("per_customer", "ann")).overrides
        bad = await c.post("/limiters", data={**form, "name": "nope"})
        assert bad.status_code == 400
