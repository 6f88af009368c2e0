"""Job context on log lines: ``JobContextFilter`` puts the running job's id, task, queue and
attempt on every log record made while a job runs (by aioqueue or by the task's own loggers),
and ``JsonLogFormatter`` writes records as JSON lines (``worker --log-format json``).

The runner already keeps the running job in a context variable (``current_job()``), set once
per run; the filter reads it when a record is made, so a job that logs nothing pays nothing,
and a worker without the filter runs exactly as before. Put the filter on a *handler*
(``handler.addFilter(JobContextFilter())``): a logger's own filters see only the records
logged to that very logger, a handler's see every record it writes.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from .._model.safetext import EscapingFormatter
from .context import _current

#: the record attributes the filter sets (None outside a job)
FIELDS = ("job_id", "job_task", "job_queue", "job_attempt")
#: the text format of ``worker --log-format text``: ``job_context`` is empty outside a job
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s%(job_context)s"


def job_fields(job_id: str, task: str, queue: str, attempt: int) -> dict[str, Any]:
    """The ``extra=`` of a log call about a job made outside its run (the pool's own lines
    about a job's outcome): the filter keeps what it finds on the record."""
    return {"job_id": job_id, "job_task": task, "job_queue": queue, "job_attempt": attempt}


class JobContextFilter(logging.Filter):
    """Adds ``job_id``, ``job_task``, ``job_queue`` and ``job_attempt`` to every record (None
    outside a job), and ``job_context``: `` [job ID task=T queue=Q attempt=N]``, or an empty
    string outside a job, for text formats (``%(message)s%(job_context)s``). Never drops a
    record."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Add the running job's fields to ``record`` (none outside a job); always keep it."""
        d = record.__dict__
        job_id = d.get("job_id")
        if job_id is None:
            job = _current.get(None)
            if job is None:
                d["job_id"] = d["job_task"] = d["job_queue"] = d["job_attempt"] = None
                d["job_context"] = ""
                return True
            job_id, d["job_id"], d["job_task"] = job.id, job.id, job.task
            d["job_queue"], d["job_attempt"] = job.queue, job.attempt
        else:  # a pool's line about a job brings its own (job_fields)
            for name in FIELDS:
                d.setdefault(name, None)
        d["job_context"] = (
            f" [job {job_id} task={d['job_task']} queue={d['job_queue']}"
            f" attempt={d['job_attempt']}]"
        )
        return True


class JsonLogFormatter(logging.Formatter):
    """One JSON object per record, one per line: ``time`` (ISO 8601, UTC), ``level``,
    ``logger``, ``message``, the job's ``job_id``, ``job_task``, ``job_queue`` and
    ``job_attempt`` when the record has them (from ``JobContextFilter``), and ``exception``
    (the formatted traceback) when there is one. Values JSON cannot hold are written as
    their ``str``."""

    def format(self, record: logging.LogRecord) -> str:
        """``record`` as one line of JSON, with the job's fields when it has them."""
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        d = record.__dict__
        for name in FIELDS:
            value = d.get(name)
            if value is not None:
                out[name] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def configure(level: str, fmt: str) -> None:
    """The worker command's logging: one handler on the root logger, with the job filter,
    writing ``fmt`` (``"text"`` or ``"json"``) to stderr."""
    handler = logging.StreamHandler()
    handler.addFilter(JobContextFilter())
    if fmt == "json":
        handler.setFormatter(JsonLogFormatter())
    else:
        handler.setFormatter(EscapingFormatter(TEXT_FORMAT))  # no control characters
    logging.basicConfig(level=level, handlers=[handler])
