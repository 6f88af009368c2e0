"""Type-only tests of the blocking producer (``app.sync()``) and of hooks and middleware:
never run, only checked by ``mypy --strict`` (which runs with ``warn_unused_ignores``). Each
``# type: ignore[code]`` asserts that mypy catches that misuse; if it stopped catching it, the
ignore would be unused and mypy would fail.

The file name does not start with ``test_`` so pytest never collects it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aioqueue import (
    App,
    CallNext,
    EnqueueEvent,
    JobContext,
    JobInfo,
    JobState,
    State,
    SyncClient,
    SyncJob,
    current_job,
)


@dataclass
class Pool:
    dsn: str


def check_sync(app: App) -> None:
    @app.task
    async def add(x: int, y: int = 0) -> int:
        return x + y

    @app.task
    def blocking(path: str, *, mode: str = "r") -> bytes:
        return path.encode()

    sync: SyncClient = app.sync()
    # correct uses, with the types they give
    job: SyncJob[int] = sync.enqueue(add, 1, y=2)
    total: int = job.result(timeout=5)
    data: bytes = sync.enqueue(blocking, "/tmp/a", mode="rb").result()
    later: SyncJob[int] = sync.enqueue(add.options(delay=5, priority=3), 1)
    many: list[SyncJob[bytes]] = sync.enqueue_many(blocking, [{"path": "a"}, (("b",), {})])
    anything: SyncJob[Any] = sync.enqueue_by_name("other", "remote.task", [1])
    state: JobState = job.state()
    info: JobInfo = later.info()
    cancelled: bool = job.cancel()
    counts: dict[str, int] = sync.counts("default")
    n: int = sync.cancel_jobs([job.id])

    # misuses mypy must catch
    sync.enqueue(add, "one")  # type: ignore[arg-type]
    sync.enqueue(add)  # type: ignore[call-arg]
    sync.enqueue(add, 1, z=2)  # type: ignore[call-arg]
    sync.enqueue(blocking, "/tmp/a", "rb")  # type: ignore[call-arg]
    sync.enqueue(add.options(delay=5), 1, y="2")  # type: ignore[arg-type]
    wrong: SyncJob[str] = sync.enqueue(add, 1)  # type: ignore[arg-type]
    text: str = job.result()  # type: ignore[assignment]
    del total, data, many, anything, state, info, cancelled, counts, n, wrong, text


def check_hooks(app: App) -> None:
    @app.on_startup
    async def open_pool(state: State) -> None:
        state.set(Pool("postgres://"))

    @app.on_shutdown
    async def close_pool(state: State) -> None:
        pool: Pool = state.get(Pool)
        del pool

    @app.middleware
    async def timing(job: JobContext, call_next: CallNext) -> Any:
        return await call_next()

    @app.before_enqueue
    def before(event: EnqueueEvent) -> None:
        ids: tuple[str, ...] = event.job_ids
        del ids

    @app.task
    async def query() -> str:
        pool: Pool = current_job().state.get(Pool)  # typed by the class asked for
        wrong: int = current_job().state.get(Pool)  # type: ignore[assignment]
        del wrong
        return pool.dsn

    @app.on_startup  # type: ignore[type-var]
    def not_async(state: State) -> None:
        pass

    @app.middleware  # type: ignore[type-var]
    async def no_call_next(job: JobContext) -> Any:
        return None

    @app.after_enqueue  # type: ignore[type-var]
    async def async_enqueue_hook(event: EnqueueEvent) -> None:
        pass
