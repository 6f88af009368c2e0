"""Inline SVG charts drawn on the server from numbers only (no user text goes in them)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

WIDTH = 720
HEIGHT = 150
PAD_LEFT = 40
PAD_BOTTOM = 20


def _label(ms: int, fmt: str) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime(fmt)


def bars(
    series: Sequence[tuple[int, int, int]], which: int, css: str, title: str, fmt: str = "%H:%M"
) -> str:
    """A bar per bucket of ``series`` ((start ms, value 1, value 2), oldest first: completed
    and failed, or backlog and wait), of column ``which`` (1 or 2), as an ``<svg>`` element;
    the time axis labelled with ``fmt`` (strftime, UTC)."""
    values = [int(row[which]) for row in series]
    top = max([1, *values])
    n = max(1, len(values))
    plot_w = WIDTH - PAD_LEFT - 4
    plot_h = HEIGHT - PAD_BOTTOM - 8
    bw = plot_w / n
    parts = [
        f'<svg class="chart {css}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{title}: {sum(values)} over {len(values)} buckets" '
        'preserveAspectRatio="none">',
        f'<line class="axis" x1="{PAD_LEFT}" y1="{8 + plot_h}" x2="{WIDTH - 4}" '
        f'y2="{8 + plot_h}"/>',
        f'<text class="tick" x="{PAD_LEFT - 6}" y="14" text-anchor="end">{top}</text>',
        f'<text class="tick" x="{PAD_LEFT - 6}" y="{8 + plot_h}" text-anchor="end">0</text>',
    ]
    for i, v in enumerate(values):
        if v <= 0:
            continue
        h = max(1.0, plot_h * v / top)
        x = PAD_LEFT + i * bw
        parts.append(
            f'<rect x="{x + 0.5:.1f}" y="{8 + plot_h - h:.1f}" width="{max(1.0, bw - 1):.1f}" '
            f'height="{h:.1f}"><title>{_label(series[i][0], fmt)}: {v}</title></rect>'
        )
    if series:
        last = len(series) - 1
        for i, anchor in ((0, "start"), (last // 2, "middle"), (last, "end")):
            x = {"start": PAD_LEFT, "middle": PAD_LEFT + i * bw + bw / 2}.get(anchor, WIDTH - 4)
            parts.append(
                f'<text class="tick" x="{x:.1f}" y="{HEIGHT - 4}" text-anchor="{anchor}">'
                f"{_label(series[i][0], fmt)}</text>"
            )
    parts.append("</svg>")
    return "".join(parts)
