"""docs/tasks.md's and docs/retries.md's blocks run after this: the tasks the pages define."""

from datetime import UTC, datetime, timedelta

from aioqueue import App, Backoff

__all__ = ["UTC", "Backoff", "app", "datetime", "resize", "send_email", "timedelta"]

app = App()


@app.task
async def resize(image_id: str, width: int = 800) -> str:
    return f"https://cdn.example.com/{image_id}-{width}w.jpg"


@app.task
async def send_email(to: str, subject: str = "") -> None: ...
