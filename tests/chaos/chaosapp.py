"""The App the chaos soak runs in real worker processes::

    python -m aioqueue worker tests.chaos.chaosapp:app --url URL ...

Configured by environment variables, read at import:

- ``AIOQUEUE_REDIS_URL``: the server (the CLI's ``--url`` overrides it);
- ``CHAOS_PREFIX``: the key prefix of the soak run;
- ``CHAOS_LEASE``, ``CHAOS_RESULT_TTL``, ``CHAOS_DEAD_TTL``: seconds;
- ``CHAOS_CLIENT_NAME``: the client name of this worker's connections, which the soak picks
  its ``CLIENT KILL`` victims by.

Every task body records, under ``<prefix>:fx:*``, its start and (as its very last step, the
"side effect") its end, each as a hash field ``<job id>|<nonce>`` whose value is
``<the worker's pid>:<wall-clock ms of the run's start>`` (the soak places runs beside its
server outages by that time). The nonce is drawn once per run, so a write that the client
sends again after a lost reply (a killed connection) cannot count twice: a plain ``HINCRBY``
could, and would report a duplicate run that never happened. These writes go through a client
of their own, which retries through connection kills and the server restart: the bookkeeping is
the measuring instrument, not the thing under test.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import cast

import redis.exceptions as rexc
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from aioqueue import App, Backoff, current_job

PREFIX = os.environ.get("CHAOS_PREFIX", "chaos")
POISON_EXIT = 86  # the exit code of a worker killed by a poison job

app = App(
    prefix=PREFIX,
    lease=float(os.environ.get("CHAOS_LEASE", "3")),
    result_ttl=float(os.environ.get("CHAOS_RESULT_TTL", "60")),
    dead_ttl=float(os.environ.get("CHAOS_DEAD_TTL", "60")),
    max_attempts=25,  # a job may meet many kills; only poison and doomed jobs should die
    backoff=Backoff(base=0.05, factor=2.0, max=0.5, jitter=0.5),
    redis_options=(
        {"client_name": os.environ["CHAOS_CLIENT_NAME"]}
        if os.environ.get("CHAOS_CLIENT_NAME")
        else None
    ),
)


def started_key(prefix: str) -> str:
    """HASH ``<job id>|<nonce>`` -> pid: one field per started run of a job body."""
    return f"{prefix}:fx:started"


def done_key(prefix: str) -> str:
    """HASH ``<job id>|<nonce>`` -> pid: one field per run that reached its side effect."""
    return f"{prefix}:fx:done"


_fx: Redis | None = None


def _bookkeeper() -> Redis:
    global _fx
    if _fx is None and app.url.startswith("redis+cluster://"):  # (the soak's --cluster)
        host, _, port = app.url.partition("://")[2].split(",")[0].rpartition(":")
        cluster = RedisCluster(
            host=host,
            port=int(port),
            client_name="chaos-fx",
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.02), 60),
            retry_on_error=[rexc.ConnectionError, rexc.TimeoutError],
            socket_connect_timeout=2,
        )
        _fx = cast(Redis, cluster)
    if _fx is None:
        _fx = Redis.from_url(
            app.url,
            client_name="chaos-fx",
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.02), 60),
            retry_on_error=[rexc.ConnectionError, rexc.TimeoutError],
            socket_connect_timeout=2,
        )
    return _fx


async def _record(key: str, field: str, started_ms: int) -> None:
    # idempotent (HSET of a unique field), so a resend after a lost reply is harmless; sent
    # again on any error: redis-py's cluster client can fail a command with an internal
    # error (a connection closed under it) while a failover goes on, and the soak counts
    # the job's side effects, not the bookkeeper's
    for attempt in range(40):
        try:
            await _bookkeeper().hset(key, field, f"{os.getpid()}:{started_ms}")
            return
        except Exception:
            if attempt == 39:
                raise
            await asyncio.sleep(0.05)


async def _body(ms: int) -> tuple[str, int]:
    job = current_job()
    field = f"{job.id}|{uuid.uuid4().hex[:10]}"
    started_ms = time.time_ns() // 1_000_000
    await _record(started_key(PREFIX), field, started_ms)
    if ms > 0:
        await asyncio.sleep(ms / 1000)
    return field, started_ms


@app.task
async def work(i: int, ms: int = 0) -> int:
    """Run for ``ms`` milliseconds, then record the side effect."""
    field, started_ms = await _body(ms)
    await _record(done_key(PREFIX), field, started_ms)
    return i


@app.task
async def flaky(i: int, ms: int = 0) -> int:
    """Fail the first attempt (before the side effect), succeed on the next."""
    field, started_ms = await _body(ms)
    if current_job().attempt == 1:
        raise RuntimeError(f"flaky job {i} fails its first attempt")
    await _record(done_key(PREFIX), field, started_ms)
    return i


@app.task(max_attempts=2)
async def doomed(i: int) -> None:
    """Always raise: dead-lettered after two attempts, with the error."""
    await _body(0)
    raise ValueError(f"doomed job {i} always fails")


@app.task(max_attempts=3)
async def poison(i: int) -> None:
    """Kill the worker process running it: dead-lettered (LeaseExpired) after three."""
    await _body(0)
    os._exit(POISON_EXIT)
