"""The dashboard over plain HTTP (httpx on the ASGI app, a real server behind it): auth,
CSRF, read-only, escaping, the actions, paging, the live JSON endpoints, mounting, the CLI."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote_plus

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import Response

from aioqueue import App, Batch, ConfigurationError, JobState, Worker
from aioqueue.dashboard import basic_auth, create_app

from .support.ports import PortTaken, on_a_free_port_async
from .support.prewarmed import run_aioqueue
from .support.waiting import wait_until

AUTH = ("ops", "pw-123")


def client(web: Any, auth: tuple[str, str] | None = AUTH) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=web), base_url="http://dash.test", auth=auth
    )


@pytest.fixture
async def dash(app: App) -> AsyncIterator[httpx.AsyncClient]:
    async with client(create_app(app, auth=basic_auth(*AUTH))) as c:
        yield c


async def csrf_of(c: httpx.AsyncClient, path: str = "/queues/default") -> str:
    page = await c.get(path)
    assert page.status_code == 200, page.text
    found = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page.text)
    assert found, "no token in the page"
    return found.group(1)


async def post(c: httpx.AsyncClient, queue: str, **form: Any) -> httpx.Response:
    return await c.post(f"/queues/{queue}/actions", data=form)


# --------------------------------------------------------------------- who may see it
def test_create_app_needs_auth_said_explicitly(app: App) -> None:
    with pytest.raises(ConfigurationError, match="auth="):
        create_app(app)
    with pytest.raises(ConfigurationError, match="callable"):
        create_app(app, auth="admin:admin")
    with pytest.raises(ValueError, match="non-empty"):
        basic_auth("admin", "")


async def test_basic_auth_answers_401_with_a_challenge_until_the_credentials_match(
    app: App,
) -> None:
    web = create_app(app, auth=basic_auth(*AUTH))
    for creds in (None, ("ops", "wrong"), ("other", AUTH[1])):
        async with client(web, creds) as c:
            for path in ("/", "/api/overview", "/static/dashboard.css"):
                r = await c.get(path)
                assert r.status_code == 401, (creds, path)
                assert r.headers["www-authenticate"].startswith('Basic realm="aioqueue"')
    async with client(web) as c:
        r = await c.get("/")
        assert r.status_code == 200
        assert "Overview" in r.text
    async with client(web, None) as c:
        r = await c.get("/", headers={"Authorization": "Basic !!not-base64"})
        assert r.status_code == 401


async def test_an_auth_hook_decides_sync_or_async(app: App) -> None:
    def by_header(request: Request) -> bool:
        return request.headers.get("x-team") == "ops"

    async def redirecting(request: Request) -> bool | Response:
        return Response("go log in", status_code=302, headers={"Location": "/login"})

    async with client(create_app(app, auth=by_header), None) as c:
        assert (await c.get("/")).status_code == 403
        assert (await c.get("/", headers={"x-team": "ops"})).status_code == 200
    async with client(create_app(app, auth=redirecting), None) as c:
        r = await c.get("/")
        assert r.status_code == 302
        assert r.headers["location"] == "/login"
    async with client(create_app(app, auth=None), None) as c:
        assert (await c.get("/")).status_code == 200


async def test_pages_carry_security_headers(dash: httpx.AsyncClient) -> None:
    r = await dash.get("/")
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert r.headers["x-frame-options"] == "DENY"
    cookie = r.headers["set-cookie"]
    assert "httponly" in cookie.lower()
    assert "samesite=strict" in cookie.lower()


# --------------------------------------------------------------------- CSRF and read-only
async def test_a_post_needs_the_token_of_its_own_session(app: App, dash: httpx.AsyncClient) -> None:
    job = await app.queue().enqueue("t", [1], delay=3600)
    form = {"action": "cancel", "state": "scheduled", "ids": job.id}
    assert (await post(dash, "default", **form)).status_code == 403  # no session, no token
    token = await csrf_of(dash)
    assert (await post(dash, "default", **form)).status_code == 403  # no token
    assert (await post(dash, "default", **form, csrf_token="0" * 64)).status_code == 403
    async with client(create_app(app, auth=None), None) as other:
        foreign = await csrf_of(other)  # a valid token, of another session and secret
    assert (await post(dash, "default", **form, csrf_token=foreign)).status_code == 403
    assert (await app.queue().job_info(job.id)).state is JobState.SCHEDULED
    r = await post(dash, "default", **form, csrf_token=token)
    assert r.status_code == 303
    assert "cancel" in r.headers["location"]
    assert (await app.queue().job_info(job.id)).state is JobState.CANCELLED


async def test_read_only_has_no_buttons_and_refuses_every_post(app: App) -> None:
    job = await app.queue().enqueue("t", [1], delay=3600)
    async with client(create_app(app, auth=basic_auth(*AUTH), read_only=True)) as c:
        for path in ("/", "/queues/default?state=scheduled", f"/queues/default/jobs/{job.id}"):
            page = await c.get(path)
            assert page.status_code == 200
            # the queue page's one button is its filter form's (a GET)
            assert page.text.count("<button") == (1 if "?" in path else 0), path
            assert 'method="post"' not in page.text
        token_page = await c.get("/queues/default")
        assert "csrf_token" not in token_page.text
        for action in ("cancel", "promote", "delete"):
            form = {"action": action, "state": "scheduled", "ids": job.id, "csrf_token": "x"}
            r = await post(c, "default", **form)
            assert r.status_code == 403
            assert "read-only" in r.text
    assert (await app.queue().job_info(job.id)).state is JobState.SCHEDULED


# --------------------------------------------------------------------- what is shown
async def test_user_data_is_escaped_everywhere(app: App, dash: httpx.AsyncClient) -> None:
    evil = "<script>alert('x')</script>"
    job = await app.queue().enqueue("t", [evil], {"k": evil}, delay=3600, group="<b>g</b>")
    for path in (f"/queues/default/jobs/{job.id}", "/queues/default?state=scheduled"):
        text = (await dash.get(path)).text
        assert "<script>alert" not in text
        assert "<b>g</b>" not in text
    page = (await dash.get(f"/queues/default/jobs/{job.id}")).text
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page
    assert "&lt;b&gt;g&lt;/b&gt;" in page


async def test_unknown_jobs_queues_and_states_are_clear_errors(dash: httpx.AsyncClient) -> None:
    r = await dash.get("/queues/default/jobs/nope")
    assert r.status_code == 404
    assert "no such job" in r.text
    assert (await dash.get("/queues/default?state=waiting")).status_code == 400
    assert (await dash.get("/queues/bad{name}")).status_code == 404
    r = await dash.get("/queues/default?state=queued&cursor=garbage")
    assert r.status_code == 400
    assert (await dash.get("/api/queues/default/jobs/nope")).json() == {
        "error": "no such job (it may have expired)"
    }


async def test_the_queue_page_pages_with_the_cursor_and_filters(
    app: App, dash: httpx.AsyncClient
) -> None:
    q = app.queue()
    ids = [(await q.enqueue("a" if i % 2 else "b", [i])).id for i in range(70)]
    first = (await dash.get("/queues/default?state=queued")).text
    shown = set(re.findall(r'name="ids" value="([^"]+)"', first))
    assert len(shown) == 50
    nxt = re.search(r'href="(/queues/default\?[^"]*cursor=[^"]+)"', first)
    assert nxt
    second = (await dash.get(nxt.group(1).replace("&amp;", "&"))).text
    rest = set(re.findall(r'name="ids" value="([^"]+)"', second))
    assert shown | rest == set(ids)
    assert not shown & rest
    filtered = (await dash.get("/queues/default?state=queued&task=a")).text
    assert len(re.findall(r'name="ids" value=', filtered)) == 35


# --------------------------------------------------------------------- actions
async def test_actions_on_selected_jobs_and_on_all_matching(
    app: App, dash: httpx.AsyncClient
) -> None:
    q = app.queue()
    token = await csrf_of(dash)
    a = [(await q.enqueue("a", [i], delay=3600)).id for i in range(3)]
    b = [(await q.enqueue("b", [i], delay=3600)).id for i in range(2)]
    r = await post(
        dash, "default", action="promote", state="scheduled", ids=a[:2], csrf_token=token
    )
    assert "promote: 2 of 2 selected jobs" in unquote_plus(r.headers["location"])
    assert [(await q.job_info(i)).state for i in a] == [
        JobState.QUEUED,
        JobState.QUEUED,
        JobState.SCHEDULED,
    ]
    await post(dash, "default", action="cancel:all", state="scheduled", task="b", csrf_token=token)
    assert {(await q.job_info(i)).state for i in b} == {JobState.CANCELLED}
    assert (await q.job_info(a[2])).state is JobState.SCHEDULED
    await post(dash, "default", action="delete:all", state="queued", csrf_token=token)
    assert (await q.counts())["queued"] == 0
    # deleting from a job's page goes back to its queue (the job page is gone)
    r = await post(
        dash,
        "default",
        action="delete",
        state="cancelled",
        ids=b[0],
        csrf_token=token,
        back=f"/queues/default/jobs/{b[0]}",
    )
    assert r.headers["location"].startswith("/queues/default?msg=delete")
    assert (await dash.get(f"/queues/default/jobs/{b[0]}")).status_code == 404
    # an action the state does not offer is refused, and says so
    r = await post(dash, "default", action="retry", state="queued", ids=a[2], csrf_token=token)
    assert "refused" in r.headers["location"]
    # pause and resume the queue, a group; purge a group's backlog
    await post(dash, "default", action="pause", csrf_token=token)
    assert await q.is_paused()
    assert "paused" in (await dash.get("/queues/default")).text
    await post(dash, "default", action="resume", csrf_token=token)
    assert not await q.is_paused()
    for i in range(4):
        await q.enqueue("g", [i], group="acme")
    await post(dash, "default", action="pause", group="acme", csrf_token=token)
    assert [g.paused for g in await q.groups()] == [True]
    await post(dash, "default", action="purge-group", group="acme", csrf_token=token)
    assert (await q.group_counts()).get("acme", 0) == 0


async def test_dead_letters_retry_and_delete(app: App, dash: httpx.AsyncClient) -> None:
    @app.task(max_attempts=1)
    async def broken(n: int) -> None:
        raise RuntimeError(f"broken {n}")

    q = app.queue()
    jobs = [await broken.enqueue(i) for i in range(3)]
    await asyncio.wait_for(Worker(app, concurrency=3, burst=True).run(), 120)
    assert (await q.counts())["failed"] == 3
    dead_page = (await dash.get("/dead")).text
    assert all(j.id in dead_page for j in jobs)
    assert "RuntimeError: broken 0" in dead_page
    token = await csrf_of(dash, "/dead")
    r = await post(
        dash,
        "default",
        action="delete",
        state="failed",
        ids=jobs[0].id,
        csrf_token=token,
        back="/dead",
    )
    assert r.headers["location"].startswith("/dead?msg=")
    await post(dash, "default", action="retry:all", state="failed", csrf_token=token)
    assert (await q.counts())["failed"] == 0
    assert (await q.job_info(jobs[1].id)).state is JobState.QUEUED


async def test_a_post_redirects_only_within_the_dashboard(
    app: App, dash: httpx.AsyncClient
) -> None:
    token = await csrf_of(dash)
    for back in ("//evil.example/x", "https://evil.example/", "/\\evil.example"):
        r = await post(dash, "default", action="pause", csrf_token=token, back=back)
        assert r.headers["location"].startswith("/queues/default?msg="), back


# --------------------------------------------------------------------- live JSON
async def test_the_live_endpoints_follow_the_queue(app: App, dash: httpx.AsyncClient) -> None:
    q = app.queue()
    await q.enqueue("t", [1])
    job = await q.enqueue("t", [2], delay=3600)
    values = (await dash.get("/api/overview")).json()["values"]
    assert values["q:default:queued"] == 1
    assert values["q:default:scheduled"] == 1
    await q.promote([job.id])
    values = (await dash.get("/api/overview")).json()["values"]
    assert values["q:default:queued"] == 2
    live = (await dash.get(f"/api/queues/default/jobs/{job.id}")).json()
    assert live["state"] == "queued"
    assert (await dash.get("/api/queues/default")).json()["values"]["tab:queued"] == 2
    assert (await dash.get("/api/workers")).json()["tables"]["workers"] == []


# --------------------------------------------------------------------- mounting, the CLI
async def test_it_mounts_into_fastapi_under_a_path(app: App) -> None:
    from fastapi import FastAPI

    api = FastAPI()
    api.mount("/ops/queues", create_app(app, auth=basic_auth(*AUTH)))
    await app.queue().enqueue("t", [1])
    async with client(api) as c:
        page = await c.get("/ops/queues/")
        assert page.status_code == 200
        assert 'href="/ops/queues/queues/default"' in page.text
        assert 'src="/ops/queues/static/dashboard.js"' in page.text
        assert (await c.get("/ops/queues/queues/default")).status_code == 200
        assert (await c.get("/ops/queues/static/dashboard.js")).status_code == 200


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run_aioqueue(["dashboard", *args], timeout=timeout, env={"PATH": "/usr/bin:/bin"})


def test_the_cli_refuses_to_start_without_credentials() -> None:
    r = _cli("--port", "0")
    assert r.returncode == 2
    assert "needs credentials" in r.stderr
    assert r.stderr.count("\n") == 1
    r = _cli("--no-auth", "--user", "a", "--password", "b")
    assert r.returncode == 2
    r = _cli("--user", "a", "--password", "b", "--viewer-user", "v")  # no viewer password
    assert r.returncode == 2
    assert "--viewer-user needs --viewer-password" in r.stderr


def _start(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=out)


async def _serve(
    cmd: list[str], log: Path, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], int]:
    """``cmd`` (a dashboard, ``--port`` to come) serving on a free port, and that port; on a
    new port when the one picked was taken before the server bound it (it exits, saying
    so)."""

    async def start(port: int) -> tuple[subprocess.Popen[bytes], int]:
        proc = _start([*cmd, "--port", str(port)], log, env)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:

            async def settled() -> bool:
                if proc.poll() is not None:
                    return True
                try:
                    await c.get("/")
                except httpx.TransportError:
                    return False
                return True

            await wait_until(settled, timeout=60, interval=0.2, what="the dashboard to listen")
        if proc.poll() is None:
            return proc, port
        said = await asyncio.to_thread(log.read_text)
        assert "address already in use" in said.lower(), said
        raise PortTaken(port)

    return await on_a_free_port_async(start)


async def test_the_cli_serves_on_127_0_0_1_with_basic_auth(
    redis_url: str, app: App, tmp_path: Path
) -> None:
    await app.queue("mail").enqueue("t", [1])
    cmd = [sys.executable, "-m", "aioqueue", "dashboard", "--url", redis_url]
    cmd += ["--prefix", app.prefix, "--user", "ops"]
    cmd += ["--viewer-user", "watcher"]
    log = tmp_path / "dashboard.log"
    env = {"PATH": "/usr/bin:/bin", "AIOQUEUE_DASHBOARD_PASSWORD": "pw"}
    proc, port = await _serve(cmd, log, {**env, "AIOQUEUE_DASHBOARD_VIEWER_PASSWORD": "view"})
    try:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base) as c:
            assert (await c.get("/")).status_code == 401
            page = await c.get("/", auth=("ops", "pw"))
            assert page.status_code == 200
            assert "mail" in page.text
            assert 'method="post"' in (await c.get("/queues/mail", auth=("ops", "pw"))).text
            # the viewer: every page, no action
            seen = await c.get("/queues/mail", auth=("watcher", "view"))
            assert seen.status_code == 200
            assert 'method="post"' not in seen.text
            refused = await c.post(
                "/queues/mail/actions", data={"action": "pause"}, auth=("watcher", "view")
            )
            assert refused.status_code == 403
            assert f"127.0.0.1:{port}" in log.read_text()
    finally:
        proc.terminate()
        proc.wait(30)


# --------------------------------------------------------------------- the browser's presence
def test_browser_tests_skip_without_chromium_but_fail_under_ci(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from .support.browser import chromium_path

    monkeypatch.setenv("AIOQUEUE_CHROMIUM", str(tmp_path / "no-chromium"))
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        chromium_path()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="install-browser"):
        chromium_path()


async def test_a_queue_page_shows_the_batches_of_its_jobs_with_their_progress(
    app: App, dash: httpx.AsyncClient
) -> None:
    @app.task()
    async def part(n: int) -> int:
        return n

    batch: Batch[Any] = await app.batch([part.call(i) for i in range(4)])
    listed = (await app.queue().jobs("queued")).items
    assert {s.batch for s in listed} == {batch.id}
    page = (await dash.get("/queues/default?state=queued")).text
    assert re.search(rf'<td class="mono">{batch.id}</td><td>open</td>', page)
    assert 'value="0">0%' in page
    await asyncio.wait_for(Worker(app, concurrency=4, burst=True).run(), 120)
    done = (await dash.get("/queues/default?state=completed")).text
    assert re.search(rf"{batch.id}</td><td>completed</td><td class=\"n\">4</td>", done)
    assert 'value="100">100%' in done
    job = (await dash.get(f"/queues/default/jobs/{listed[0].id}")).text
    assert "4 done, 0 failed of 4" in job
