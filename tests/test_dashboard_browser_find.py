"""The dashboard's round 2 in a real browser (Debian's Chromium driven by Playwright, the
dashboard under uvicorn, a real server): the job-id box, the search, retry-all with its
confirmation, the two roles, a phone's width and dark mode. With ``AIOQUEUE_SHOTS=<dir>`` the
tests save screenshots of what they look at there."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from aioqueue import App, JobState, Worker
from aioqueue.dashboard import basic_auth, create_app
from aioqueue.dashboard._data import took

from .support.browser import browser_page, serve
from .support.waiting import wait_until

pytestmark = pytest.mark.slow

ADMIN = {"username": "ops", "password": "s3cret-pass"}
VIEWER = {"username": "watcher", "password": "view-only-pass"}


async def shot(page: Any, name: str, full_page: bool = True) -> None:
    """A screenshot into $AIOQUEUE_SHOTS, when it is set."""
    where = os.environ.get("AIOQUEUE_SHOTS")
    if where:  # playwright makes the folder
        await page.screenshot(path=str(Path(where) / f"{name}.png"), full_page=full_page)


@pytest.fixture
async def failing(app: App) -> tuple[App, dict[str, list[str]]]:
    """Dead letters of two kinds (a card declined, a bank timeout) and some completed jobs;
    a limiter declared (the limiters' page)."""
    app.limiter("bank", rate=(10, 1.0), concurrency=5)

    @app.task(max_attempts=1)
    async def charge(order: int, customer: str) -> str:
        if order % 3 == 0:
            raise TimeoutError(f"bank did not answer for order {order}")
        if order % 3 == 1:
            raise ValueError(f"card declined for {customer}")
        return f"receipt-{order}"

    jobs = await charge.enqueue_many([((i, f"customer-{i}@example.com"), {}) for i in range(30)])
    await asyncio.wait_for(Worker(app, concurrency=10, burst=True).run(), 120)
    kinds: dict[str, list[str]] = {"timeout": [], "declined": [], "ok": []}
    for i, j in enumerate(jobs):
        kinds[("timeout", "declined", "ok")[i % 3]].append(j.id)
    return app, kinds


@pytest.fixture
async def site(failing: tuple[App, dict[str, list[str]]]) -> AsyncIterator[str]:
    app, _ = failing
    web = create_app(
        app,
        auth=basic_auth(ADMIN["username"], ADMIN["password"], viewer=tuple(VIEWER.values())),  # type: ignore[arg-type]
        poll_seconds=0.5,
    )
    async with serve(web) as url:
        yield url


async def test_the_job_id_box_goes_straight_to_the_job(
    failing: tuple[App, dict[str, list[str]]], site: str
) -> None:
    _, kinds = failing
    target = kinds["declined"][2]
    async with browser_page(http_credentials=ADMIN) as page:
        await page.goto(site + "/")
        await shot(page, "overview")
        await page.fill("form.find input[name=id]", target)
        await page.press("form.find input[name=id]", "Enter")
        await page.wait_for_url(f"**/queues/default/jobs/{target}")
        assert "card declined for customer-7@example.com" in await page.inner_text("#error")
        assert await page.locator(".traceback-box").is_visible()
        await shot(page, "job")
        await page.fill("form.find input[name=id]", "nope-not-a-job")
        await page.press("form.find input[name=id]", "Enter")
        await page.wait_for_selector("text=no job 'nope-not-a-job' in any queue")


async def test_search_by_error_and_argument_text(
    failing: tuple[App, dict[str, list[str]]], site: str
) -> None:
    _, kinds = failing
    async with browser_page(http_credentials=ADMIN) as page:
        await page.goto(site + "/queues/default?state=failed")
        assert await page.locator("[data-live='tab:failed']").inner_text() == "20"
        assert await page.locator("[data-live='tab:completed']").inner_text() == "10"
        await page.fill("input[name=error]", "bank did not")
        await page.click("button:text-is('Search')")
        await page.wait_for_selector("#scanned:has-text('searched 20 of 20 failed jobs')")
        rows = page.locator("table.jobs tbody tr")
        assert await rows.count() == 10
        shown = {await a.inner_text() for a in await page.locator("table.jobs tbody a").all()}
        assert shown == set(kinds["timeout"])
        await shot(page, "search")
        # argument text: one customer's e-mail
        await page.fill("input[name=error]", "")
        await page.fill("input[name=text]", "customer-13@")
        await page.click("button:text-is('Search')")
        await page.wait_for_selector("#scanned:has-text('1 found')")
        assert await page.locator("table.jobs tbody a").inner_text() == kinds["declined"][4]


async def test_retry_all_matching_asks_with_a_count_then_retries_them(
    failing: tuple[App, dict[str, list[str]]], site: str
) -> None:
    app, kinds = failing
    q = app.queue()
    await q.pause()  # the retried jobs wait, so that their state can be checked
    async with browser_page(http_credentials=ADMIN) as page:
        await page.goto(site + "/queues/default?state=failed&error=declined")
        await page.click("a[data-bulk=retry]")
        await page.wait_for_selector("#bulk-count")
        assert await page.locator("[data-count]").inner_text() == "10"
        assert (await q.counts())["failed"] == 20  # asked, not done
        await shot(page, "retry-confirm")
        await page.click("#confirm")
        await page.wait_for_selector(".flash:has-text('retry: 10 of 10 matching jobs')")
        assert "Done so far: 10 jobs." in await page.inner_text("#done-so-far")
    for job_id in kinds["declined"]:
        assert (await q.job_info(job_id)).state is JobState.QUEUED
    for job_id in kinds["timeout"]:
        assert (await q.job_info(job_id)).state is JobState.FAILED


async def test_the_viewer_sees_no_action_and_its_post_is_refused(
    failing: tuple[App, dict[str, list[str]]], site: str
) -> None:
    app, kinds = failing
    async with browser_page(http_credentials=VIEWER) as page:
        await page.goto(site + "/queues/default?state=failed")
        assert await page.locator(".badge.ro").inner_text() == "viewer"
        assert (
            await page.locator("form[method=post], button[name=action], a[data-bulk]").count() == 0
        )
        await page.goto(site + f"/queues/default/jobs/{kinds['timeout'][0]}")
        assert await page.locator("button").count() == 0
        # a forged POST from the viewer's own session: 403
        status = await page.evaluate(
            """async (url) => (await fetch(url, {method: "POST",
                headers: {"Content-Type": "application/x-www-form-urlencoded"},
                body: "action=retry%3Aall&state=failed"})).status""",
            site + "/queues/default/actions",
        )
        assert status == 403
    assert (await app.queue().counts())["failed"] == 20


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/queues/default?state=failed",
        "/workers",
        "/dead",
        "/queues/default/trends",
        "/limiters?name=bank",
    ],
)
async def test_a_phone_has_no_horizontal_page_scroll(site: str, path: str) -> None:
    async with browser_page(
        http_credentials=ADMIN, viewport={"width": 375, "height": 800}, is_mobile=True
    ) as page:
        await page.goto(site + path)
        width = await page.evaluate("document.documentElement.scrollWidth")
        assert width <= 375, f"{path}: the page is {width}px wide"
        if path.startswith("/queues/default?"):
            await shot(page, "phone", full_page=False)
            # the jobs' table scrolls in its own box
            box = page.locator(".table-box").first
            assert await box.evaluate("el => getComputedStyle(el).overflowX") == "auto"


