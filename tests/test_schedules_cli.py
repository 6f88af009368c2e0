"""``python -m aioqueue schedules``: the stored schedules and their next runs, as a table and
as JSON, run as a user runs it (a subprocess)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from aioqueue import App

from .test_cli import cli, one_line_error


async def test_schedules_are_listed_with_their_next_runs(
    app: App, redis_url: str, tmp_path: Path
) -> None:
    await app.schedules.add("report", cron="0 9 * * 1-5", tz="Europe/Berlin", args=["daily"])
    await app.schedules.add("sync", every=300, queue="images", missed="once")
    base = ["schedules", "--url", redis_url, "--prefix", app.prefix]

    table = cli(tmp_path, *base)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.strip().splitlines()
    assert lines[0].split()[:3] == ["NAME", "QUEUE", "TASK"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(rows) == {"report", "sync"}
    assert "0 9 * * 1-5 (Europe/Berlin)" in rows["report"]
    assert "every 300 s" in rows["sync"]
    assert "images" in rows["sync"]

    out = cli(tmp_path, *base, "--json")
    assert out.returncode == 0, out.stderr
    records = {r["name"]: r for r in json.loads(out.stdout)}
    sync = records["sync"]
    assert (sync["queue"], sync["task"], sync["every_seconds"], sync["missed"]) == (
        "images",
        "sync",
        300.0,
        "once",
    )
    assert sync["next_run_ms"] % 300_000 == 0
    assert datetime.fromisoformat(sync["next_run"]) == datetime.fromtimestamp(
        sync["next_run_ms"] / 1000, UTC
    )
    report = records["report"]
    assert (report["cron"], report["tz"], report["args"]) == (
        "0 9 * * 1-5",
        "Europe/Berlin",
        ["daily"],
    )
    stored = {s.name: s.next_run for s in await app.schedules.list()}
    assert report["next_run"] == stored["report"].isoformat()  # type: ignore[union-attr]

    only = cli(tmp_path, *base, "-q", "images", "--json")
    assert [r["name"] for r in json.loads(only.stdout)] == ["sync"]


def test_no_schedules_and_a_bad_url(redis_url: str, tmp_path: Path) -> None:
    empty = cli(tmp_path, "schedules", "--url", redis_url, "--prefix", "nothing-here")
    assert (empty.returncode, empty.stdout.strip()) == (0, "no schedules")
    bad = cli(tmp_path, "schedules", "--url", "http://localhost")
    assert bad.returncode == 2
    assert "invalid Redis URL" in one_line_error(bad)
    down = cli(tmp_path, "schedules", "--url", "redis://127.0.0.1:1/0")
    assert down.returncode == 1
    assert "cannot reach" in one_line_error(down)
