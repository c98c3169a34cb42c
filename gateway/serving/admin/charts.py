"""Small SVG charts drawn on the server: a sparkline of a latency series, bars of a count series.

Pure functions of numbers to SVG text, so a page needs no chart library and shows them with
JavaScript off. Each chart has its scale in a gutter on the left (its largest value, with `unit`, and
0) and a baseline, so a chart of one or two points still says how much it shows. Every value is
formatted as a number here; nothing from a request reaches the markup except the `label` and the
`unit`, which are escaped.
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


GUTTER = 34
"""Pixels on the left for the scale's figures."""


def _figure(value: float) -> str:
    """A scale figure in at most five characters: 3, 2.5, 120, 1.2k."""
    if value >= 1000:
        return f"{value / 1000:.1f}".rstrip("0").rstrip(".") + "k"
    if value >= 10 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.1f}"


def _scale(top: float, unit: str, width: int, height: int) -> str:
    """The largest value at the top of the gutter, 0 at its bottom, and the baseline."""
    right = GUTTER - 3
    return (
        f'<text class="scale" x="{right}" y="8" text-anchor="end">{escape(_figure(top) + unit)}</text>'
        f'<text class="scale" x="{right}" y="{height - 1}" text-anchor="end">0</text>'
        f'<line x1="{GUTTER}" y1="{height - 0.5}" x2="{width}" y2="{height - 0.5}"/>'
    )


def _frame(width: int, height: int, label: str, body: str) -> str:
    title = escape(label)
    return (
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{title}"><title>{title}</title>{body}</svg>'
    )


def sparkline(values: _Series, *, width: int = 120, height: int = 28, label: str = "", unit: str = "") -> str:
    """A line through the points, scaled to the largest; a gap where a point is missing, a dot on each
    point that has no neighbour (so one point alone shows), and the scale on the left."""
    points = _clean(values)
    known = [v for v in points if v is not None]
    if not known:
        return _frame(width, height, label or "no data", "")
    top = max(known) or 1.0
    plot = width - GUTTER - 3  # room for the last point's dot
    step = plot / max(len(points) - 1, 1)
    pad = 2.0
    usable = height - 2 * pad
    paths: list[list[str]] = [[]]
    dots: list[str] = []
    for index, value in enumerate(points):
        if value is None:
            if paths[-1]:
                paths.append([])
            continue
        x = GUTTER + (index * step if len(points) > 1 else plot / 2)
        y = pad + usable * (1 - value / top)
        paths[-1].append(f"{x:.1f},{y:.1f}")
    for path in paths:
        if len(path) == 1 or (path and path is paths[-1] and points[-1] is not None):
            cx, cy = path[-1].split(",")
            dots.append(f'<circle cx="{cx}" cy="{cy}" r="2"/>')
    lines = "".join(f'<polyline fill="none" points="{" ".join(p)}"/>' for p in paths if len(p) > 1)
    return _frame(width, height, label, _scale(top, unit, width, height) + lines + "".join(dots))


def bars(values: _Series, *, width: int = 120, height: int = 28, label: str = "", unit: str = "") -> str:
    """One bar per point, scaled to the largest, with the scale on the left; a missing or zero point has no bar."""
    points = _clean(values)
    known = [v for v in points if v]
    if not known:
        return _frame(
            width, height, label or "no data", f'<line x1="0" y1="{height - 0.5}" x2="{width}" y2="{height - 0.5}"/>'
        )
    top = max(known)
    slot = (width - GUTTER) / len(points)
    gap = 1.0 if slot > 3 else 0.0
    rects = []
    for index, value in enumerate(points):
        if not value:
            continue
        bar = max(1.0, (height - 1) * value / top)
        x = GUTTER + index * slot
        rects.append(f'<rect x="{x:.1f}" y="{height - bar:.1f}" width="{slot - gap:.1f}" height="{bar:.1f}"/>')
    return _frame(width, height, label, _scale(top, unit, width, height) + "".join(rects))
