"""docs/scheduling.md's and docs/events.md's blocks run after this: the App, the tasks and the
names the pages use."""

from datetime import UTC, datetime, timedelta

from aioqueue import App

__all__ = ["UTC", "app", "datetime", "report", "send_reminder", "timedelta", "user_id"]

app = App()
user_id = 7


@app.task
async def report(kind: str) -> None: ...


@app.task
async def send_reminder(user_id: int) -> None: ...
