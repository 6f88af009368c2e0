"""A user's tests with the testing kit: run them with ``pytest examples/test_signup.py``.

The pytest plugin (installed with aioqueue) gives each test an open App on keys of its own
(``aioqueue_app``) on an embedded server. The service under test registers its tasks on the
App it is given (``register``), so tests use the test's App. ``assert_enqueued`` checks what
the code enqueued without running it; ``run_until_empty`` runs it in the test's process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from aioqueue import App, Task
from aioqueue.testing import assert_enqueued, assert_not_enqueued, run_until_empty


# ---------------------------------------------------------------- the service under test
@dataclass
class Mailer:
    sent: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Service:
    send_mail: Task[[str, str], str]
    charge_card: Task[[str, int], None]

    async def signup(self, email: str, *, paid: bool = False) -> None:
        await self.send_mail.enqueue(email, "welcome")
        if paid:
            await self.charge_card.enqueue(email, 500)


def register(app: App, mailer: Mailer) -> Service:
    """Register the service's tasks on ``app``."""

    @app.task
    async def send_mail(to: str, template: str) -> str:
        mailer.sent.append((to, template))
        return f"{template} mail to {to}"

    @app.task
    async def charge_card(email: str, cents: int) -> None:
        pass

    return Service(send_mail, charge_card)


# ---------------------------------------------------------------- the tests
@pytest.mark.asyncio
async def test_a_free_signup_enqueues_a_welcome_mail_and_no_charge(aioqueue_app: App) -> None:
    mailer = Mailer()
    service = register(aioqueue_app, mailer)
    await service.signup("ann@example.com")
    [job] = await assert_enqueued(aioqueue_app, service.send_mail, ["ann@example.com", "welcome"])
    assert job.queue == "default"
    await assert_not_enqueued(aioqueue_app, service.charge_card)
    assert mailer.sent == []  # enqueued, not run yet


@pytest.mark.asyncio
async def test_the_welcome_mail_goes_out_when_the_jobs_run(aioqueue_app: App) -> None:
    mailer = Mailer()
    service = register(aioqueue_app, mailer)
    await service.signup("bob@example.com", paid=True)
    await assert_enqueued(aioqueue_app, service.charge_card, ["bob@example.com", 500])
    summary = await run_until_empty(aioqueue_app)
    assert summary.completed == 2
    assert mailer.sent == [("bob@example.com", "welcome")]
    await assert_not_enqueued(aioqueue_app, service.send_mail)
