"""The worker's slots: the jobs running now (at most ``concurrency``), the prefetched ones
waiting for a slot (at most ``prefetch`` more), and the signal that a slot freed. One owner
that the fetch loops, the heartbeat, shutdown and the metrics ask.

A job given a slot starts at the event loop's next turn (``starting``, see
``Worker._start_job``): the fetch loop's next claim, made in this turn, is written to the
server before the jobs it leased last run, so the server works on it while they do.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from .._model.record import Claimed
from .runner import Ack, Failure

#: where a job was leased (the worker's per-queue fetcher)
Q = TypeVar("Q")


@dataclass(slots=True)
class Running(Generic[Q]):
    """A job running in a slot: where it was leased, what, and why it was stopped (if)."""

    qs: Q
    claimed: Claimed
    lost: bool = False
    cancelled: bool = False


class Slots(Generic[Q]):
    """The running jobs, by their task, and the prefetched ones, in order of arrival."""

    __slots__ = ("buffer", "concurrency", "freed", "prefetch", "running", "starting")

    def __init__(self, concurrency: int, prefetch: int) -> None:
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.running: dict[asyncio.Task[Ack | Failure], Running[Q]] = {}
        self.buffer: deque[tuple[Q, Claimed]] = deque()
        #: jobs given a slot whose task starts at the loop's next turn (counted as running)
        self.starting: list[tuple[Q, Claimed]] = []
        #: set whenever a job ends (a fetch loop waiting for room clears it and waits)
        self.freed = asyncio.Event()

    def __len__(self) -> int:
        """Jobs held: running (or starting), plus prefetched."""
        return len(self.running) + len(self.starting) + len(self.buffer)

    def room(self) -> int:
        """How many more jobs may be leased now (running and prefetched count)."""
        return self.concurrency + self.prefetch - len(self)

    def free(self) -> int:
        """Slots free to start a job at once (none while prefetched jobs wait)."""
        return 0 if self.buffer else max(self.concurrency - self.busy(), 0)

    def busy(self) -> int:
        """Slots taken: jobs running or starting."""
        return len(self.running) + len(self.starting)

    def has_free_slot(self) -> bool:
        return self.busy() < self.concurrency

    def start(
        self, qs: Q, c: Claimed, run: Callable[[Q, Claimed], asyncio.Task[Ack | Failure]]
    ) -> None:
        """Give job ``c`` (of ``qs``) a slot: ``run`` makes its task at the loop's next turn,
        after what this turn does (the fetch loop's next claim is written first)."""
        if not self.starting:
            asyncio.get_running_loop().call_soon(self._launch, run)
        self.starting.append((qs, c))

    def _launch(self, run: Callable[[Q, Claimed], asyncio.Task[Ack | Failure]]) -> None:
        starting, self.starting = self.starting, []
        for qs, c in starting:
            self.running[run(qs, c)] = Running(qs, c)

    def running_on(self, qs: Q) -> list[tuple[asyncio.Task[Ack | Failure], Running[Q]]]:
        """The jobs of ``qs`` running now whose lease is not known lost."""
        return [(t, e) for t, e in self.running.items() if e.qs is qs and not e.lost]

    def held_on(self, qs: Q) -> list[Claimed]:
        """The prefetched jobs of ``qs``."""
        return [c for q, c in self.buffer if q is qs]

    def forget(self, qs: Q, ids: Iterable[str]) -> None:
        """Drop prefetched jobs of ``qs`` (their lease is gone)."""
        gone = set(ids)
        self.buffer = deque(e for e in self.buffer if e[0] is not qs or e[1].id not in gone)

    def take_buffer(self) -> deque[tuple[Q, Claimed]]:
        """Every prefetched job, leaving none (shutdown hands them back)."""
        buffered, self.buffer = self.buffer, deque()
        return buffered

    async def wait_freed(self) -> None:
        """Until a job ends."""
        self.freed.clear()
        await self.freed.wait()
