"""Type-only tests of durable steps, waits, signals and job changes: never run, only checked by
``mypy --strict`` (which runs with ``warn_unused_ignores``). Each ``# type: ignore[code]``
asserts that mypy catches that misuse; if it stopped catching it, the ignore would be unused
and mypy would fail.

The file name does not start with ``test_`` so pytest never collects it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from aioqueue import App, JobState, current_job


async def charge(order_id: str, cents: int) -> str:
    return f"{order_id}:{cents}"


def reserve(order_id: str) -> int:
    return len(order_id)


async def check(app: App) -> None:
    @app.task(retry_on=(ConnectionError,), dont_retry_on=KeyError, capture_logs="INFO")
    async def pipeline(order_id: str) -> str:
        ctx = current_job()
        receipt: str = await ctx.step("charge", charge, order_id, 100)  # async fn: its result
        held: int = await ctx.step("reserve", reserve, order_id)  # sync fn: its result
        wrong: int = await ctx.step("charge2", charge, order_id, 100)  # type: ignore[call-overload]
        await ctx.step("charge3", charge, order_id, "100")  # type: ignore[call-overload]
        key: str = ctx.step_key("charge")
        await ctx.sleep(timedelta(minutes=5))
        payload: Any = await ctx.wait_for_event("shipped", timeout=3600)
        ctx.log("done")
        return f"{receipt}{held}{wrong}{key}{payload}"

    woken: int = await app.signal("shipped", {"carrier": "ups"})
    job = await pipeline.enqueue("o-1")
    state: JobState = await job.change(priority=5, delay=10)
    await job.change(priority="high")  # type: ignore[arg-type]
    print(woken, state)

    @app.task(retry_on="ValueError")  # type: ignore[call-overload, untyped-decorator]
    async def bad() -> None: ...
