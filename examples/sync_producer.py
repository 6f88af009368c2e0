"""A blocking producer: a plain script (or a Django management command, a cron job) that
enqueues jobs and waits for their results without asyncio.

    python -m aioqueue worker examples.sync_producer:app       # a worker, in another shell
    python examples/sync_producer.py                           # this producer
"""

from __future__ import annotations

import os
import sys

from aioqueue import App, JobFailed

app = App(prefix=os.environ.get("EXAMPLE_PREFIX", "aq"))


@app.task(max_attempts=2)
async def word_count(text: str) -> int:
    if not text:
        raise ValueError("nothing to count")
    return len(text.split())


def produce(timeout: float = 30.0) -> tuple[list[int], str]:
    """Enqueue one job, a batch of jobs, and one that fails; return their results."""
    with app.sync() as sync:  # closes its connections at the end of the block
        one = sync.enqueue(word_count, "the quick brown fox")
        many = sync.enqueue_many(word_count, [{"text": "a " * n} for n in range(1, 4)])
        bad = sync.enqueue(word_count, "")
        counts = [job.result(timeout=timeout) for job in (one, *many)]
        try:
            bad.result(timeout=timeout)
            error = "none"
        except JobFailed as exc:
            error = f"{exc.error_type}: {exc.error_message}"
        print(f"queued now: {sync.counts()['queued']}; counts: {counts}; error: {error}")
        return counts, error


if __name__ == "__main__":
    sys.exit(0 if produce() else 1)
