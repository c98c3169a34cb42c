"""What the benchmark scripts share for timing one awaited call at a time.

The scripts run as `python bench/<script>.py`, which puts this folder on `sys.path`,
so they import it as `timing`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any


async def timed(work: Callable[[], Awaitable[Any]], calls: int) -> list[float]:
    """Microseconds taken by each of `calls` awaits of `work()`, in order."""
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        await work()
        samples.append((time.perf_counter() - started) * 1e6)
    return samples


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile of already sorted values, q in [0, 100]; NaN for none."""
    if not sorted_values:
        return float("nan")
    pos = (len(sorted_values) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)
