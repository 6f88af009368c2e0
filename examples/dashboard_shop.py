"""The shop whose traffic the dashboard screenshots show (examples/dashboard_screenshots.py
runs its workers): invoices that sometimes fail, images that take a while, a nightly report.
"""

from __future__ import annotations

import asyncio
import os
import random

from aioqueue import App, current_job

app = App(prefix=os.environ.get("SHOP_PREFIX", "shop"), max_attempts=3)


class MailServerRefused(ConnectionError):
    pass


async def _deliver(order: int, customer: str) -> None:
    await asyncio.sleep(random.uniform(0.01, 0.05))
    if order % 9 == 0:
        raise MailServerRefused(f"550 mailbox unavailable for {customer} (order {order})")


@app.task()
async def send_invoice(order: int, customer: str) -> str:
    await _deliver(order, customer)
    return f"invoice-{order}.pdf"


@app.task(queue="media")
async def resize_image(image: str, sizes: list[int]) -> dict[str, int]:
    job = current_job()
    for i, _size in enumerate(sizes, 1):
        await asyncio.sleep(random.uniform(0.05, 0.3))
        await job.progress({"resized": i, "of": len(sizes)})
    if image.endswith(".tiff"):
        raise ValueError(f"unsupported format: {image}")
    return {"sizes": len(sizes)}


@app.task()
async def sync_inventory(sku: str) -> int:
    await asyncio.sleep(random.uniform(0.01, 0.1))
    return len(sku)
