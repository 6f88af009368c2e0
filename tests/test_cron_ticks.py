"""The next-tick logic of schedules (aioqueue/_model/cron.py): pure functions on a fixed clock."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from aioqueue._model.cron import Spec, interval_ms, job_id_for
from aioqueue._model.exceptions import ConfigurationError

BERLIN = ZoneInfo("Europe/Berlin")


def ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def local(ms_: int) -> datetime:
    return datetime.fromtimestamp(ms_ / 1000, UTC).astimezone(BERLIN)


def ticks(spec: Spec, start: datetime, end: datetime) -> list[int]:
    out, t = [], spec.next_after(ms(start))
    while t < ms(end):
        out.append(t)
        t = spec.next_after(t)
    return out


def cron(expr: str, tz: str | None = "Europe/Berlin", **kw: object) -> Spec:
    return Spec(name="s", task="t", queue="q", cron=expr, tz=tz, **kw)  # type: ignore[arg-type]


def test_a_0230_job_runs_once_on_the_spring_forward_day() -> None:
    # 2026-03-29: Berlin's clocks jump from 02:00 to 03:00; 02:30 does not exist
    spec = cron("30 2 * * *")
    got = ticks(
        spec, datetime(2026, 3, 28, 12, tzinfo=BERLIN), datetime(2026, 3, 30, 12, tzinfo=BERLIN)
    )
    assert [local(t).strftime("%m-%d %H:%M") for t in got] == ["03-29 03:00", "03-30 02:30"]


def test_a_0230_job_runs_once_on_the_fall_back_day() -> None:
    # 2026-10-25: Berlin's clocks go back from 03:00 to 02:00; 02:30 happens twice
    spec = cron("30 2 * * *")
    got = ticks(
        spec, datetime(2026, 10, 24, 12, tzinfo=BERLIN), datetime(2026, 10, 26, 12, tzinfo=BERLIN)
    )
    assert len(got) == 2
    first = local(got[0])
    assert (first.day, first.hour, first.minute) == (25, 2, 30)
    assert got[1] - got[0] == 25 * 3600 * 1000  # the next day's 02:30: a 25-hour day


def test_fall_back_from_inside_the_repeated_hour_does_not_go_back() -> None:
    # starting in the second 02:15 (after the first 02:30 ran), the next tick is tomorrow's
    spec = cron("30 2 * * *")
    second_0215 = datetime(2026, 10, 25, 2, 15, tzinfo=BERLIN, fold=1)
    t = spec.next_after(ms(second_0215))
    assert t > ms(second_0215)
    assert local(t).day == 26


def test_stepping_expressions_tick_in_real_time_across_dst() -> None:
    spec = cron("0 * * * *")  # every hour: the night the clocks go back has 25 of them
    second = timedelta(seconds=1)
    day = datetime(2026, 10, 25, 0, tzinfo=BERLIN) - second, datetime(2026, 10, 26, tzinfo=BERLIN)
    got = ticks(spec, *day)
    assert len(got) == 25
    assert len(set(got)) == 25
    spring = ticks(
        spec, datetime(2026, 3, 29, tzinfo=BERLIN) - second, datetime(2026, 3, 30, tzinfo=BERLIN)
    )
    assert len(spring) == 23


def test_six_fields_have_seconds_first() -> None:
    spec = cron("*/15 * * * * *", tz=None)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    got = ticks(spec, start, start + timedelta(minutes=1))
    assert [(t - ms(start)) // 1000 for t in got] == [15, 30, 45]


def test_time_zone_shifts_the_ticks() -> None:
    spec = cron("0 9 * * *")
    t = spec.next_after(ms(datetime(2026, 7, 1, tzinfo=UTC)))
    assert datetime.fromtimestamp(t / 1000, UTC).hour == 7  # 09:00 CEST is 07:00 UTC


def test_every_ticks_on_multiples_of_the_interval() -> None:
    spec = Spec(name="s", task="t", queue="q", every_ms=interval_ms(timedelta(minutes=5)))
    assert spec.next_after(0) == 300_000
    assert spec.next_after(299_999) == 300_000
    assert spec.next_after(300_000) == 600_000


def test_plan_runs_a_late_tick_within_grace() -> None:
    spec = Spec(name="s", task="t", queue="q", every_ms=1000, grace_ms=5000)
    assert spec.plan(10_000, 14_000) == (10_000, 11_000)


def test_plan_skip_drops_missed_ticks() -> None:
    spec = Spec(name="s", task="t", queue="q", every_ms=1000, grace_ms=5000)
    # down from 10 s to 100 s: ticks up to 94 s are missed; 95 s is the first one within grace
    assert spec.plan(10_000, 100_000) == (None, 95_000)


def test_plan_once_runs_one_job_for_the_missed_ticks() -> None:
    spec = Spec(name="s", task="t", queue="q", every_ms=1000, grace_ms=5000, missed="once")
    assert spec.plan(10_000, 100_000) == (94_000, 95_000)


def test_plan_once_with_cron() -> None:
    spec = cron("0 3 * * *", missed="once", grace_ms=0)
    stored = spec.next_after(ms(datetime(2026, 5, 1, tzinfo=BERLIN)))
    now = ms(datetime(2026, 5, 4, 12, tzinfo=BERLIN))
    fire, after = spec.plan(stored, now)
    assert fire is not None
    assert local(fire).strftime("%m-%d %H:%M") == "05-04 03:00"
    assert local(after).strftime("%m-%d %H:%M") == "05-05 03:00"


def test_jitter_is_deterministic_per_tick_and_bounded() -> None:
    spec = Spec(name="s", task="t", queue="q", every_ms=1000, jitter_ms=500)
    values = [spec.jitter_for(t) for t in range(0, 100_000, 1000)]
    assert values == [spec.jitter_for(t) for t in range(0, 100_000, 1000)]
    assert all(0 <= v <= 500 for v in values)
    assert len(set(values)) > 10


def test_definitions_round_trip() -> None:
    spec = cron("*/5 * * * *", args=(1, "x"), kwargs={"k": [1]}, missed="once", jitter_ms=3)
    back = Spec.from_json("s", "q", spec.to_json())
    assert back == spec
    assert back.to_json() == spec.to_json()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"cron": "61 * * * *"},
        {"cron": "* * *"},
        {"cron": "* * * * *", "tz": "Mars/Olympus"},
        {"cron": "* * * * *", "every_ms": 5},
        {},
        {"every_ms": 0},
        {"every_ms": 10, "missed": "all"},
        {"every_ms": 10, "tz": "Europe/Berlin"},
    ],
)
def test_bad_specs_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        Spec(name="s", task="t", queue="q", **kwargs)  # type: ignore[arg-type]


def test_garbled_definitions_raise_value_error() -> None:
    for data in (b"{", b"[]", b'{"cron": "* * * * *"}', b'{"task": "t", "every_ms": "x"}'):
        with pytest.raises(ValueError, match="garbled definition"):
            Spec.from_json("s", "q", data)


def test_job_ids_are_derived_from_name_and_tick() -> None:
    assert job_id_for("nightly", 1_700_000_000_000) == "cron:nightly:1700000000000"


def test_without_the_cron_extra_cron_expressions_ask_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "cronsim", None)  # as if not installed
    with pytest.raises(ConfigurationError, match=r"aioqueue\[cron\]"):
        cron("* * * * *")
    # intervals need no extra
    assert Spec(name="s", task="t", queue="q", every_ms=1000).next_after(0) == 1000
