"""Deadlines of waits, by the monotonic clock (the checks of user-given times and durations
are in ``_checks``); server times read back from ZSET scores."""

from __future__ import annotations

import time

from .exceptions import ResultTimeout


class Deadline:
    """The time limit of a wait for ``what`` to finish: ``timeout`` seconds from now, by the
    monotonic clock (asyncio's too), or none."""

    __slots__ = ("at", "timeout", "what")

    def __init__(self, timeout: float | None, what: str) -> None:
        self.timeout = timeout
        self.what = what
        self.at = None if timeout is None else time.monotonic() + timeout

    def remaining(self, cap: float) -> float:
        """Seconds left, at most ``cap``.

        Raises:
            ResultTimeout: none left.
        """
        if self.at is None:
            return cap
        left = self.at - time.monotonic()
        if left <= 0:
            raise ResultTimeout(f"{self.what} did not finish within {self.timeout} s")
        return min(cap, left)


#: the ends of the server's 64-bit integers, where a score of +-inf is clamped
_INT64_MAX = 2**63 - 1


def score_ms(score: float) -> int:
    """A time (ms) read back from a ZSET score, which anyone with write access could have set
    to +-inf: clamped to the 64-bit range (NaN, which no score can hold, reads as 0)."""
    if score != score:
        return 0
    return int(max(-_INT64_MAX - 1, min(_INT64_MAX, score)))
