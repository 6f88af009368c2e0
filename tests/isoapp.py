"""Task functions of the process-isolation tests (tests/test_isolation.py), at the top level
of a module so that a child process imports them by name. Plain functions: each test
registers the ones it needs on its own App (``app.task(isolation="process")(isoapp.spin)``).

``app`` is for the command line's worker (``python -m aioqueue worker tests.isoapp:app``), on the
prefix ``$ISOAPP_PREFIX``; its task ``pid`` is not declared isolated, ``spin`` is."""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass
from pathlib import Path

from aioqueue import App, Retry
from aioqueue._worker.child import rss_bytes

#: what ``leak`` keeps: memory a child holds until it ends
_KEPT: list[bytes] = []


@dataclass(frozen=True)
class Box:
    w: int
    h: int


def pid() -> int:
    return os.getpid()


app = App(prefix=os.environ.get("ISOAPP_PREFIX", "isoapp"))
app.task(name="pid")(pid)


async def apid() -> int:
    return os.getpid()


def area(box: Box) -> int:
    """Its argument arrives typed (a Box, not a dict): the child decodes it."""
    assert isinstance(box, Box), type(box)
    return box.w * box.h


def _write_pid(path: str) -> None:
    """The child's pid into ``path``, whole once it exists (a test waits for the file, then
    reads it: a plain write let it read an empty file, once, on a busy machine)."""
    Path(path + ".part").write_text(str(os.getpid()))
    os.replace(path + ".part", path)


def spin(path: str) -> None:
    """Write the child's pid, then spin on the CPU for good."""
    _write_pid(path)
    while True:
        pass


def sleep_sync(path: str) -> None:
    """Write the child's pid, then block for good (a call a thread's timeout cannot stop)."""
    _write_pid(path)
    time.sleep(3600)


def segfault() -> None:
    ctypes.string_at(0)


def exit_now(code: int) -> None:
    os._exit(code)


def leak(mb: int) -> tuple[int, int]:
    """Keep ``mb`` MB more (touched, so resident); the child's pid and resident bytes."""
    _KEPT.append(b"x" * (mb << 20))
    return os.getpid(), rss_bytes()


def boom() -> None:
    raise ValueError("boom in a child")


def retry_once(path: str) -> str:
    marker = Path(path)
    if not marker.exists():
        marker.write_text("1")
        raise Retry(0.0, "once more")
    return "second time"


app.task(name="spin", isolation="process")(spin)
