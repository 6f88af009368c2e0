"""Times: seconds (float or timedelta) in the public API, integer milliseconds inside."""

from __future__ import annotations

import math
import time
from datetime import datetime, timedelta

from ._exceptions import ConfigurationError, ResultTimeout


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


def to_seconds(value: float | timedelta | None, what: str = "timeout") -> float | None:
    """Normalise an optional duration to seconds, rejecting negative or non-finite values."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"{what} must be seconds (a number or timedelta), not {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ConfigurationError(f"{what} must be a finite number of seconds >= 0, not {value!r}")
    return float(value)


def to_ms(value: float | timedelta, what: str) -> int:
    """A non-negative duration in integer milliseconds."""
    sec = to_seconds(value, what)
    assert sec is not None
    return round(sec * 1000)


def expiry_option(expires: datetime | float | timedelta) -> tuple[str, int]:
    """The job option that stores ``expires=``: ("expires_at_ms", epoch ms) for an aware
    datetime, ("expires_after_ms", ms) for a duration, counted from the job's creation by the
    server's clock."""
    if isinstance(expires, datetime):
        if expires.tzinfo is None:
            raise ConfigurationError("expires= needs a timezone-aware datetime (e.g. tzinfo=UTC)")
        return "expires_at_ms", max(int(expires.timestamp() * 1000), 0)
    return "expires_after_ms", to_ms(expires, "expires")


def at_to_ms(at: datetime | float) -> int:
    """An absolute time (aware datetime, or POSIX seconds) in epoch milliseconds."""
    if isinstance(at, datetime):
        if at.tzinfo is None:
            raise ConfigurationError("at= needs a timezone-aware datetime (e.g. tzinfo=UTC)")
        return int(at.timestamp() * 1000)
    if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at) or at < 0:
        raise ConfigurationError(f"at= must be an aware datetime or POSIX seconds, not {at!r}")
    return int(at * 1000)
