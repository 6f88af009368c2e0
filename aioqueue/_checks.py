"""Checks of the values a user gives (priorities, groups, ids, counts), and new job ids.

Every layer validates with these, so they sit at the bottom and import nothing of aioqueue but
its exceptions.
"""

from __future__ import annotations

import itertools
import os

from ._exceptions import ConfigurationError

MIN_PRIORITY = -100
MAX_PRIORITY = 100


def check_group(group: str) -> str:
    if not isinstance(group, str) or not 0 < len(group) <= 200:
        raise ConfigurationError(
            f"group must be a non-empty string of at most 200 chars: {group!r}"
        )
    return group


def check_priority(priority: int) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ConfigurationError(f"priority must be an int, not {priority!r}")
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ConfigurationError(
            f"priority {priority} out of range {MIN_PRIORITY}..{MAX_PRIORITY} (higher runs first)"
        )
    return priority


def check_int(value: int, minimum: int, what: str, note: str = "") -> int:
    """An int (not a bool) of at least ``minimum``, or ConfigurationError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{what} must be an int >= {minimum}{note}, not {value!r}")
    return value


def check_attempts(n: int) -> int:
    return check_int(n, 1, "max_attempts")


def check_job_id(job_id: str) -> str:
    if not isinstance(job_id, str) or not 0 < len(job_id) <= 256:
        raise ConfigurationError(
            f"job_id must be a non-empty string of at most 256 chars: {job_id!r}"
        )
    return job_id


class _Ids:
    """Job ids: 16 random hex digits per process, then a counter. Unique without a round trip
    and cheaper than uuid4; a forked child draws a new prefix."""

    def __init__(self) -> None:
        self.reseed()

    def reseed(self) -> None:
        self.prefix = os.urandom(8).hex()
        self.counter = itertools.count(1)

    def next(self) -> str:
        return f"{self.prefix}{next(self.counter):x}"


_IDS = _Ids()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_IDS.reseed)


def new_job_id() -> str:
    return _IDS.next()
