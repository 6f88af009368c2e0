"""``aioqueue.contrib.sqlalchemy``: jobs enqueued only when an asyncio session's transaction
commits, against a real SQLite database (aiosqlite) and the suite's server."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import Integer, String
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from aioqueue import App, EmbeddedServer, JobNotFound, JobState, ServerUnavailable
from aioqueue.contrib.sqlalchemy import enqueue_after_commit, enqueued
from aioqueue.testing import run_until_empty, unique_prefix


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    item: Mapped[str] = mapped_column(String(50))


RECEIPTS: list[int] = []


def make_app(url: str) -> App:
    app = App(url, prefix=unique_prefix())

    @app.task(name="send_receipt")
    async def send_receipt(order_id: int) -> int:
        RECEIPTS.append(order_id)
        return order_id

    return app


@pytest.fixture
async def sessions(tmp_path: Path) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'shop.db'}")
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    yield async_sessionmaker(engine, expire_on_commit=False)
    await engine.dispose()


async def states(app: App, *ids: str) -> list[JobState | None]:
    """Each job's state; None for a job that was never stored."""
    out: list[JobState | None] = []
    for job_id in ids:
        try:
            out.append(await app.queue().job(job_id).state())
        except JobNotFound:
            out.append(None)
    return out


async def test_a_commit_enqueues_and_a_rollback_does_not(
    redis_url: str, sessions: async_sessionmaker[AsyncSession]
) -> None:
    async with make_app(redis_url) as app:
        task = app.tasks["send_receipt"]
        async with sessions() as session:
            async with session.begin():
                session.add(Order(id=1, item="book"))
                kept = enqueue_after_commit(session, task, 1)
                assert await states(app, kept) == [None]  # not before the commit
            await enqueued(session)
            assert await states(app, kept) == [JobState.QUEUED]

            made: list[str] = []

            async def failing() -> None:  # a transaction that rolls back
                async with session.begin():
                    session.add(Order(id=2, item="pen"))
                    made.append(enqueue_after_commit(session, task, 2))
                    raise RuntimeError("the request failed")

            with pytest.raises(RuntimeError):
                await failing()
            await enqueued(session)
            dropped = made[0]

            session.add(Order(id=3, item="ink"))  # autobegin, then an explicit rollback
            rolled = enqueue_after_commit(session, task, 3)
            await session.rollback()
            await enqueued(session)

        assert await states(app, dropped, rolled) == [None, None]
        RECEIPTS.clear()
        await run_until_empty(app)
        assert RECEIPTS == [1]


async def test_a_rolled_back_savepoint_drops_only_its_own_jobs(
    redis_url: str, sessions: async_sessionmaker[AsyncSession]
) -> None:
    async with make_app(redis_url) as app:
        task = app.tasks["send_receipt"]
        async with sessions() as session, session.begin():
            outer = enqueue_after_commit(session, task, 10)
            nested = await session.begin_nested()
            inner = enqueue_after_commit(session, task, 11)
            await nested.rollback()
            released = await session.begin_nested()
            kept = enqueue_after_commit(session, task.options(priority=5), 12)
            await released.commit()
            assert await states(app, outer, inner, kept) == [None, None, None]
        await enqueued(session)
        assert await states(app, outer, inner, kept) == [
            JobState.QUEUED,
            None,
            JobState.QUEUED,
        ]
        info = await app.queue().job(kept).info()
        assert info is not None
        assert info.priority == 5


async def test_the_call_is_checked_before_the_commit(
    redis_url: str, sessions: async_sessionmaker[AsyncSession]
) -> None:
    async with make_app(redis_url) as app, sessions() as session:
        task = app.tasks["send_receipt"]
        with pytest.raises(TypeError):
            enqueue_after_commit(session, task, "one", "two")
        given = enqueue_after_commit(session, task.options(job_id="order-7"), 7)
        assert given == "order-7"
        await session.commit()
        await enqueued(session)
        assert await states(app, "order-7") == [JobState.QUEUED]


async def test_an_enqueue_that_fails_after_the_commit_is_logged_and_raised(
    sessions: async_sessionmaker[AsyncSession],
    fresh_server: EmbeddedServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with make_app(fresh_server.url) as app, sessions() as session:
        async with session.begin():
            session.add(Order(id=20, item="cup"))
            job_id = enqueue_after_commit(session, app.tasks["send_receipt"], 20)
            fresh_server.stop()  # Redis goes away between the rows and the commit
        with (
            caplog.at_level(logging.ERROR, "aioqueue.contrib.sqlalchemy"),
            pytest.raises(ServerUnavailable),
        ):
            await enqueued(session)
        assert f"job {job_id} (send_receipt) was not enqueued" in caplog.text
        await enqueued(session)  # reported once
        assert (await session.get(Order, 20)) is not None  # the rows were committed
