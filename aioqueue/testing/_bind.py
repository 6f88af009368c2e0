"""``bind``: lend a module-level App (the README's shape, ``app = App(...)`` at import time in
the user's module) to one test, on the test's server and a prefix of its own, and give it back
unopened with its own settings afterwards, so that the next test can bind it again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from .._app.app import App


@asynccontextmanager
async def bind(
    app: App, url: str, *, prefix: str | None = None, testing: bool = True
) -> AsyncIterator[App]:
    """Open ``app`` on ``url`` under ``prefix`` (default: a fresh ``unique_prefix()``) for
    the ``async with`` block, then close it and restore its URL, prefix and test mode; it is
    then unopened again, as it was at import time (``App.rebind``). Its tasks, schedules
    declared in code, hooks and sharded queues stay. ``testing=True`` (default) is the test
    mode that ``VirtualClock`` needs.

    Use it in a fixture of your own::

        @pytest_asyncio.fixture
        async def app(aioqueue_url):
            async with bind(myproject.jobs.app, aioqueue_url) as app:
                yield app

    Raises:
        ConfigurationError: the App is open (bound twice, or opened by the code under test).
    """
    __tracebackhide__ = True
    from . import unique_prefix

    saved = (app.url, app.prefix, app.testing)
    app.rebind(url, prefix or unique_prefix(), testing=testing)
    try:
        async with app:
            yield app
    finally:
        app.rebind(saved[0], saved[1], testing=saved[2])
