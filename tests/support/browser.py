"""The dashboard under a real uvicorn server on a free port, and a real Chromium (Debian's
``chromium`` package, driven by Playwright) to look at it.

Browser tests skip when chromium is absent outside CI; under ``CI=true`` a missing chromium
fails them (``.ci/install-browser.sh`` installs it there).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def chromium_path() -> str:
    """Debian's chromium; skips the test without it (fails it under CI=true)."""
    path = os.environ.get("AIOQUEUE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not os.path.exists(path):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"chromium not found at {path}: .ci/install-browser.sh installs it")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return path


@contextlib.asynccontextmanager
async def serve(asgi: Any) -> AsyncIterator[str]:
    """Serve ``asgi`` with uvicorn on 127.0.0.1 and a port the system gives it as it binds
    (no window for another server to take it first); yields its base URL."""
    config = uvicorn.Config(asgi, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(30):
            while not server.started:
                assert not task.done(), "uvicorn stopped before it started"
                await asyncio.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(task, 15)


@contextlib.asynccontextmanager
async def browser_page(**context: Any) -> AsyncIterator[Any]:
    """A page of a fresh headless Chromium context (``context``: new_context's options)."""
    from playwright.async_api import async_playwright

    path = chromium_path()
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        try:
            ctx = await browser.new_context(**context)
            ctx.set_default_timeout(30_000)
            page = await ctx.new_page()
            yield page
        finally:
            await browser.close()
