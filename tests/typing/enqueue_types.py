"""Type-only tests of enqueue: never run, only checked by ``mypy --strict`` (which runs with
``warn_unused_ignores``). Each ``# type: ignore[code]`` asserts that mypy catches that misuse;
if it stopped catching it, the ignore would be unused and mypy would fail.

The file name does not start with ``test_`` so pytest never collects it.
"""

from __future__ import annotations

from datetime import timedelta

from aioqueue import App, ErrorInfo, Job, JobInfo, JobState, Queue


async def check(app: App, queue: Queue) -> None:
    @app.task
    async def add(x: int, y: int = 0) -> int:
        return x + y

    @app.task(max_attempts=5)
    async def greet(name: str, *, loud: bool = False) -> str:
        return name.upper() if loud else name

    @app.task
    def blocking(path: str) -> bytes:  # a sync task
        return path.encode()

    # correct uses, with the types they give
    x: Job[int] = await add.enqueue(1, 2)
    y: int = await x.result()
    z: int = await (await add.enqueue(x=1)).result(timeout=5)
    s: str = await (await greet.enqueue("ann", loud=True)).result()
    b: bytes = await (await blocking.enqueue("/tmp/a")).result()
    delayed: Job[int] = await add.options(delay=5, priority=3).enqueue(1)
    unique: Job[int] = await add.options(unique=True, unique_scope="queued").enqueue(1)
    debounced: Job[int] = await add.options(
        unique_key="k", on_conflict="debounce", delay=5, unique_for=timedelta(minutes=5)
    ).enqueue(1)
    many: list[Job[str]] = await greet.enqueue_many([{"name": "a"}, (("b",), {"loud": True})])
    anything: Job[object] = await queue.enqueue("by.name", [1], {"k": 2})
    soon: int = await (await add.options(delay=timedelta(seconds=5)).enqueue(1)).result(
        timeout=timedelta(minutes=1)
    )
    state: JobState = await x.state()
    info: JobInfo = await x.info()
    same_state: JobState = info.state
    error: ErrorInfo | None = info.error

    # misuses the type checker must refuse
    await add.enqueue("1", 2)  # type: ignore[arg-type]
    await add.enqueue(1, z=2)  # type: ignore[call-arg]
    await add.enqueue()  # type: ignore[call-arg]
    await add.enqueue(1, 2, 3)  # type: ignore[call-arg]
    await greet.enqueue("ann", True)  # type: ignore[call-arg]
    await add.options(delay=5).enqueue("1")  # type: ignore[arg-type]
    await add.options(delay=5).enqueue(1, q=1)  # type: ignore[call-arg]
    await add.options(dealy=5).enqueue(1)  # type: ignore[call-arg]
    await add.options(unique=True, unique_scope="forever").enqueue(1)  # type: ignore[arg-type]
    await add.options(unique=True, on_conflict="merge").enqueue(1)  # type: ignore[arg-type]
    await add.enqueue(1, delay=5)  # type: ignore[call-arg]
    wrong: Job[str] = await add.enqueue(1)  # type: ignore[assignment]
    bad: str = await x.result()  # type: ignore[assignment]
    await x.status()  # type: ignore[attr-defined]
    await x.result(timeout="5")  # type: ignore[arg-type]
