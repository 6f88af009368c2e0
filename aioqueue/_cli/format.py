"""How the admin commands print: plain-text tables for people, JSON for scripts.

Every human-readable line goes through ``_safetext.escape`` here (``echo``, ``table``,
``error``): no planted text sends a terminal a control sequence. Standard library only (the
core takes no dependency for a CLI; docs/operations.md says why).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import sys
from collections.abc import Sequence
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

from .._model.safetext import escape


def plain(value: Any) -> Any:
    """A value as JSON can hold it: records become objects, enums their values, tuples lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((plain(v) for v in value), key=str)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, datetime | date | time):
        return value.isoformat()  # ISO 8601 (a datetime's offset included when it has one)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, float) and not math.isfinite(value):
        return None  # NaN and infinities are not JSON
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value) if isinstance(value, UUID | Decimal | Path) else repr(value)


def emit_json(value: Any) -> None:
    json.dump(plain(value), sys.stdout, indent=2, sort_keys=False, allow_nan=False)
    sys.stdout.write("\n")


def when(ms: int | None) -> str:
    """Epoch ms as UTC time of day (with the date when it is not today), or '-'."""
    if ms is None:
        return "-"
    t = datetime.fromtimestamp(ms / 1000, UTC)
    if t.date() == datetime.now(UTC).date():
        return t.strftime("%H:%M:%S")
    return t.strftime("%Y-%m-%d %H:%M:%S")


def clip(text: str, width: int) -> str:
    text = escape(" ".join(text.split()))
    return text if len(text) <= width else text[: width - 1] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to their widest cell; numbers right-aligned."""
    cells = [
        [str(c) for c in headers],
        *[["-" if c is None else escape(str(c)) for c in r] for r in rows],
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [
        all(isinstance(r[i], int | float) for r in rows) and bool(rows) for i in range(len(headers))
    ]
    lines = []
    for r in cells:
        parts = [
            c.rjust(w) if num else c.ljust(w) for c, w, num in zip(r, widths, numeric, strict=True)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def echo(text: str = "") -> None:
    """Print ``text``, its control characters escaped (its line breaks kept: escape a value
    that must stay on one line with ``escape`` first)."""
    sys.stdout.write(escape(text, newlines=True) + "\n")


def error(message: object) -> None:
    """Print ``aioqueue: error: <message>`` on stderr, on one line, control characters
    escaped (a message may quote a task name, a host, a server's reply)."""
    sys.stderr.write(f"aioqueue: error: {escape(str(message))}\n")
