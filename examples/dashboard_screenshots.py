"""Take the dashboard screenshots of docs/dashboard.md from real traffic.

    python examples/dashboard_screenshots.py [--minutes 3] [--out docs/img]

Starts a private embedded Valkey, three worker processes of examples/dashboard_shop.py, a
producer that sends invoices, images and inventory syncs for ``--minutes`` (some fail with
tracebacks), then the dashboard under uvicorn, and saves PNGs of the overview, the queue
page, a search of the dead letters, the trends, a failed job with its traceback and the
workers page, taken by Debian's chromium
(Playwright drives it; ``AIOQUEUE_CHROMIUM`` overrides its path).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import uvicorn
from playwright.async_api import async_playwright

from aioqueue import App, JobState
from aioqueue._store.embedded import EmbeddedServer
from aioqueue.dashboard import basic_auth, create_app

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("AIOQUEUE_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ARGS += ["--disable-component-update", "--disable-sync", "--no-first-run"]
PREFIX = "shop"


def _workers(url: str, log_dir: Path) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "SHOP_PREFIX": PREFIX, "PYTHONPATH": str(ROOT)}
    procs = []
    for i, queues in enumerate((["default", "media"], ["default"], ["media"]), 1):
        cmd = [sys.executable, "-m", "aioqueue", "worker", "examples.dashboard_shop:app"]
        cmd += ["--url", url, "--concurrency", str(10 * i)]
        for q in queues:
            cmd += ["-q", q]
        with (log_dir / f"worker{i}.log").open("wb") as out:
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=out))
    return procs


async def _traffic(app: App, minutes: float) -> None:
    shop, media = app.queue("default"), app.queue("media")
    await shop.set_group_limit("acme", 5)
    await shop.set_rate_limit(20, 1.0, group="globex")
    end = time.monotonic() + minutes * 60
    order = 1000
    customers = ["acme", "globex", "initech", "umbrella"]
    while time.monotonic() < end:
        # a wave that rises and falls, so that the chart has a shape
        phase = (time.monotonic() % 90) / 90
        burst = 4 + int(10 * abs(0.5 - phase))
        for _ in range(burst):
            order += 1
            who = random.choice(customers)
            await shop.enqueue(
                "send_invoice", [order, who], group=who if who != "initech" else None
            )
        await shop.enqueue("sync_inventory", [f"SKU-{order}"])
        image = f"img-{order}." + random.choice(["png", "png", "jpg", "jpg", "tiff"])
        await media.enqueue("resize_image", [image, [64, 256, 1024]], max_attempts=1)
        await asyncio.sleep(1.0)
    # what is still to come: scheduled invoices, a backlog for a paused group
    for i in range(12):
        await shop.enqueue("send_invoice", [5000 + i, "acme"], delay=600 + 60 * i, group="acme")
    await shop.pause("umbrella")
    for i in range(7):
        await shop.enqueue("send_invoice", [6000 + i, "umbrella"], group="umbrella")


async def _until(predicate: Callable[[], bool], pause: float = 0.05) -> None:
    for _ in range(int(60 / pause)):
        await asyncio.sleep(pause)
        if predicate():
            return
    raise TimeoutError("gave up after 60 s")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _shots(app: App, out: Path) -> None:
    web = create_app(app, auth=basic_auth("ops", "screens"), title="shop · aioqueue")
    port = _port()
    server = uvicorn.Server(uvicorn.Config(web, port=port, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    await _until(lambda: server.started)
    base = f"http://127.0.0.1:{port}"
    dead = await app.queue("default").jobs("failed", newest_first=True, limit=1)
    try:
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            ctx = await browser.new_context(
                viewport={"width": 1360, "height": 900},
                device_scale_factor=1,
                http_credentials={"username": "ops", "password": "screens"},
            )
            page = await ctx.new_page()
            shots = {
                "dashboard-overview.png": "/",
                "dashboard-queue.png": "/queues/default?state=queued",
                "dashboard-workers.png": "/workers",
                "dashboard-search.png": "/queues/default?state=failed&error=mailbox+unavailable",
                "dashboard-trends.png": "/queues/default/trends",
            }
            if dead.items:
                shots["dashboard-failed-job.png"] = f"/queues/default/jobs/{dead.items[0].id}"
            for name, path in shots.items():
                await page.goto(base + path)
                await page.wait_for_load_state("networkidle")
                await page.screenshot(
                    path=str(out / name),
                    full_page=name not in ("dashboard-queue.png", "dashboard-search.png"),
                )
                print("saved", out / name)
            await browser.close()
    finally:
        server.should_exit = True
        await task


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=3.0, help="minutes of traffic (3)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    with EmbeddedServer() as srv:
        procs = _workers(srv.url, logs)
        try:
            async with App(srv.url, prefix=PREFIX) as app:
                await _traffic(app, args.minutes)
                shop = app.queue("default")
                # let the workers catch up with what is due now
                media = app.queue("media")
                while (await shop.counts())["active"] or (await media.counts())["queued"]:
                    await _until(lambda: True, 0.5)
                assert (await shop.counts())["failed"] > 0, "no dead letter to show"
                info = (await shop.jobs(JobState.FAILED, limit=1)).items
                assert info
                await _shots(app, args.out)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(30)


if __name__ == "__main__":
    asyncio.run(main())
