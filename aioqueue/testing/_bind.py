"""``bind``: lend a module-level App (the README's shape, ``app = App(...)`` at import time in
the user's module) to one test, on the test's server and a prefix of its own, and give it back
unopened with its own settings afterwards, so that the next test can bind it again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from .._app.app import App, _State
from .._model.exceptions import ConfigurationError
from .._queue.sharded import ShardedQueue


@asynccontextmanager
async def bind(
    app: App, url: str, *, prefix: str | None = None, testing: bool = True
) -> AsyncIterator[App]:
    """Open ``app`` on ``url`` under ``prefix`` (default: a fresh ``unique_prefix()``) for
    the ``async with`` block, then close it and restore its URL, prefix and test mode; it is
    then unopened again, as it was at import time. Its tasks, schedules declared in code,
    hooks and sharded queues stay. ``testing=True`` (default) is the test mode that
    ``VirtualClock`` needs.

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

    if app._state is _State.OPEN:
        raise ConfigurationError(f"bind: {app!r} is open already; one test binds it at a time")
    saved = (app.url, app.prefix, app.testing)
    app.url, app.prefix, app.testing = url, prefix or unique_prefix(), testing
    _unopened(app)
    try:
        async with app:
            yield app
    finally:
        if app._sync is not None:
            app._sync.close()
        app.url, app.prefix, app.testing = saved
        _unopened(app)


def _unopened(app: App) -> None:
    """Put ``app`` back in the state of a new App: no connection, no queue of the old
    prefix (sharded queues are made again on it)."""
    app._state = _State.UNOPENED
    app._redis = app._results = app._sync = None
    app._queues.clear()
    for name, sharded in list(app._sharded.items()):
        app._sharded[name] = ShardedQueue(app, name, sharded.shards)
