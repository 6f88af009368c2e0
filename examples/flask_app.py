"""aioqueue in a Flask app (the same goes for Django views): the blocking producer
``app.sync()`` enqueues and reads results without an event loop.

    AIOQUEUE_REDIS_URL=redis://localhost:6379/0 flask --app examples.flask_app run
    python -m aioqueue worker examples.flask_app:queue_app        # in another shell
"""

from __future__ import annotations

import os
from typing import Any

from flask import Flask, abort, request

from aioqueue import App, JobFailed, JobNotFound, ResultTimeout

queue_app = App(prefix=os.environ.get("EXAMPLE_PREFIX", "aq"))


@queue_app.task(max_attempts=5)
async def send_welcome(email: str, *, name: str = "") -> str:
    """Stands for a call to a mail service."""
    return f"welcome mail sent to {name or email} <{email}>"


web = Flask(__name__)


@web.post("/signup")
def signup() -> tuple[dict[str, Any], int]:
    email = request.form["email"]
    # one blocking client per App, shared by the server's threads; no event loop involved
    job = queue_app.sync().enqueue(send_welcome, email, name=request.form.get("name", ""))
    return {"job_id": job.id}, 202


@web.get("/mails/<job_id>")
def mail(job_id: str) -> tuple[dict[str, Any], int]:
    wait = min(float(request.args.get("wait", "0")), 30.0)
    job = queue_app.sync().job(job_id, send_welcome.queue)
    try:
        return {"state": "completed", "result": job.result(timeout=wait)}, 200
    except JobNotFound:
        abort(404)
    except ResultTimeout:
        return {"state": job.state().value}, 202
    except JobFailed as exc:
        return {"state": "failed", "error": exc.error_type}, 500