async def test_dark_mode_follows_the_system(
    failing: tuple[App, dict[str, list[str]]], site: str
) -> None:
    _, kinds = failing
    for scheme, dark in (("light", False), ("dark", True)):
        async with browser_page(http_credentials=ADMIN, color_scheme=scheme) as page:
            await page.goto(site + f"/queues/default/jobs/{kinds['timeout'][0]}")
            rgb = await page.evaluate("getComputedStyle(document.body).backgroundColor")
            r, g, b = (int(x) for x in rgb[rgb.index("(") + 1 : rgb.index(")")].split(",")[:3])
            assert (r + g + b < 3 * 60) is dark, (scheme, rgb)
            panel = await page.evaluate(
                "getComputedStyle(document.querySelector('.panel')).backgroundColor"
            )
            assert panel != rgb
            if dark:
                await shot(page, "dark-job")
                await page.goto(site + "/")
                await shot(page, "dark-overview")


async def test_trends_and_the_queue_page_render(
    failing: tuple[App, dict[str, list[str]]], site: str
) -> None:
    async with browser_page(http_credentials=ADMIN) as page:
        await page.goto(site + "/queues/default?state=completed")
        assert await page.locator("table.jobs th:text-is('Took')").count() == 1
        await shot(page, "queue")
        await page.click("a.sub-link:text-is('Trends')")
        await page.wait_for_selector("#sum-completed")
        assert await page.inner_text("#sum-completed") == "10"
        assert await page.inner_text("#sum-failed") == "20"
        assert await page.locator("svg.chart").count() == 4
        await shot(page, "trends-queue")
        await page.click("#task-trends a:text-is('charge')")
        await page.wait_for_selector("h1:has-text('task charge')")
        await shot(page, "trends")


async def test_a_tasks_trend_shows_its_backlog_and_wait(app: App) -> None:
    """Per task (issue 29 point 3): the backlog the workers sampled (the exact count) and the
    longest wait of its jobs started, as cards, charts and columns of the per-task table."""

    @app.task
    async def invoice(n: int) -> int:
        return n

    q = app.queue()
    await q.pause()
    await invoice.enqueue_many([((i,), {}) for i in range(9)])
    async with Worker(app, concurrency=4):

        async def sampled() -> bool:
            return any(p.backlog == 9 for p in (await q.trends("hour")).tasks.get("invoice", ()))

        await wait_until(sampled, timeout=60, what="the task's backlog sampled")
        await q.resume()

        async def waited() -> bool:
            points = (await q.trends("hour")).tasks.get("invoice", ())
            return any((p.wait or 0) > 0 for p in points)

        await wait_until(waited, timeout=60, what="the task's wait sampled")
    web = create_app(app, auth=basic_auth(ADMIN["username"], ADMIN["password"]))
    points = (await q.trends("day")).tasks["invoice"]
    assert max(p.backlog or 0 for p in points) == 9
    # the table shows the newest sampled bucket's (the hour may turn: read as the page does)
    newest = next(p for p in reversed(points) if p.backlog is not None)
    longest = max(p.wait or 0 for p in points)
    async with serve(web) as site, browser_page(http_credentials=ADMIN) as page:
        await page.goto(site + "/queues/default/trends?span=day")
        await page.wait_for_selector("#task-trends")
        row = page.locator("#task-trends tbody tr", has_text="invoice")
        cells = await row.locator("td").all_inner_texts()
        assert cells[3] == str(newest.backlog)
        assert cells[4] == took(0, round(longest * 1000))  # "14ms", not "0.0s"
        await page.click("#task-trends a:text-is('invoice')")
        await page.wait_for_selector("h1:has-text('task invoice')")
        assert await page.locator("svg.chart").count() == 4  # completed, failed, backlog, wait
        await shot(page, "trends-task-backlog")
