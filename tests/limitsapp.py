"""The worker module of the named limiters' subprocess tests (``tests/test_limits_workers.py``).

Run as ``python -m aioqueue worker tests.limitsapp:app --url URL``. Configured from the
environment, read at import: what ``tests.support.processes`` sets (see ``app_from_env``) and
``LIMITSAPP_RATE`` (starts per second of each customer's limit).

- ``charge(customer, i)`` needs ``per_customer`` (keyed by customer): it does nothing; the
  claim writes each start (``st``, server ms) into the job's record, which the test reads;
- ``hold(seconds)`` needs ``slots`` (concurrency 3): while it runs, the hash ``running``
  counts it under the worker's pid, and ``max`` keeps the most seen at once over every pid
  (one script, so the count is exact across processes).
"""

from __future__ import annotations

import asyncio
import os

from .support.apps import app_from_env

RATE = int(os.environ.get("LIMITSAPP_RATE", "20"))
SLOTS = 3

app = app_from_env("limitsapp")
app.limiter("per_customer", rate=(RATE, 1.0), key=lambda customer, i: customer)
app.limiter("slots", concurrency=SLOTS)


def running_key(prefix: str) -> str:
    return f"{prefix}:lt:running"


def max_key(prefix: str) -> str:
    return f"{prefix}:lt:max"


# KEYS[1] running hash  KEYS[2] max   ARGV[1] pid   ARGV[2] +1 / -1
COUNT_LUA = """
local n = redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2])
if n <= 0 then redis.call('HDEL', KEYS[1], ARGV[1]) end
local total = 0
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do total = total + tonumber(v) end
if total > (tonumber(redis.call('GET', KEYS[2])) or 0) then redis.call('SET', KEYS[2], total) end
return total
"""


@app.task(name="charge", limits=["per_customer"])
async def charge(customer: str, i: int) -> None:
    """A call to a customer's rate-limited upstream (its start is in the job's record)."""


@app.task(name="hold", limits=["slots"])
async def hold(seconds: float) -> None:
    """Hold one of the 3 slots for ``seconds``, counted in ``running`` while it runs."""
    r = app.redis
    keys = (running_key(app.prefix), max_key(app.prefix))
    pid = str(os.getpid())
    await r.eval(COUNT_LUA, 2, *keys, pid, 1)
    try:
        await asyncio.sleep(seconds)
    finally:
        await asyncio.shield(r.eval(COUNT_LUA, 2, *keys, pid, -1))
