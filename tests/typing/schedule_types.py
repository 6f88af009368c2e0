"""Type-only tests of periodic schedules, expiry and keep_result: never run, only checked by
``mypy --strict`` (which runs with ``warn_unused_ignores``). Each ``# type: ignore[code]``
asserts that mypy catches that misuse; if it stopped catching it, the ignore would be unused
and mypy would fail.

The file name does not start with ``test_`` so pytest never collects it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from aioqueue import App, Job, ScheduleInfo


async def check(app: App) -> None:
    @app.cron("*/5 * * * *", tz="Europe/Berlin")
    @app.task(keep_result=timedelta(hours=1))
    async def report(kind: str = "daily") -> int:
        return 1

    # @app.cron returns the task unchanged: its enqueue is still checked
    job: Job[int] = await report.enqueue("weekly")
    await report.enqueue(5)  # type: ignore[arg-type]

    app.schedule(report, every=timedelta(minutes=1), args=["x"], missed="once", jitter=5)
    app.schedule(report, every=60, missed="sometimes")  # type: ignore[arg-type]
    info: ScheduleInfo = await app.schedules.add("report", cron="0 9 * * *")
    when: datetime | None = info.next_run
    listed: list[ScheduleInfo] = await app.schedules.list(queues=["default"])
    removed: bool = await app.schedules.remove("report")

    await report.options(expires=30).enqueue()
    await report.options(expires=timedelta(minutes=5)).enqueue()
    await report.options(expires=datetime(2030, 1, 1, tzinfo=UTC)).enqueue()
    await report.options(expires="soon").enqueue()  # type: ignore[arg-type]

    @app.task(keep_result=True)
    async def kept() -> None: ...

    @app.task(keep_result="forever")  # type: ignore[call-overload, untyped-decorator]
    async def wrong() -> None: ...

    del job, when, listed, removed
