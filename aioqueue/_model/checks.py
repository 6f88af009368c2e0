"""Checks of the values a user gives, in one place: names, ids, groups, counts, priorities,
durations and times; and new job ids.

Every check raises ``ConfigurationError`` (a ``ValueError``) naming the argument, at the call
that received it, so that nothing a server or a script cannot hold is ever sent. Every layer
validates with these, so they sit at the bottom and import nothing of aioqueue but its
exceptions.

Bounds, and why:

- text (task names, job ids, groups): a non-empty ``str`` that encodes as UTF-8 (no lone
  surrogates), at most ``MAX_ID_CHARS`` characters (groups: ``MAX_GROUP_CHARS``);
- queue names and key prefixes: 1-200 characters from ``A-Z a-z 0-9 _ . -`` (queue names may
  also hold ``:``; a prefix may not, so that one app's keys never nest under another app's
  ``~prefix:*`` ACL glob);
- ``max_attempts``: 1 to 2**31-1;
- durations: finite, at least 0 (leases: positive), at most ``MAX_SECONDS`` (100 years), and
  absolute times at most that far ahead: the scripts count in integer milliseconds, which must
  stay exact in Lua's doubles.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import time
from datetime import datetime, timedelta

from .exceptions import ConfigurationError

MIN_PRIORITY = -100
MAX_PRIORITY = 100
#: longest duration (and furthest time ahead) accepted anywhere: 100 years, in seconds
MAX_SECONDS = 100 * 365 * 86_400
MAX_ATTEMPTS = 2**31 - 1
#: longest task name or job id, in characters
MAX_ID_CHARS = 256
MAX_GROUP_CHARS = 200

_QUEUE_NAME = re.compile(r"[A-Za-z0-9_.:\-]{1,200}")
_PREFIX = re.compile(r"[A-Za-z0-9_.\-]{1,200}")


# --------------------------------------------------------------------- names and text
def check_name(kind: str, value: str) -> str:
    """A queue name: 1-200 characters from ``A-Z a-z 0-9 _ . : -`` (no braces, so the hash
    tag stays intact; no whitespace, not even a trailing newline)."""
    if not isinstance(value, str) or not _QUEUE_NAME.fullmatch(value):
        raise ConfigurationError(
            f"invalid {kind} {value!r}: use 1-200 characters from A-Z a-z 0-9 _ . : -"
        )
    return value


def check_prefix(value: str) -> str:
    """A key prefix: like a queue name but without ``:``, so that the keys of one app never
    fall under another app's ``~prefix:*`` ACL glob."""
    if not isinstance(value, str) or not _PREFIX.fullmatch(value):
        raise ConfigurationError(
            f"invalid key prefix {value!r}: use 1-200 characters from A-Z a-z 0-9 _ . - "
            "(no ':', so that it cannot nest under another prefix)"
        )
    return value


def check_text(value: str, what: str, max_chars: int = MAX_ID_CHARS) -> str:
    """A non-empty string of at most ``max_chars`` characters that encodes as UTF-8."""
    if not isinstance(value, str) or not 0 < len(value) <= max_chars:
        shown = repr(value)
        if isinstance(value, str) and len(value) > 60:  # never echo a huge value back
            shown = f"{value[:40]!r}... ({len(value)} characters)"
        raise ConfigurationError(
            f"{what} must be a non-empty string of at most {max_chars} characters: {shown}"
        )
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise ConfigurationError(
            f"{what} {value!r} is not valid text: {exc.reason} at position {exc.start}"
        ) from None
    return value


def check_group(group: str) -> str:
    return check_text(group, "group", MAX_GROUP_CHARS)


def check_job_id(job_id: str) -> str:
    return check_text(job_id, "job_id")


def check_task_name(name: str) -> str:
    return check_text(name, "task name")


# --------------------------------------------------------------------- numbers
def check_priority(priority: int) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ConfigurationError(f"priority must be an int, not {priority!r}")
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ConfigurationError(
            f"priority {priority} out of range {MIN_PRIORITY}..{MAX_PRIORITY} (higher runs first)"
        )
    return priority


