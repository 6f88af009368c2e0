"""The tasks of the durable-step and durable-wait tests (issue 27), for in-process workers and
real worker processes:

    python -m aioqueue worker tests.stepapp:app --url URL ...

Configured like ``tests.workerapp`` (``support.apps.app_from_env``). Every step body counts its
executions in a side channel outside the queue's keys (``Keys.execs``, HINCRBY per step and
job), so a test in another process can tell whether a completed step ran again after a kill.
In-process tests call ``register(app)`` on their own App to get the same tasks.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aioqueue import App, current_job

from .support.apps import app_from_env


@dataclass(frozen=True, slots=True)
class Keys:
    """Where the tasks of one App (by its key prefix) record what they did."""

    prefix: str

    @property
    def execs(self) -> str:
        """HASH: "<job id>:<step>" -> how many times that step's body ran."""
        return f"{{{self.prefix}:t}}:execs"

    @property
    def at(self) -> str:
        """LIST: "<job id>:<place>:<attempt>" for each place a run reached (RPUSH)."""
        return f"{{{self.prefix}:t}}:at"


def register(app: App) -> None:
    """Register the workflow test tasks on ``app``."""
    keys = Keys(app.prefix)

    async def effect(step: str, value: str) -> str:
        """A step's body: count the execution, answer ``value``."""
        await app.redis.hincrby(keys.execs, f"{current_job().id}:{step}", 1)
        return value

    async def reached(place: str) -> None:
        ctx = current_job()
        await app.redis.rpush(keys.at, f"{ctx.id}:{place}:{ctx.attempt}")

    @app.task(name="order", max_attempts=10)
    async def order(order_id: str, hold_after: str = "") -> str:
        """reserve -> charge -> notify; on its first run, holds (forever) after the step
        named ``hold_after``, so a test can kill its worker there."""
        ctx = current_job()
        parts: list[str] = []
        for step in ("reserve", "charge", "notify"):
            parts.append(await ctx.step(step, effect, step, f"{step}:{order_id}"))
            await reached(step)
            if step == hold_after and ctx.attempt == 1:
                await asyncio.sleep(3600)  # killed here
        return " ".join(parts)

    @app.task(name="napper", max_attempts=10)
    async def napper(seconds: float, hold: bool = False) -> str:
        """a step, a durable sleep, a step; with ``hold``, its run after the sleep holds (on
        its first resume) so a test can kill it there."""
        ctx = current_job()
        before = await ctx.step("before", effect, "before", "b")
        await reached("parking")
        await ctx.sleep(seconds)
        await reached("resumed")
        if hold and await app.redis.hincrby(keys.execs, f"{ctx.id}:held", 1) == 1:
            await asyncio.sleep(3600)  # killed here
        after = await ctx.step("after", effect, "after", "a")
        return f"{before}{after}"

    @app.task(name="waiter", max_attempts=10)
    async def waiter(key: str, timeout: float) -> object:
        """a step, then a wait for signal ``key``: the signal's payload, or "timed out"."""
        ctx = current_job()
        await ctx.step("before", effect, "before", "b")
        await reached("waiting")
        try:
            return await ctx.wait_for_event(key, timeout=timeout)
        except TimeoutError:
            return "timed out"


app = app_from_env("stepapp")
register(app)
