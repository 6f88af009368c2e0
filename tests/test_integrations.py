"""The integration examples run as documented: hooks and middleware
(``examples/hooks_app.py``), a blocking producer (``examples/sync_producer.py``), FastAPI
through httpx's ASGI transport (``examples/fastapi_app.py``) and Flask through its test client
(``examples/flask_app.py``), each against the real server with a real worker."""

from __future__ import annotations

import asyncio
import importlib
import sys
from types import ModuleType
from typing import Any

import httpx
import pytest

from aioqueue import Worker

from .support.apps import unique_prefix


@pytest.fixture
def load_example(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Import a fresh copy of ``examples.<name>`` whose App is on this server, under a
    unique prefix (its App is made at import, from the environment)."""

    def load(name: str) -> ModuleType:
        monkeypatch.setenv("AIOQUEUE_REDIS_URL", redis_url)
        monkeypatch.setenv("EXAMPLE_PREFIX", unique_prefix())
        sys.modules.pop(f"examples.{name}", None)
        return importlib.import_module(f"examples.{name}")

    return load


async def test_the_hooks_example(load_example: Any, capsys: pytest.CaptureFixture[str]) -> None:
    example = load_example("hooks_app")
    # one database per worker, opened by the startup hook: each job sees the rows before it
    assert await example.main() == [1, 2, 3]
    assert example.enqueued == {"place_order": 3}
    assert "rows seen by each job: [1, 2, 3]" in capsys.readouterr().out


async def test_the_blocking_producer_example(load_example: Any) -> None:
    example = load_example("sync_producer")
    async with example.app, Worker(example.app):
        counts, error = await asyncio.to_thread(example.produce, 60.0)
    assert counts == [4, 1, 2, 3]
    assert error == "ValueError: nothing to count"


async def test_the_fastapi_example(load_example: Any) -> None:
    example = load_example("fastapi_app")
    api, queue_app = example.api, example.queue_app
    transport = httpx.ASGITransport(app=api)
    # httpx's ASGI transport does not run the lifespan: enter it as the server would
    async with (
        api.router.lifespan_context(api),
        httpx.AsyncClient(transport=transport, base_url="http://test") as http,
    ):
        reply = await http.post("/reports", params={"customer": "acme", "year": 2025})
        assert reply.status_code == 202
        job_id = reply.json()["job_id"]
        # no worker yet: not built, say so rather than hang
        pending = await http.get(f"/reports/{job_id}", params={"wait": 0.1})
        assert pending.status_code == 202
        assert pending.json() == {"job_id": job_id, "state": "queued"}
        async with Worker(queue_app):
            done = await http.get(f"/reports/{job_id}", params={"wait": 30})
        assert done.status_code == 200
        assert done.json() == {
            "job_id": job_id,
            "state": "completed",
            "report": {"customer": "acme", "year": 2025, "lines": 40},
        }
        assert (await http.get("/reports/nosuchjob")).status_code == 404


async def test_the_flask_example(load_example: Any) -> None:
    example = load_example("flask_app")
    client = example.web.test_client()
    try:
        reply = client.post("/signup", data={"email": "ann@example.com", "name": "Ann"})
        assert reply.status_code == 202
        job_id = reply.get_json()["job_id"]
        pending = client.get(f"/mails/{job_id}", query_string={"wait": "0.1"})
        assert (pending.status_code, pending.get_json()) == (202, {"state": "queued"})
        async with example.queue_app, Worker(example.queue_app):
            # the view blocks on the result: in a thread, as a WSGI server runs it
            done = await asyncio.to_thread(
                client.get, f"/mails/{job_id}", query_string={"wait": "30"}
            )
        assert done.status_code == 200
        assert done.get_json() == {
            "state": "completed",
            "result": "welcome mail sent to Ann <ann@example.com>",
        }
        assert client.get("/mails/nosuchjob").status_code == 404
    finally:
        example.queue_app.sync().close()
