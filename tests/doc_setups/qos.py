"""docs/qos.md's blocks run after this: the reports queue and its task, as the page has them."""

from aioqueue import App

app = App()
reports = app.queue("reports")


@app.task(queue="reports")
async def build_report(tenant: str, n: int) -> None: ...
