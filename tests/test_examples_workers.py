"""The worker conveniences' example (``examples/workers_with_health.sh``): two supervised
worker processes with liveness endpoints, healthy by ``aioqueue health``, stopped cleanly by
SIGTERM."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import socket
import subprocess
import sys

import pytest

from aioqueue._store.embedded import _free_port

from .support.prewarmed import run_aioqueue
from .support.processes import REPO_ROOT
from .support.waiting import wait_until
from .test_health import status_of

pytestmark = pytest.mark.slow


def _two_free_ports() -> int:
    """A port p with p + 1 free too (the second worker's endpoint)."""
    for _ in range(50):
        p = _free_port()
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports")


async def _healthy(port: int) -> bool:
    try:
        return await status_of(port) == 200
    except OSError:
        return False


async def test_the_supervised_workers_example_serves_health_and_stops_on_sigterm(
    redis_url: str,
) -> None:
    port = _two_free_ports()
    # the example's App has the default prefix (aq): a database of its own on the suite's server
    url = redis_url.rsplit("/", 1)[0] + "/11"
    env = {**os.environ, "HEALTH_PORT": str(port), "PYTHON": sys.executable}
    proc = await asyncio.to_thread(
        subprocess.Popen,
        ["sh", "examples/workers_with_health.sh", "--url", url],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        for p in (port, port + 1):
            await wait_until(functools.partial(_healthy, p), timeout=60, what=f"/healthz on {p}")
        health = await asyncio.to_thread(run_aioqueue, ["health", "--url", url])
        assert health.returncode == 0, health.stdout + health.stderr
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 60)
        assert code == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        out = proc.communicate(timeout=30)[0].decode(errors="replace")
        print(out)
