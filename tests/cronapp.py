"""The App that the schedule tests run in real worker processes:

    python -m aioqueue worker tests.cronapp:app --url URL ...

Configured like ``tests.workerapp`` (``AIOQUEUE_TEST_PREFIX``, ``AIOQUEUE_TEST_LEASE``,
``AIOQUEUE_TEST_NAME``). It declares one schedule, ``beat``, every second; each run of a beat
job records its id, attempt and process under ``beats_key(prefix)``, so a test can count the
runs of every tick. Results are not kept: a tick's job record is gone once it completes, so a
scheduler that fired a tick twice would show up as a second first attempt of its job.
"""

from __future__ import annotations

import json
import os

from aioqueue import current_job

from .support.apps import app_from_env

app = app_from_env("aqcron")


def beats_key(prefix: str) -> str:
    """LIST: one JSON record per start of a beat job: id, attempt, pid."""
    return f"{prefix}:t:beats"


@app.task(keep_result=False)
async def beat() -> None:
    job = current_job()
    record = {"id": job.id, "attempt": job.attempt, "pid": os.getpid()}
    await job.app.redis.rpush(beats_key(job.app.prefix), json.dumps(record))


app.schedule(beat, every=1)
