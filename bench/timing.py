"""What the benchmark scripts share for timing one awaited call at a time.

The scripts run as `python bench/<script>.py`, which puts this folder on `sys.path`,
so they import it as `timing`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
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


def paired_added(samples: Sequence[float], base: Sequence[float], block: int) -> float:
    """Median over blocks of (block median - the baseline's block median): the added time, resistant
    to drift, for variants measured in turns of `block` calls."""
    diffs = [
        statistics.median(samples[i : i + block]) - statistics.median(base[i : i + block])
        for i in range(0, min(len(samples), len(base)), block)
    ]
    return statistics.median(diffs)


def cpu_ms(pid: int) -> float:
    """utime + stime of a process so far (all its threads), in milliseconds, from Linux's `/proc`;
    0 once it is gone (or where there is no `/proc`)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def add_paired_options(parser: argparse.ArgumentParser, *, calls: int, warmup: int, timeout: float) -> None:
    """The options of a block-paired comparison (variants taking turns a block of calls at a time)."""
    parser.add_argument("--calls", type=int, default=calls, help=f"measured calls per variant (default {calls})")
    parser.add_argument(
        "--warmup", type=int, default=warmup, help=f"unmeasured calls per variant first (default {warmup})"
    )
    parser.add_argument("--block", type=int, default=50, help="calls per turn in the round robin (default 50)")
    parser.add_argument(
        "--timeout", type=float, default=timeout, help=f"bound on the whole run, seconds (default {timeout:g})"
    )


def check_paired_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse counts a paired run cannot use (exits with argparse's usage error)."""
    if args.calls < 1 or args.block < 1 or args.warmup < 0:
        parser.error("--calls and --block must be positive, --warmup not negative")
