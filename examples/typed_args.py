"""Typed arguments and results: a dataclass holding a UUID, a date, a Decimal and an Enum, and
a Pydantic model, sent through JSON and read back by the task's type hints.

    python examples/typed_args.py

or run a worker for it: ``python -m aioqueue worker examples.typed_args:app``.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from enum import Enum
from uuid import UUID

import pydantic

from aioqueue import App, EmbeddedServer, Worker

app = App(prefix=os.environ.get("EXAMPLE_PREFIX", "aq"))


class Status(Enum):
    OPEN = "open"
    PAID = "paid"


@dataclass
class Invoice:
    id: UUID
    issued: date
    total: Decimal
    status: Status


class Customer(pydantic.BaseModel):
    name: str
    since: date


@app.task
async def settle(invoices: list[Invoice], customer: Customer, at: datetime) -> list[Invoice]:
    """Mark a customer's invoices paid: every value arrives as its annotation says."""
    assert all(isinstance(i.total, Decimal) for i in invoices)
    assert isinstance(customer.since, date)
    return [Invoice(i.id, i.issued, i.total, Status.PAID) for i in invoices]


async def main(url: str | None = None) -> list[Invoice]:
    """Enqueue one job, run a worker until it is done; the settled invoices."""
    if url is not None:
        app.url = url
    async with app:
        invoices = [
            Invoice(UUID(int=1), date(2030, 1, 31), Decimal("99.90"), Status.OPEN),
            Invoice(UUID(int=2), date(2030, 2, 28), Decimal("0.10"), Status.OPEN),
        ]
        ann = Customer(name="Ann", since=date(2020, 5, 1))
        job = await settle.enqueue(invoices, ann, datetime(2030, 3, 1, 9, 30))
        await Worker(app, burst=True).run()
        paid = await job.result(timeout=10)
    for invoice in paid:
        print(invoice.id, invoice.total, invoice.status)
    return paid


if __name__ == "__main__":
    with EmbeddedServer() as server:
        asyncio.run(main(server.url))
