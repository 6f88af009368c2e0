"""docs/unique.md's blocks run after this: the App and the names the page uses."""

from aioqueue import App

__all__ = ["app", "doc", "reindex", "v"]

app = App()
doc, v = "doc-1", 2


@app.task
async def reindex(doc: str, version: int) -> None: ...
