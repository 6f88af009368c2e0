"""Coalescing of concurrent enqueues: the single-job enqueues of one queue that arrive while
one of its enqueue calls is in flight are sent together, in one ``enqueue.lua`` call, as soon
as that call returns.

- A lone enqueue is sent at once (no timer, no waiting for company): batching only happens
  while a round trip is already in flight, so it never adds latency, only shares it.
- Each caller gets its own job's result: ``enqueue.lua`` replies one code per job (stored,
  scheduled, its id existed, or the id of the job that holds its unique lock). An error of the
  whole call (an error reply) is retried job by job, so a job the server refuses fails only
  its own caller; a lost connection fails every caller of that call, as it would fail each of
  them alone (their jobs may or may not be stored, as with any call whose reply was lost;
  enqueue is idempotent on the job id).
- A lone enqueue is sent by its caller, as before: cancelled before its command is sent (while
  it waits for a pooled connection), its job is not stored; cancelled once it is sent, the
  job is stored. A shared call runs in a task of its own, so cancelling a caller never
  cancels the write of the others' jobs; a job that waits for a shared call is stored even
  if its caller is cancelled meanwhile (the write goes on, its caller's ``await`` ends).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Sequence
from typing import Any

from .._model.exceptions import ServerRefused
from .._model.record import JobRecord
from .._store.scripts import QueueScripts

#: the most jobs, and about the most payload bytes, one coalesced call carries
MAX_JOBS = 500
MAX_BYTES = 1 << 20

_Waiter = tuple[JobRecord, "asyncio.Future[Any]"]


class Coalescer:
    """The enqueues of one queue on one client, sent together while one call is in flight."""

    __slots__ = ("_busy", "_loop", "_pending", "_task", "scripts")

    def __init__(self, scripts: QueueScripts) -> None:
        self.scripts = scripts
        self._pending: list[_Waiter] = []
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._busy = False

    async def enqueue(self, job: JobRecord) -> Any:
        """Store one job, in the next call to the server (at once when none is in flight).

        Returns:
            enqueue.lua's code for the job: 1 queued, 2 scheduled, 0 its id existed, or
            (bytes) the id of the job that holds its unique lock.
        """
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a Queue used from another event loop: start afresh
            self._loop, self._pending, self._task, self._busy = loop, [], None, False
        if self._busy:
            fut: asyncio.Future[Any] = loop.create_future()
            self._pending.append((job, fut))
            return await fut
        # nothing in flight: this call goes at once, from the caller's own task (no added
        # latency, no task); the enqueues that arrive meanwhile wait for its reply
        self._busy = True
        try:
            return (await self.scripts.enqueue_codes([job]))[0]
        finally:
            if self._pending:
                self._task = loop.create_task(self._flush())
            else:
                self._busy = False

    async def _flush(self) -> None:
        batch: list[_Waiter] = []
        try:
            while self._pending:
                batch = self._take()
                await self._send(batch)
                batch = []
        finally:
            # cancelled (the loop is closing): no caller is left waiting for ever
            for _, fut in (*batch, *self._pending):
                if not fut.done():
                    fut.cancel()
            self._pending = []
            self._task = None
            self._busy = False

    def _take(self) -> list[_Waiter]:
        pending = self._pending
        size = n = 0
        while n < len(pending) and n < MAX_JOBS and (n == 0 or size < MAX_BYTES):
            size += len(pending[n][0].payload)
            n += 1
        batch, self._pending = pending[:n], pending[n:]
        return batch

    async def _send(self, batch: Sequence[_Waiter]) -> None:
        try:
            codes = await self.scripts.enqueue_codes([job for job, _ in batch])
        except ServerRefused as exc:
            if len(batch) == 1:
                _fail(batch, exc)
                return
            # one job may be what the server refuses: each alone, so it fails only its caller
            for waiter in batch:
                await self._send([waiter])
            return
        except Exception as exc:
            _fail(batch, exc)
            return
        for (_, fut), code in zip(batch, codes, strict=True):
            if not fut.done():  # a cancelled caller: its job is stored all the same
                fut.set_result(code)


def _fail(batch: Sequence[_Waiter], exc: Exception) -> None:
    """Give each waiting caller its own copy of the error (one exception object raised in
    several tasks would share, and mix, their tracebacks)."""
    for _, fut in batch:
        if not fut.done():
            try:
                own = copy.copy(exc)
                own.__cause__ = exc.__cause__
            except Exception:  # an exception that cannot be copied: shared, then
                own = exc
            fut.set_exception(own)
