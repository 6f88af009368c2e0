"""Type-only tests of batches and chains: never run, only checked by ``mypy --strict`` (which
runs with ``warn_unused_ignores``). Each ``# type: ignore[code]`` asserts that mypy catches
that misuse; if it stopped catching it, the ignore would be unused and mypy would fail.

The file name does not start with ``test_`` so pytest never collects it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from aioqueue import (
    App,
    Batch,
    BatchInfo,
    BatchItem,
    BatchState,
    Call,
    Chain,
    ErrorInfo,
    Job,
    JobState,
)


async def check(app: App) -> None:
    @app.task
    async def count_words(line: str, *, lower: bool = False) -> int:
        return len(line.split())

    @app.task
    async def summary() -> dict[str, int]:
        return {}

    @app.task
    async def double(n: int) -> int:
        return 2 * n

    @app.task
    async def label(n: int, unit: str) -> str:
        return f"{n} {unit}"

    @app.task
    async def shout(text: str) -> str:
        return text.upper()

    # task.call(): checked against the task's signature, like enqueue
    c: Call[int] = count_words.call("a b", lower=True)
    c2: Call[int] = count_words.options(priority=3).call("a b")
    count_words.call(1)  # type: ignore[arg-type]
    count_words.call()  # type: ignore[call-arg]
    double.call(1, 2)  # type: ignore[call-arg]
    count_words.call("a", lower="yes")  # type: ignore[arg-type]
    count_words.call("a", upper=True)  # type: ignore[call-arg]
    count_words.options(priority=3).call(b"a")  # type: ignore[arg-type]
    wrong_call: Call[str] = count_words.call("a")  # type: ignore[assignment]

    # a batch is typed by its callback: callback is Job[R] | None
    batch: Batch[dict[str, int]] = await app.batch(
        [count_words.call("a"), double.call(2)], on_complete=summary.call()
    )
    cb: Job[dict[str, int]] | None = batch.callback
    if batch.callback is not None:
        totals: dict[str, int] = await batch.callback.result()
    not_optional: Job[dict[str, int]] = batch.callback  # type: ignore[assignment]
    wrong_cb: Job[int] | None = batch.callback  # type: ignore[assignment]
    wrong_batch: Batch[int] = await app.batch(on_complete=summary.call())  # type: ignore[arg-type]
    await app.batch([count_words.call("a")], on_failure="sometimes")  # type: ignore[arg-type]
    await app.batch(["not a call"])  # type: ignore[list-item]
    no_cb: Batch[Any] = await app.batch([count_words.call("a")])
    added: list[Job[Any]] = await batch.add(double.call(1), count_words.call("b"))
    await batch.add(double)  # type: ignore[arg-type]
    info: BatchInfo = await batch.wait(timeout=5)
    pending: int = info.pending
    items: list[BatchItem] = await batch.results()
    errors: list[ErrorInfo | None] = [item.error for item in items]
    snapshot: BatchInfo = await batch.info()
    state: BatchState = snapshot.state
    over: bool = state.finished and JobState.CANCELLED.finished
    await batch.wait(timeout=timedelta(seconds=5))
    await batch.progress()  # type: ignore[attr-defined]
    await app.batch([count_words.call("a")], _chain=True)  # type: ignore[call-arg]

    # chains: the second step's first parameter takes the first step's result
    chain: Chain[str] = double.call(2).then(label, "kg")
    job: Job[str] = await chain.enqueue()
    text: str = await job.result()
    direct: Job[int] = await count_words.call("a").then(double).enqueue()
    # chains of any length: each step takes the one before's result
    three: Chain[str] = count_words.call("a").then(double).then(label, "x")
    last: Job[str] = (
        await count_words.call("a").then(double).then(double).then(label, "x").enqueue()
    )
    count_words.call("a").then(double).then(shout)  # type: ignore[arg-type]
    count_words.call("a").then(label, "x").then(double)  # type: ignore[arg-type]
    wrong_three: Chain[int] = count_words.call("a").then(double).then(label, "x")  # type: ignore[arg-type]
    double.call(2).then(shout)  # type: ignore[arg-type]
    double.call(2).then(label)  # type: ignore[call-arg]
    double.call(2).then(label, 3)  # type: ignore[arg-type]
    double.call(2).then(label, "kg", "extra")  # type: ignore[call-arg]
    wrong_chain: Chain[int] = double.call(2).then(label, "kg")  # type: ignore[arg-type]
    wrong_job: Job[int] = await double.call(2).then(label, "kg").enqueue()  # type: ignore[assignment]
