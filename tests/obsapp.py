"""The App the observability tests run in real worker processes (metrics, traces, logs).

    python -m aioqueue worker tests.obsapp:app --url URL ...

Configured by the environment ``WorkerProcesses`` sets (see ``tests.support.apps``). With
``AIOQUEUE_TEST_SPANS`` set to a file path, the worker traces its jobs with OpenTelemetry and
writes each finished span to that file as one JSON line (``tests.support.spans``).
"""

from __future__ import annotations

import asyncio
import logging
import os

from aioqueue import Retry, current_job

from .support.apps import app_from_env

app = app_from_env("aqobs")
#: the tasks' own logger: its lines carry the job's context all the same
task_log = logging.getLogger("obsapp.tasks")

if os.environ.get("AIOQUEUE_TEST_SPANS"):
    from .support.spans import export_to_file

    export_to_file(app, os.environ["AIOQUEUE_TEST_SPANS"])


@app.task
async def ok(n: int) -> int:
    task_log.info("ok task running with n=%d", n)
    return n


@app.task
def ok_sync(n: int) -> int:
    task_log.info("sync task running with n=%d", n)
    return n


@app.task(max_attempts=2)
async def boom(why: str) -> None:
    task_log.warning("about to fail: %s", why)
    raise ValueError(why)


@app.task(max_attempts=3)
async def flaky() -> str:
    if current_job().attempt < 2:
        raise Retry(delay=0.01)
    return "done"


@app.task
async def slow(seconds: float) -> None:
    await asyncio.sleep(seconds)
