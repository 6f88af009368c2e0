"""aioqueue in a FastAPI app: the lifespan opens the App, one route enqueues a job and another
awaits its result.

    AIOQUEUE_REDIS_URL=redis://localhost:6379/0 uvicorn examples.fastapi_app:api
    python -m aioqueue worker examples.fastapi_app:queue_app      # in another shell

    curl -X POST 'localhost:8000/reports?customer=acme'    -> {"job_id": "..."}
    curl 'localhost:8000/reports/<job_id>?wait=10'         -> {"state": "completed", ...}
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse

from aioqueue import App, JobFailed, JobNotFound, JobState, ResultTimeout

# the URL comes from $AIOQUEUE_REDIS_URL; the prefix lets several deployments share a server
queue_app = App(prefix=os.environ.get("EXAMPLE_PREFIX", "aq"))


@queue_app.task(max_attempts=3, timeout=60)
async def build_report(customer: str, year: int = 2026) -> dict[str, Any]:
    """Stands for slow work a request should not wait for."""
    return {"customer": customer, "year": year, "lines": len(customer) * 10}


@asynccontextmanager
async def lifespan(api: FastAPI) -> AsyncIterator[None]:
    # one App (one connection pool) for the web process, open while it serves
    async with queue_app:
        yield


api = FastAPI(lifespan=lifespan)


@api.post("/reports", status_code=202)
async def request_report(customer: str, year: int = 2026) -> dict[str, str]:
    job = await build_report.enqueue(customer, year=year)
    return {"job_id": job.id}


@api.get("/reports/{job_id}", response_model=None)
async def report(job_id: str, wait: float = 0.0) -> dict[str, Any] | JSONResponse:
    """The report once it is built; waits up to ``wait`` seconds (at most 30) for it."""
    job = queue_app.queue(build_report.queue).job(job_id)
    try:
        state = await job.state()
        if not state.finished and wait <= 0:
            return _pending(job_id, state)
        result = await job.result(timeout=min(wait, 30.0))
    except JobNotFound:
        raise HTTPException(404, f"no report job {job_id}") from None
    except ResultTimeout:  # not built yet: come back later
        return _pending(job_id, await job.state())
    except JobFailed as exc:
        raise HTTPException(500, f"the report failed: {exc.error_type}") from None
    return {"job_id": job_id, "state": "completed", "report": result}


def _pending(job_id: str, state: JobState) -> JSONResponse:
    return JSONResponse({"job_id": job_id, "state": state.value}, status_code=202)