def check_int(
    value: int, minimum: int, what: str, note: str = "", maximum: int | None = None
) -> int:
    """An int (not a bool) of at least ``minimum`` (and at most ``maximum``), or
    ConfigurationError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{what} must be an int >= {minimum}{note}, not {value!r}")
    if maximum is not None and value > maximum:
        raise ConfigurationError(f"{what} must be at most {maximum}{note}, not {value!r}")
    return value


def check_attempts(n: int) -> int:
    return check_int(n, 1, "max_attempts", maximum=MAX_ATTEMPTS)


# --------------------------------------------------------------------- durations and times
def to_seconds(value: float | timedelta | None, what: str = "timeout") -> float | None:
    """Normalise an optional duration to seconds: finite, >= 0, at most 100 years."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"{what} must be seconds (a number or timedelta), not {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ConfigurationError(f"{what} must be a finite number of seconds >= 0, not {value!r}")
    if value > MAX_SECONDS:
        raise ConfigurationError(
            f"{what} must be at most {MAX_SECONDS} seconds (100 years), not {value!r}"
        )
    return float(value)


def to_ms(value: float | timedelta, what: str) -> int:
    """A non-negative duration in integer milliseconds."""
    sec = to_seconds(value, what)
    assert sec is not None
    return round(sec * 1000)


def lease_ms(value: float | timedelta, what: str = "lease", minimum_ms: int = 1) -> int:
    """A lease in integer milliseconds: positive (at least ``minimum_ms``) and bounded."""
    ms = to_ms(value, what)
    if ms < minimum_ms:
        raise ConfigurationError(f"{what} must be at least {minimum_ms / 1000:g} s, not {value!r}")
    return ms


def at_to_ms(at: datetime | float) -> int:
    """An absolute time (aware datetime, or POSIX seconds) in epoch milliseconds, at most 100
    years from now."""
    if isinstance(at, datetime):
        if at.tzinfo is None:
            raise ConfigurationError("at= needs a timezone-aware datetime (e.g. tzinfo=UTC)")
        seconds = at.timestamp()
    elif isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at) or at < 0:
        raise ConfigurationError(f"at= must be an aware datetime or POSIX seconds, not {at!r}")
    else:
        seconds = float(at)
    if seconds > time.time() + MAX_SECONDS:
        raise ConfigurationError(f"at= must be at most 100 years from now, not {at!r}")
    return int(seconds * 1000)


def expiry_option(expires: datetime | float | timedelta) -> tuple[str, int]:
    """The job option that stores ``expires=``: ("expires_at_ms", epoch ms) for an aware
    datetime (at most 100 years from now), ("expires_after_ms", ms) for a duration, counted
    from the job's creation by the server's clock."""
    if isinstance(expires, datetime):
        if expires.tzinfo is None:
            raise ConfigurationError("expires= needs a timezone-aware datetime (e.g. tzinfo=UTC)")
        if expires.timestamp() > time.time() + MAX_SECONDS:
            raise ConfigurationError(
                f"expires= must be at most 100 years from now, not {expires!r}"
            )
        return "expires_at_ms", max(int(expires.timestamp() * 1000), 0)
    return "expires_after_ms", to_ms(expires, "expires")


# --------------------------------------------------------------------- new job ids
_BASE62 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


class _Ids:
    """Job ids: 11 random letters and digits per process (64 random bits in base 62), then a
    counter in hex. Unique without a round trip and cheaper than uuid4; short, because every
    queued job stores its id twice (its record's key, its place in a lane); a forked child
    draws a new prefix."""

    def __init__(self) -> None:
        self.reseed()

    def reseed(self) -> None:
        n = int.from_bytes(os.urandom(8), "big")
        digits = []
        for _ in range(11):  # 62**11 > 2**64
            n, d = divmod(n, 62)
            digits.append(_BASE62[d])
        self.prefix = "".join(digits)
        self.counter = itertools.count(1)

    def next(self) -> str:
        return f"{self.prefix}{next(self.counter):x}"


_IDS = _Ids()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_IDS.reseed)


def new_job_id() -> str:
    return _IDS.next()


def retention_seconds(
    result_ttl: float | timedelta | None, keep_result: float | timedelta | bool | None
) -> float | None:
    """A task's result retention in seconds (-1.0: for good; None: the App's)."""
    if keep_result is None:
        return to_seconds(result_ttl, "result_ttl")
    if result_ttl is not None:
        raise ConfigurationError("give keep_result= or result_ttl=, not both")
    if keep_result is True:
        return -1.0
    if keep_result is False:
        return 0.0
    return to_seconds(keep_result, "keep_result")
