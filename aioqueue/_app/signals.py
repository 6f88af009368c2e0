"""``app.signal(key, payload)``: wake the jobs parked in ``ctx.wait_for_event(key)`` (the
App's method delegates here). The payload is sealed for each queue and key
(``_model/sealed.py``), so on a signing app only a key holder's signal wakes a job with a
value it will use."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import redis.asyncio as aioredis

from .._model.checks import check_name
from .._model.keys import QueueKeys
from .._model.sealed import Sealing
from .._store.scripts import QueueScripts
from .steps import send_signal


class _SignalHost(Protocol):
    """What ``signal`` needs of the App."""

    @property
    def prefix(self) -> str: ...
    @property
    def default_queue(self) -> str: ...
    @property
    def tasks(self) -> Mapping[str, Any]: ...
    @property
    def codec(self) -> Sealing: ...
    @property
    def redis(self) -> aioredis.Redis: ...


async def signal_jobs(app: _SignalHost, key: str, payload: Any, queue: str | None) -> int:
    """``app.signal``: wake every job waiting for event ``key`` (``await
    ctx.wait_for_event(key, ...)``) with ``payload`` (any value the serializer takes) as that
    call's return value. Jobs that wait for ``key`` later are not woken by this signal.
    ``queue``: only the jobs of this queue (default: those of the App's default queue and of
    every queue its tasks use). Returns how many jobs were woken (1,000 per script call, in
    as many calls as it takes).

    Raises:
        ValueError: ``key`` is not a string of 1 to 200 characters.
        SerializationError: ``payload`` cannot be serialised, or is over the limit.
    """
    if queue is not None:
        names = [check_name("queue name", queue)]
    else:
        names = sorted({app.default_queue, *(t.queue for t in app.tasks.values())})
    scripts = [QueueScripts(app.redis, QueueKeys(app.prefix, name)) for name in names]
    return await send_signal(scripts, app.codec, key, payload)
