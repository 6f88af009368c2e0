"""Spans of a worker process, for the two-process tracing test: ``export_to_file`` traces an
App with the OpenTelemetry SDK and writes each finished span to a file, one JSON object per
line (trace and span ids in hex, its parent's span id, name, kind, attributes)."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from aioqueue import App
from aioqueue.otel import instrument


class JsonLinesExporter(SpanExporter):
    """Appends each span to ``path`` as a JSON line."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.lock, self.path.open("a") as out:
            for s in spans:
                out.write(json.dumps(as_record(s)) + "\n")
        return SpanExportResult.SUCCESS


def as_record(s: ReadableSpan) -> dict[str, Any]:
    ctx = s.get_span_context()
    assert ctx is not None
    return {
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": None if s.parent is None else f"{s.parent.span_id:016x}",
        "name": s.name,
        "kind": s.kind.name,
        "attributes": dict(s.attributes or {}),
        "status": s.status.status_code.name,
        "events": [e.name for e in s.events],
    }


def export_to_file(app: App, path: str) -> TracerProvider:
    """Trace ``app`` into ``path`` (see the module docstring)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(path)))
    instrument(app, provider)
    return provider


def read_spans(path: Path) -> list[dict[str, Any]]:
    """The spans written to ``path`` so far."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
