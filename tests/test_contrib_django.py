"""``aioqueue.contrib.django``: a job enqueued only when Django's transaction commits, against a
real SQLite database and the suite's server (Django configured in this test process)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import django
import pytest
from django.conf import settings
from django.db import connection, transaction

from aioqueue import App, JobNotFound, JobState
from aioqueue.contrib.django import enqueue_on_commit
from aioqueue.testing import unique_prefix


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("django") / "shop.db"
    if not settings.configured:
        settings.configure(
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(path)}},
            INSTALLED_APPS=[],
            USE_TZ=True,
        )
        django.setup()
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT)")
    yield path
    connection.close()


@pytest.fixture
def app(redis_url: str) -> Iterator[App]:
    app = App(redis_url, prefix=unique_prefix())

    @app.task(name="send_receipt")
    async def send_receipt(order_id: int) -> int:
        return order_id

    yield app
    app.sync().close()


def state(app: App, job_id: str) -> JobState | None:
    try:
        return app.sync().job(job_id).state()
    except JobNotFound:
        return None


def insert(order_id: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO orders (id, item) VALUES (%s, 'book')", [order_id])


@pytest.mark.usefixtures("database")
def test_a_commit_enqueues_and_a_rollback_does_not(app: App) -> None:
    task = app.tasks["send_receipt"]
    with transaction.atomic():
        insert(1)
        kept = enqueue_on_commit(task, 1)
        assert state(app, kept) is None  # not before the commit
    assert state(app, kept) is JobState.QUEUED

    made: list[str] = []

    def failing(order_id: int) -> None:  # a transaction that rolls back
        with transaction.atomic():
            insert(order_id)
            made.append(enqueue_on_commit(task, order_id))
            raise RuntimeError("the request failed")

    with pytest.raises(RuntimeError):
        failing(2)
    assert state(app, made[0]) is None

    with transaction.atomic():  # a savepoint that rolls back drops its own job only
        outer = enqueue_on_commit(task.options(priority=3), 3)
        with pytest.raises(RuntimeError):
            failing(4)
    assert state(app, outer) is JobState.QUEUED
    assert state(app, made[1]) is None


@pytest.mark.usefixtures("database")
def test_outside_a_transaction_it_enqueues_at_once_and_checks_the_call(app: App) -> None:
    task = app.tasks["send_receipt"]
    job_id = enqueue_on_commit(task.options(job_id="order-9"), 9)
    assert job_id == "order-9"
    assert state(app, "order-9") is JobState.QUEUED
    with pytest.raises(TypeError), transaction.atomic():
        enqueue_on_commit(task, "one", "two")
