"""Weighted queues in one worker (issue 28, point 5; docs/flow-control.md): with both queues
backed up and one slot, a worker serving ``high:5`` and ``low:1`` starts five of ``high`` for
each of ``low``, spread evenly (``low`` is never starved); ``strict`` serves them in order;
the command line's ``--queue NAME:WEIGHT`` and ``--strict``. Counted by the starts the tasks
record, in order, in this process."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from aioqueue import App, ConfigurationError, Worker
from aioqueue._cli.main import _parser
from aioqueue._worker.weights import cli_queues, split_weight

from .support.waiting import wait_until

N = 60  # jobs on each queue


async def starts_in_order(
    app: App, queues: list[str] | Mapping[str, int], *, strict: bool = False
) -> list[str]:
    """Enqueue N jobs on each of "high" and "low" while no worker runs, then run one worker
    with one slot over ``queues`` until every job started: the queues in start order."""
    started: list[str] = []

    @app.task(name="job")
    async def job(queue: str) -> None:
        started.append(queue)

    for name in ("high", "low"):
        await job.options(queue=name).enqueue_many([{"queue": name}] * N)
    async with Worker(app, queues=queues, strict=strict, concurrency=1, prefetch=0):
        await wait_until(lambda: len(started) == 2 * N, timeout=60, what="every job started")
    return started


async def test_weights_share_the_starts_evenly_and_starve_no_queue(app: App) -> None:
    started = await starts_in_order(app, {"high": 5, "low": 1})
    # while both have work: 5 to 1 in every run of 12 starts (smooth: never more than 5 of
    # "high" in a row), until "high" runs dry after its N
    first = started[:60]
    assert first.count("high") == 50, first
    runs = "".join("h" if q == "high" else "l" for q in first).split("l")
    assert max(len(r) for r in runs) <= 6, first  # 5, give or take the first round
    for i in range(0, 60, 12):
        assert started[i : i + 12].count("low") == 2, (i, started[i : i + 12])
    assert started.count("low") == N


async def test_strict_serves_the_queues_in_order(app: App) -> None:
    started = await starts_in_order(app, ["high", "low"], strict=True)
    # the first claims may run before the second queue's fetcher asks: one at most
    assert started[: N - 1].count("low") <= 1, started
    assert started[-N + 1 :] == ["low"] * (N - 1)


def test_the_command_line_takes_weights_and_strict() -> None:
    args = _parser().parse_args(["worker", "m:app", "-q", "high:5", "-q", "low", "--strict"])
    assert cli_queues(args.queues) == {"high": 5, "low": 1}
    assert args.strict is True
    plain = _parser().parse_args(["worker", "m:app", "-q", "a", "-q", "b"])
    assert cli_queues(plain.queues) == ["a", "b"]
    assert split_weight("name.with:colons:3") == ("name.with:colons", 3)
    assert split_weight("ends:with:") == ("ends:with:", None)
    for bad in ("high:0", "high:5000", "bad name:2"):
        with pytest.raises(SystemExit):
            _parser().parse_args(["worker", "m:app", "-q", bad])


def test_weights_are_checked(app: App) -> None:
    with pytest.raises(ConfigurationError):
        Worker(app, queues={"high": 0})
    with pytest.raises(ConfigurationError):
        Worker(app, queues={"high": 1.5})  # type: ignore[dict-item]
