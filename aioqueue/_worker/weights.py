"""Weighted queues in one worker (docs/flow-control.md, "Weighted queues"): when several of
a worker's queues have work and its slots are scarce, which queue's fetcher claims next.

``Worker(queues={"high": 5, "low": 1})`` (``--queue high:5 --queue low:1``) serves them by
weight: the fetchers that want to claim take turns by smooth weighted round robin (each
round, every one waiting adds its weight to its credit, the one with the most credit claims
and gives back the sum of the weights waiting), and a turn claims its weight's share of the
free slots (at least one job). So while both have work, ``high`` starts about 5 jobs for each
of ``low``'s, spread evenly, and neither waits for the other longer than one round; a queue
with nothing to run is not waiting and takes no turn. ``strict=True`` (``--strict``) serves
them in the order given instead: a queue claims only while none before it wants to.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Mapping, Sequence

from .._model.checks import check_name
from .._model.exceptions import ConfigurationError

#: the largest weight a queue may have
MAX_WEIGHT = 1000


def split_weight(text: str) -> tuple[str, int | None]:
    """``name:weight`` (the command line's ``--queue high:5``) as (name, weight); a name
    without a trailing ``:<digits>`` has no weight (None)."""
    name, sep, weight = text.rpartition(":")
    if sep and name and weight.isdigit():
        return name, int(weight)
    return text, None


def queue_arg(text: str) -> str:
    """The command line's ``--queue``: ``NAME`` or ``NAME:WEIGHT``, checked."""
    name, weight = split_weight(text)
    try:
        check_name("queue name", name)
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if weight is not None and not 1 <= weight <= MAX_WEIGHT:
        raise argparse.ArgumentTypeError(f"weight of {name!r}: 1..{MAX_WEIGHT}, not {weight}")
    return text


def cli_queues(texts: Sequence[str] | None) -> list[str] | dict[str, int] | None:
    """The command line's ``--queue`` values as ``Worker(queues=...)`` takes them: plain
    names, or (once any has a weight) every name with its weight (1 when not given)."""
    if not texts:
        return None
    pairs = [split_weight(t) for t in texts]
    if all(w is None for _, w in pairs):
        return list(texts)
    return {name: 1 if w is None else w for name, w in pairs}


class Turns:
    """Whose turn it is to claim, among a worker's fetchers (one claim at a time)."""

    def __init__(self, weights: Mapping[str, int], strict: bool) -> None:
        for name, w in weights.items():
            if not (isinstance(w, int) and 1 <= w <= MAX_WEIGHT):
                raise ConfigurationError(f"queue {name!r}: weight {w!r} is not 1..{MAX_WEIGHT}")
        self.weights = dict(weights)
        self.strict = strict
        self.order = {name: i for i, name in enumerate(weights)}
        self.credit = dict.fromkeys(weights, 0)
        self.waiting: dict[str, asyncio.Future[float]] = {}
        self.busy = False
        self._soon = False
        self._last: dict[str, int] = {}  # the credits the last turn given changed

    @classmethod
    def of(
        cls, queues: Sequence[str] | Mapping[str, int] | None, names: Sequence[str], strict: bool
    ) -> Turns | None:
        """The turns of a worker given ``queues`` (its queues ``names``, shards included):
        None when they are neither weighted nor in strict order (fetchers claim freely)."""
        if isinstance(queues, Mapping):
            return cls(queues, strict)
        return cls(dict.fromkeys(names, 1), strict) if strict else None

    def weight(self, queue: str) -> int:
        """A queue's weight (a shard of a sharded queue has its queue's)."""
        if queue in self.weights:
            return self.weights[queue]
        return self.weights.get(queue.rpartition(":")[0], 1)

    async def take(self, queue: str) -> float:
        """Wait for ``queue``'s turn; its share of the free slots. Every ``take`` that
        returns must be followed by ``done()`` (after ``undo()`` if it claims nothing)."""
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiting[queue] = fut
        self._grant_soon()
        try:
            share = await fut
        except asyncio.CancelledError:
            if self.waiting.get(queue) is fut:
                del self.waiting[queue]
            elif fut.done() and not fut.cancelled():
                self.done()  # granted as it was cancelled: pass the turn on
            raise
        return share

    def undo(self) -> None:
        """The turn just given is not used (no free slot after all): as if not given."""
        for name, delta in self._last.items():
            self.credit[name] -= delta

    def done(self) -> None:
        """The claim of the turn is over: the next one's turn."""
        self.busy = False
        self._grant_soon()

    def _grant_soon(self) -> None:
        # on the next pass of the loop: the fetchers woken together (a slot freed) all
        # wait by then, and the turn goes to the one whose turn it is, not the first to ask
        if not self._soon:
            self._soon = True
            asyncio.get_running_loop().call_soon(self._grant)

    def _grant(self) -> None:
        self._soon = False
        if self.busy or not self.waiting:
            return
        names = list(self.waiting)
        total = sum(self.weight(n) for n in names)
        if self.strict:
            pick = min(names, key=lambda n: self.order.get(n, len(self.order)))
            share = 1.0
        else:
            self._last = {n: self.weight(n) for n in names}
            for n in names:
                self.credit[n] = self.credit.get(n, 0) + self.weight(n)
            pick = max(names, key=lambda n: self.credit[n])
            self.credit[pick] -= total
            self._last[pick] -= total
            share = self.weight(pick) / total
        self.busy = True
        self.waiting.pop(pick).set_result(share)
