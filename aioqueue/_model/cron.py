"""Periodic schedules as values: when a schedule's ticks fall, and how a schedule is stored.

Pure logic, no I/O: ``Spec`` is one schedule (a cron expression in a time zone, or a fixed
interval) and answers "which tick comes after this instant" and "which tick was the last one at
or before it", in integer epoch milliseconds. The scheduler (``_schedules.py``) passes these
ticks to ``schedule.lua``, which judges them by the server's clock.

Cron expressions are parsed by cronsim (the optional extra ``aioqueue[cron]``): 5 fields, or 6
with seconds first. A time zone's DST changes follow Debian cron for expressions at fixed
times (a 02:30 job runs once on the day the clocks skip 02:30, at 03:00, and once on the day
they pass 02:30 twice); expressions that step through minutes or hours (``*/5 * * * *``) tick
in real time.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .exceptions import ConfigurationError

MissedPolicy = Literal["skip", "once"]
MISSED_POLICIES: tuple[str, ...] = ("skip", "once")
#: default: a tick reached later than this (ms) counts as missed
DEFAULT_GRACE_MS = 60_000
#: the longest interval, jitter or grace (ms): 100 years keeps every tick far below 2^53,
#: exact in a Lua number (integer limits count as garbage, I12)
MAX_SPAN_MS = 100 * 366 * 86_400_000


def _cronsim() -> Any:
    try:
        import cronsim
    except ImportError as exc:
        raise ConfigurationError(
            "cron expressions need the cronsim package: pip install 'aioqueue[cron]'"
        ) from exc
    return cronsim


def _zone(tz: str | None) -> ZoneInfo | None:
    if tz is None or tz == "UTC":
        return None
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigurationError(f"unknown time zone {tz!r}") from exc


def _to_dt(ms: int, zone: ZoneInfo | None) -> datetime:
    dt = datetime.fromtimestamp(ms / 1000, UTC)
    return dt if zone is None else dt.astimezone(zone)


def _to_ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class Spec:
    """One periodic schedule: its name, what it enqueues and when.

    Exactly one of ``cron`` (an expression, read in ``tz``) and ``every_ms`` (an interval;
    ticks at the multiples of it since the epoch, so every process agrees on them) is set.
    """

    name: str
    task: str
    queue: str
    cron: str | None = None
    tz: str | None = None
    every_ms: int | None = None
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    missed: MissedPolicy = "skip"
    jitter_ms: int = 0
    grace_ms: int = DEFAULT_GRACE_MS
    #: declared in code (``@app.cron``, ``app.schedule``) rather than added at run time
    declared: bool = False

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every_ms is None):
            raise ConfigurationError(f"schedule {self.name!r}: give cron= or every=, not both")
        if self.missed not in MISSED_POLICIES:
            raise ConfigurationError(
                f"schedule {self.name!r}: missed must be 'skip' or 'once', got {self.missed!r}"
            )
        if self.every_ms is not None and not 1 <= self.every_ms <= MAX_SPAN_MS:
            raise ConfigurationError(
                f"schedule {self.name!r}: every= must be between 1 ms and 100 years"
            )
        if self.tz is not None and self.cron is None:
            raise ConfigurationError(f"schedule {self.name!r}: tz= applies to cron= only")
        if not (0 <= self.jitter_ms <= MAX_SPAN_MS and 0 <= self.grace_ms <= MAX_SPAN_MS):
            raise ConfigurationError(
                f"schedule {self.name!r}: jitter and grace must be between 0 and 100 years"
            )
        if self.cron is not None:
            if len(self.cron.split()) not in (5, 6):
                raise ConfigurationError(
                    f"schedule {self.name!r}: a cron expression has 5 fields (or 6, seconds "
                    f"first), got {self.cron!r}"
                )
            self.next_after(0)  # parses the expression and the zone: fail now, not later

    # ------------------------------------------------------------------ ticks
    def next_after(self, after_ms: int) -> int:
        """The first tick strictly after ``after_ms`` (epoch ms).

        Raises:
            ConfigurationError: the cron expression or the time zone is invalid, or the
                expression never matches.
        """
        if self.every_ms is not None:
            return (after_ms // self.every_ms + 1) * self.every_ms
        assert self.cron is not None
        cronsim = _cronsim()
        zone = _zone(self.tz)
        start = _to_dt(after_ms, zone)
        while True:
            try:
                it = cronsim.CronSim(self.cron, start)
                tick = _to_ms(next(it))
            except (cronsim.CronSimError, StopIteration) as exc:
                raise ConfigurationError(
                    f"schedule {self.name!r}: invalid cron expression {self.cron!r}: {exc}"
                ) from exc
            # cronsim reads fixed-time expressions in local wall time: on the night the clocks
            # go back, a start in the repeated hour can yield a tick behind it
            if tick > after_ms:
                return tick
            start = _to_dt(tick, zone)

    def last_at_or_before(self, at_ms: int, since_ms: int) -> int:
        """The last tick in ``(since_ms, at_ms]`` (callers ask only when ``since_ms``'s
        successor is at or before ``at_ms``; it is the answer when no later one is)."""
        first = self.next_after(since_ms)
        if self.every_ms is not None:
            return max(at_ms // self.every_ms * self.every_ms, first)
        assert self.cron is not None
        cronsim = _cronsim()
        try:  # backwards from at_ms (+1 ms: cronsim starts before a whole second)
            back = cronsim.CronSim(self.cron, _to_dt(at_ms + 1, _zone(self.tz)), True)
            prev = _to_ms(next(back))
        except (cronsim.CronSimError, StopIteration):
            prev = since_ms
        # then forwards from just before it, so DST days give exactly the forward ticks
        best, tick = first, self.next_after(max(prev - 1, since_ms))
        for _ in range(10_000):
            if tick > at_ms:
                break
            best, tick = tick, self.next_after(tick)
        return max(best, first)

    def jitter_for(self, tick_ms: int) -> int:
        """The delay (ms) of the tick's job: the same for a tick in every process."""
        if self.jitter_ms <= 0:
            return 0
        digest = hashlib.blake2b(f"{self.name}:{tick_ms}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") % (self.jitter_ms + 1)

    def plan(self, stored_tick: int, now_ms: int) -> tuple[int | None, int]:
        """What a scheduler does with a due schedule whose stored next tick is
        ``stored_tick`` at server time ``now_ms``: (the tick whose job to enqueue, or None,
        the next tick to store).

        A tick reached at most ``grace_ms`` late runs. Ticks later than that are missed:
        ``skip`` drops them, ``once`` runs one job, for the last of them. Either way the stored
        tick moves to the first tick that is not missed.
        """
        if now_ms - stored_tick <= self.grace_ms:
            return stored_tick, self.next_after(stored_tick)
        last_missed = self.last_at_or_before(now_ms - self.grace_ms - 1, stored_tick - 1)
        after = self.next_after(last_missed)
        return (last_missed if self.missed == "once" else None), after

    def describe(self) -> str:
        """The schedule's timing, for listings: ``cron '*/5 * * * *' Europe/Berlin``."""
        if self.cron is not None:
            return f"cron {self.cron!r}" + (f" {self.tz}" if self.tz else " UTC")
        assert self.every_ms is not None
        return f"every {timedelta(milliseconds=self.every_ms)}"

    # ------------------------------------------------------------------ storage
    def to_json(self) -> str:
        """The stored definition (canonical: equal specs give equal text)."""
        rec: dict[str, Any] = {
            "task": self.task,
            "cron": self.cron,
            "tz": self.tz,
            "every_ms": self.every_ms,
            "args": list(self.args),
            "kwargs": dict(self.kwargs),
            "missed": self.missed,
            "jitter_ms": self.jitter_ms,
            "grace_ms": self.grace_ms,
            "declared": self.declared,
        }
        return json.dumps(rec, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, name: str, queue: str, data: bytes | str) -> Spec:
        """A stored definition read back.

        Raises:
            ValueError: the definition is garbled.
        """
        try:
            rec = json.loads(data)
            if not isinstance(rec, dict):
                raise ValueError("not a JSON object")
            return cls(
                name=name,
                task=str(rec["task"]),
                queue=queue,
                cron=rec.get("cron"),
                tz=rec.get("tz"),
                every_ms=None if rec.get("every_ms") is None else _int(rec, "every_ms", 0),
                args=tuple(rec.get("args") or ()),
                kwargs=dict(rec.get("kwargs") or {}),
                missed=rec.get("missed", "skip"),
                jitter_ms=_int(rec, "jitter_ms", 0),
                grace_ms=_int(rec, "grace_ms", DEFAULT_GRACE_MS),
                declared=bool(rec.get("declared", False)),
            )
        except (AttributeError, ConfigurationError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"schedule {name!r}: garbled definition: {exc}") from exc


def _int(rec: Mapping[str, Any], key: str, default: int) -> int:
    """An integer field of a stored definition: a float, a string or a bool is garbage."""
    value = rec.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} is not an integer: {value!r}")
    return value


def interval_ms(every: float | timedelta, what: str = "every") -> int:
    """An interval in ms, from seconds or a timedelta (at least 1 ms, finite)."""
    seconds = every.total_seconds() if isinstance(every, timedelta) else every
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ConfigurationError(f"{what} must be seconds or a timedelta, got {every!r}")
    if not math.isfinite(seconds) or seconds < 0.001:
        raise ConfigurationError(f"{what} must be at least 1 ms, got {every!r}")
    return round(seconds * 1000)


def job_id_for(name: str, tick_ms: int) -> str:
    """The id of a tick's job: the same in every process, so enqueueing it is idempotent."""
    return f"cron:{name}:{tick_ms}"
