"""The dashboard in a real browser: Debian's Chromium driven by Playwright, against the
dashboard served by uvicorn on a free port and a real worker process (``tests.dashapp``).

Without chromium these tests skip, except under ``CI=true`` where they fail
(``tests/support/browser.py``)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from aioqueue import App, JobState
from aioqueue.dashboard import basic_auth, create_app

from .support.browser import browser_page, serve
from .support.processes import WorkerProcesses
from .support.waiting import wait_until

pytestmark = pytest.mark.slow

CREDS = {"username": "ops", "password": "s3cret-pass"}
DASHAPP = "tests.dashapp:app"


@pytest.fixture
def dash_workers(workers: WorkerProcesses) -> WorkerProcesses:
    workers.app = DASHAPP
    return workers


@pytest.fixture
async def site(producer: App) -> AsyncIterator[str]:
    """The dashboard of the workers' prefix, with basic auth, served on a free port."""
    web = create_app(producer, auth=basic_auth(CREDS["username"], CREDS["password"]))
    async with serve(web) as url:
        yield url


async def _state(app: App, job_id: str) -> JobState:
    return (await app.queue().job_info(job_id)).state


async def _wait_state(app: App, job_id: str, state: JobState, timeout: float = 60) -> None:
    async def reached() -> bool:
        return await _state(app, job_id) is state

    await wait_until(reached, timeout=timeout, interval=0.1, what=f"job {job_id} {state}")


async def test_overview_queue_failed_job_retry_then_the_job_completes_live(
    dash_workers: WorkerProcesses, producer: App, site: str
) -> None:
    dash_workers.start()
    job = await producer.queue().enqueue("flaky", [101], max_attempts=1)
    await _wait_state(producer, job.id, JobState.FAILED)
    async with browser_page(http_credentials=CREDS) as page:
        await page.goto(site + "/")
        # the overview counts the dead letter and lists the queue
        await page.wait_for_selector('[data-live="q:default:failed"]:text-is("1")')
        await page.click("a.qname:text-is('default')")
        await page.click("a.tab[data-state-tab=failed]")
        assert "state=failed" in page.url
        row = page.locator("table.jobs tbody tr", has_text=job.id)
        assert "mail server refused order 101" in await row.inner_text()
        await row.locator(f"a:text-is('{job.id}')").click()
        # the job: its arguments, error and traceback
        assert await page.locator("[data-live=state]").inner_text() == "failed"
        assert "101" in await page.locator("#args").inner_text()
        tb = await page.locator("#traceback").inner_text()
        assert "Traceback (most recent call last)" in tb
        assert "ConnectionError: mail server refused order 101" in tb
        # the queue paused meanwhile, so that the job waits after the retry
        await producer.queue().pause()
        await page.click("button[value=retry]")
        await page.wait_for_selector("[data-live=state]:text-is('queued')")
        assert "retry: 1 of 1 selected jobs" in await page.inner_text(".flash")
        await page.evaluate("window.__same_page = true")
        await producer.queue().resume()
        # live updates (no reload: the page's marker stays) show it run again and complete
        await page.wait_for_selector("[data-live=state]:text-is('completed')", timeout=60_000)
        assert await page.evaluate("window.__same_page") is True
        await page.wait_for_selector("#result:has-text('invoice-101')")
        history = await page.locator("tbody[data-live-table=history]").inner_text()
        assert "failed" in history
        assert "completed" in history
        # the retry button is gone with the state it belongs to
        assert not await page.locator("button[value=retry]").is_visible()
    assert await _state(producer, job.id) is JobState.COMPLETED


async def test_job_arguments_and_errors_are_shown_as_text_never_run(
    dash_workers: WorkerProcesses, producer: App, site: str
) -> None:
    dash_workers.start()
    evil = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
    job = await producer.queue().enqueue("hostile", [evil], max_attempts=1)
    await _wait_state(producer, job.id, JobState.FAILED)
    async with browser_page(http_credentials=CREDS) as page:
        for path in (f"/queues/default/jobs/{job.id}", "/queues/default?state=failed", "/dead"):
            await page.goto(site + path)
            await page.wait_for_load_state("load")
            assert await page.evaluate("window.__pwned") is None, path
            assert await page.locator("body script:not([src])").count() == 0
            assert await page.locator("main img").count() == 0
        await page.goto(site + f"/queues/default/jobs/{job.id}")
        assert "<script>window.__pwned = 1</script>" in await page.locator("#args").inner_text()
        assert "ValueError: <script>" in await page.locator("#error").inner_text()


async def test_a_post_without_the_session_token_is_refused(producer: App, site: str) -> None:
    job = await producer.queue().enqueue("ok", [1], delay=3600)
    async with browser_page(http_credentials=CREDS) as page:
        await page.goto(site + f"/queues/default/jobs/{job.id}")
        await page.evaluate("document.querySelector('input[name=csrf_token]').value = 'forged'")
        page.on("dialog", lambda d: d.accept())
        async with page.expect_navigation() as nav:
            await page.click("button[value=cancel]")
        response: Any = await nav.value
        assert response.status == 403
        assert "CSRF" in await page.inner_text("body")
    assert await _state(producer, job.id) is JobState.SCHEDULED


async def test_read_only_shows_no_action_and_basic_auth_asks_for_credentials(
    producer: App,
) -> None:
    job = await producer.queue().enqueue("ok", [1], delay=3600)
    web = create_app(producer, auth=basic_auth("ops", "pw"), read_only=True)
    async with serve(web) as url:
        async with browser_page() as page:
            # the browser's own request: refused with the basic-auth challenge
            response: Any = await page.request.get(url + "/")
            assert response.status == 401
            assert response.headers["www-authenticate"].startswith("Basic ")
            with pytest.raises(Exception, match="AUTH"):
                await page.goto(url + "/")
        async with browser_page(http_credentials={"username": "ops", "password": "pw"}) as page:
            await page.goto(url + f"/queues/default/jobs/{job.id}")
            assert await page.locator("span.badge.ro").inner_text() == "read-only"
            assert await page.locator("form[method=post], button[name=action]").count() == 0
            await page.goto(url + "/queues/default?state=scheduled")
            assert await page.locator("button, input[type=checkbox]").count() == 1  # Filter
            text = await page.inner_text("main")
            assert re.search(job.id, text)
