"""The worker module of the quality-of-service tests' subprocess workers.

Run as ``python -m aioqueue worker tests.qosapp:app --url URL``. Configured from the
environment, read at import:

- ``AIOQUEUE_REDIS_URL``: the server (``--url`` overrides it);
- ``QOSAPP_PREFIX``: the App's key prefix (each test uses its own);
- ``QOSAPP_LEASE``: the lease in seconds (default 30).

Its one task, ``work``, keeps a record that the test process reads back, all in Redis so that
it is shared by every worker process (keys from ``QosKeys``):

- while a job runs, its label's ``running`` hash counts it under the worker's pid; at the start
  one script adds the job, sums the hash over every pid and raises the label's ``max`` to the
  sum if that is higher, so ``max`` is the most jobs of the label ever seen running at once;
  the end takes the job out again (also when the run is cancelled). A test that kills a worker
  with SIGKILL deletes the dead pid's field itself;
- every start is logged (``starts``: JSON with label, seq, job id, attempt, pid, the server's
  time and the job's lease deadline as the claim set it) and every completion is logged in
  order (``done``: ``label:seq``).
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass

from aioqueue import App, current_job

PREFIX_ENV = "QOSAPP_PREFIX"
LEASE_ENV = "QOSAPP_LEASE"

app = App(
    prefix=os.environ.get(PREFIX_ENV, "qosapp"),
    lease=float(os.environ.get(LEASE_ENV, "30")),
    max_attempts=5,
)


@dataclass(frozen=True, slots=True)
class QosKeys:
    """The keys of the record ``work`` keeps, under an App's prefix."""

    prefix: str

    def running(self, label: str) -> str:
        """HASH pid -> jobs of ``label`` running in that process now."""
        return f"{self.prefix}:qos:running:{label}"

    def max(self, label: str) -> str:
        """STRING: the most jobs of ``label`` seen running at once."""
        return f"{self.prefix}:qos:max:{label}"

    @property
    def starts(self) -> str:
        """LIST of JSON start records, in start order."""
        return f"{self.prefix}:qos:starts"

    @property
    def done(self) -> str:
        """LIST of ``label:seq``, in completion order."""
        return f"{self.prefix}:qos:done"


# KEYS[1] running hash  KEYS[2] max  KEYS[3] starts list  KEYS[4] the queue's active ZSET
# ARGV[1] pid  ARGV[2] job id  ARGV[3] JSON prefix of the record (label, seq, attempt)
# Returns the number of jobs of the label running now, this one included.
START_LUA = """
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
local total = 0
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do total = total + tonumber(v) end
if total > (tonumber(redis.call('GET', KEYS[2])) or 0) then redis.call('SET', KEYS[2], total) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = redis.call('ZSCORE', KEYS[4], ARGV[2]) or '-1'
redis.call('RPUSH', KEYS[3], ARGV[3] .. ',' .. now .. ',' .. deadline .. ']')
return total
"""


@app.task(name="work")
async def work(label: str, seq: int, sleep: float = 0.0) -> int:
    """A job of ``label``: record the start, sleep ``sleep`` seconds, record the end.

    Returns:
        How many jobs of ``label`` were running when this one started.
    """
    ctx = current_job()
    keys = QosKeys(ctx.app.prefix)
    r = ctx.app.redis
    pid = str(os.getpid())
    head = json.dumps([label, seq, ctx.id, ctx.attempt, os.getpid()])[:-1]
    active = ctx.app.queue(ctx.queue)._keys.active
    running = keys.running(label)
    seen = int(
        await r.eval(START_LUA, 4, running, keys.max(label), keys.starts, active, pid, ctx.id, head)
    )
    try:
        if sleep > 0:
            await asyncio.sleep(sleep)
    finally:
        # shielded: a cancelled run (shutdown, lost lease) still leaves the count right
        await asyncio.shield(r.hincrby(running, pid, -1))
    await r.rpush(keys.done, f"{label}:{seq}")
    return seen
