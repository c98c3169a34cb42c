"""Small SVG charts drawn on the server: a sparkline of a latency series, bars of a count series.

Pure functions of numbers to SVG text, so a page needs no chart library and shows them with
JavaScript off. Every value is formatted as a number here; nothing from a request reaches the markup
except the `label`, which is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

__all__ = ["bars", "sparkline"]

_Series = Sequence[float | int | None]


def _clean(values: _Series) -> list[float | None]:
    """Non-finite and negative points count as missing (a minute without calls has no p50)."""
    return [float(v) if v is not None and math.isfinite(v) and v >= 0 else None for v in values]


def _frame(width: int, height: int, label: str, body: str) -> str:
    title = escape(label)
    return (
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{title}"><title>{title}</title>{body}</svg>'
    )


def sparkline(values: _Series, *, width: int = 120, height: int = 28, label: str = "") -> str:
    """A line through the points, scaled to the largest; a gap where a point is missing, a dot on the last."""
    points = _clean(values)
    known = [v for v in points if v is not None]
    if not known:
        return _frame(width, height, label or "no data", "")
    top = max(known) or 1.0
    step = width / max(len(points) - 1, 1)
    pad = 2.0
    usable = height - 2 * pad
    paths: list[list[str]] = [[]]
    last = ""
    for index, value in enumerate(points):
        if value is None:
            if paths[-1]:
                paths.append([])
            continue
        x = index * step if len(points) > 1 else width / 2
        y = pad + usable * (1 - value / top)
        last = f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2"/>'
        paths[-1].append(f"{x:.1f},{y:.1f}")
    lines = "".join(f'<polyline fill="none" points="{" ".join(p)}"/>' for p in paths if p)
    return _frame(width, height, label, lines + last)


def bars(values: _Series, *, width: int = 120, height: int = 28, label: str = "") -> str:
    """One bar per point, scaled to the largest; a missing or zero point has no bar."""
    points = _clean(values)
    known = [v for v in points if v]
    if not known:
        return _frame(
            width, height, label or "no data", f'<line x1="0" y1="{height - 0.5}" x2="{width}" y2="{height - 0.5}"/>'
        )
    top = max(known)
    slot = width / len(points)
    gap = 1.0 if slot > 3 else 0.0
    rects = []
    for index, value in enumerate(points):
        if not value:
            continue
        bar = max(1.0, (height - 1) * value / top)
        x = index * slot
        rects.append(f'<rect x="{x:.1f}" y="{height - bar:.1f}" width="{slot - gap:.1f}" height="{bar:.1f}"/>')
    return _frame(width, height, label, "".join(rects))
