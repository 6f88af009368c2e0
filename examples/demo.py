"""The quick start, end to end: an embedded Valkey server, a worker process, and a producer.

python3 dev.py demo        (or: python examples/demo.py inside the project's virtualenv)
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from aioqueue import EmbeddedServer, JobFailed

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from examples.tasks import app, broken, checksum, flaky_webhook, resize  # noqa: E402


async def produce() -> None:
    async with app:
        job = await resize.enqueue("img-1", width=400)
        print(f"enqueued {job.id}; result: {await job.result(timeout=10)}")

        later = await resize.options(delay=0.5, priority=9).enqueue("img-2")
        t0 = time.perf_counter()
        url = await later.result(timeout=10)
        print(f"delayed 0.5 s job ran after {time.perf_counter() - t0:.2f} s: {url}")

        print(await (await flaky_webhook.enqueue("https://hooks.example.com")).result(timeout=10))
        print(
            f"sync task in the thread pool: {await (await checksum.enqueue('aioqueue')).result(10)}"
        )

        jobs = await resize.enqueue_many([{"image_id": f"batch-{i}"} for i in range(1000)])
        t0 = time.perf_counter()
        results = await asyncio.gather(*(j.result(timeout=30) for j in jobs))
        print(
            f"1,000 jobs enqueued in one round trip, all done in {time.perf_counter() - t0:.2f} s"
        )
        assert len(results) == 1000

        try:
            await (await broken.enqueue(7)).result(timeout=10)
        except JobFailed as exc:
            print(f"dead-lettered as expected: {exc.error_type}: {exc.error_message}")
        print("queue counts:", await app.queue().counts())


def main() -> int:
    with EmbeddedServer() as server:
        print(f"embedded Valkey at {server.url}")
        env = {**os.environ, "AIOQUEUE_REDIS_URL": server.url, "PYTHONPATH": str(ROOT)}
        app.url = server.url
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "aioqueue",
                "worker",
                "examples.tasks:app",
                "--log-level",
                "ERROR",
                "--concurrency",
                "100",
            ],
            cwd=ROOT,
            env=env,
        )
        try:
            asyncio.run(produce())
        finally:
            worker.send_signal(signal.SIGTERM)  # graceful: running jobs finish first
            code = worker.wait(timeout=60)
        print(f"worker stopped with exit code {code}")
        return code


if __name__ == "__main__":
    raise SystemExit(main())
