"""A stateless review page: a moderator's lease on a photo travels between requests as a
signed handle (a string), so any web process can complete, extend or release it.

    python examples/review_handles.py

The handlers are framework-neutral; call them from your routes.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from aioqueue import App, EmbeddedServer, InvalidHandle, LeaseLost

KEY = os.environ.get("AIOQUEUE_SIGNING_KEY", "example-key-change-me-0123456789")
LEASE = 600  # ten minutes per photo; the page renews it while open


def web_app(url: str | None = None) -> App:
    """One App per web process (all with the same key and prefix)."""
    return App(url, prefix=os.environ.get("EXAMPLE_PREFIX", "aq"), signing_key=KEY)


async def next_photo(app: App) -> dict[str, Any] | None:
    """GET /review/next: the page gets the photo and the handle of its lease."""
    got = await app.queue("review").reserve(1, lease=LEASE, wait=5)
    if not got:
        return None
    return {"photo_id": got[0].kwargs["photo_id"], "handle": got[0].handle()}


async def still_looking(app: App, handle: str) -> int:
    """POST /review/heartbeat: renew the lease; 409 once it went to someone else."""
    queue = app.queue("review")
    try:
        await queue.extend(queue.reservation_from(handle), lease=LEASE)
    except InvalidHandle:
        return 400
    except LeaseLost:
        return 409
    return 200


async def decide(app: App, handle: str, approved: bool) -> int:
    """POST /review/decision: record the moderator's decision as the job's result."""
    queue = app.queue("review")
    try:
        await queue.complete(queue.reservation_from(handle), {"approved": approved})
    except InvalidHandle:
        return 400
    except LeaseLost:
        return 409
    return 200


async def main(url: str | None = None) -> tuple[Any, list[int]]:
    """Two web processes (two Apps): one hands out the photo, the other takes the decision."""
    async with web_app(url) as first, web_app(url) as second:
        job = await first.queue("review").enqueue("review_photo", kwargs={"photo_id": "p1"})
        page = await next_photo(first)
        assert page is not None
        codes = [
            await still_looking(second, page["handle"]),
            await decide(second, page["handle"].replace("aq1s.", "aq1s.x"), approved=False),
            await decide(second, page["handle"], approved=True),
        ]
        result = await job.result(timeout=10)
    print(f"status codes: {codes}; the job's result: {result}")
    return result, codes


if __name__ == "__main__":
    with EmbeddedServer() as server:
        asyncio.run(main(server.url))
