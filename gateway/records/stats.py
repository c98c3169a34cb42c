"""`mcp-gateway stats`: calls, error rates, p50/p95 latency and top error codes per server and tool;
`--csv DIR` writes executions, failures and feedback as CSV files (the nightly export).

Errors are counted by class (`gateway.errors.error_class`): `errors` and `error_rate` are the
upstream's and the gateway's failures, while the caller's mistakes (an unknown tool, bad arguments)
are counted apart, in `caller_errors`, so one bad call does not make a server look broken. A call to
a tool no server owns is listed under `NO_SERVER`."""

from __future__ import annotations

import csv
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.errors import error_class
from gateway.observability.metrics import NO_SERVER
from gateway.records.store import RecordStore

__all__ = [
    "CSV_TABLES",
    "NO_SERVER",
    "UsageStats",
    "compute_stats",
    "executions_for_stats",
    "export_csv",
    "format_stats",
    "parse_since",
    "percentile",
]

CSV_TABLES = ("executions", "failures", "feedback")
TOP_ERRORS = 3
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now: float) -> float:
    """`--since`: a duration back from `now` (`90s`, `30m`, `24h`, `7d`, `2w`) or an ISO 8601 date or time
    (UTC unless it names its offset); Unix seconds."""
    match = _DURATION.match(text)
    if match:
        return now - float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"--since takes a duration like 30m, 24h or 7d, or an ISO date or time like 2026-01-31T08:00; got {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def percentile(sorted_values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile of already sorted values; None for none."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


@dataclass
class UsageStats:
    """One server (with its tools) or one tool."""

    name: str
    calls: int = 0
    errors: int = 0
    """Failures of the upstream's or the gateway's making (`upstream_errors + gateway_errors`)."""
    error_rate: float = 0.0
    caller_errors: int = 0
    """Calls refused or failed for the caller's mistake: counted apart from `errors`."""
    caller_error_rate: float = 0.0
    upstream_errors: int = 0
    gateway_errors: int = 0
    p50_ms: float | None = None
    p95_ms: float | None = None
    top_errors: list[tuple[str, int]] = field(default_factory=list)
    tools: list[UsageStats] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["top_errors"] = [{"code": code, "count": count} for code, count in self.top_errors]
        data["tools"] = [tool.to_json() for tool in self.tools]
        return data


def _summarize(name: str, rows: list[tuple[str, str | None, float]]) -> UsageStats:
    latencies = sorted(latency for _, _, latency in rows)
    failed = [code or status for status, code, _ in rows if status != "success"]
    classes = Counter(error_class(code) for code in failed)
    errors = classes["upstream"] + classes["gateway"]
    return UsageStats(
        name=name,
        calls=len(rows),
        errors=errors,
        error_rate=round(errors / len(rows), 4) if rows else 0.0,
        caller_errors=classes["caller"],
        caller_error_rate=round(classes["caller"] / len(rows), 4) if rows else 0.0,
        upstream_errors=classes["upstream"],
        gateway_errors=classes["gateway"],
        p50_ms=percentile(latencies, 50),
        p95_ms=percentile(latencies, 95),
        top_errors=Counter(failed).most_common(TOP_ERRORS),
    )


def compute_stats(executions: Iterable[tuple[str, str, str, str | None, float]]) -> list[UsageStats]:
    """Per server, busiest first, each with its tools: rows are `(server, tool, status, error_code, latency_ms)`."""
    by_tool: dict[tuple[str, str], list[tuple[str, str | None, float]]] = {}
    for server, tool, status, code, latency in executions:
        by_tool.setdefault((server or NO_SERVER, tool), []).append((status, code, latency))
    servers: dict[str, list[tuple[str, str | None, float]]] = {}
    for (server, _), rows in by_tool.items():
        servers.setdefault(server, []).extend(rows)
    result = []
    for server, rows in servers.items():
        stats = _summarize(server, rows)
        tools = [_summarize(tool, tool_rows) for (owner, tool), tool_rows in by_tool.items() if owner == server]
        stats.tools = sorted(tools, key=lambda t: (-t.calls, t.name))
        result.append(stats)
    return sorted(result, key=lambda s: (-s.calls, s.name))


def executions_for_stats(store: RecordStore, since: float | None) -> list[tuple[str, str, str, str | None, float]]:
    names, rows = store.rows("executions", since)
    at = {name: i for i, name in enumerate(names)}
    columns = [at["server"], at["tool"], at["status"], at["error_code"], at["latency_ms"]]
    return [tuple(row[i] for i in columns) for row in rows]  # type: ignore[misc]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_stats(servers: Sequence[UsageStats]) -> str:
    """A table for people: each server, then its tools indented under it."""
    if not servers:
        return "No calls recorded in this period."
    headers = [
        "SERVER / TOOL",
        "CALLS",
        "ERRORS",
        "UPSTREAM",
        "GATEWAY",
        "CALLER",
        "P50 MS",
        "P95 MS",
        "TOP ERROR CODES",
    ]
    lines: list[list[str]] = []
    for server in servers:
        for indent, stats in [("", server), *(("  ", tool) for tool in server.tools)]:
            top = ", ".join(f"{code} x{count}" for code, count in stats.top_errors) or "-"
            rate = f"{stats.error_rate * 100:.1f}%"
            counts = [str(stats.upstream_errors), str(stats.gateway_errors), str(stats.caller_errors)]
            lines.append(
                [indent + stats.name, str(stats.calls), rate, *counts, _ms(stats.p50_ms), _ms(stats.p95_ms), top]
            )
    widths = [max(len(row[i]) for row in [headers, *lines]) for i in range(len(headers))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                     for row in [headers, *lines])  # fmt: skip


def export_csv(store: RecordStore, directory: Path, since: float | None) -> list[tuple[Path, int]]:
    """Write `executions.csv`, `failures.csv`, `feedback.csv` into `directory`; each path with its row count."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for table in CSV_TABLES:
        names, rows = store.rows(table, since)
        path = directory / f"{table}.csv"
        with path.open("w", newline="", encoding="utf-8") as out:
            writer = csv.writer(out)
            writer.writerow(names)
            writer.writerows(rows)
        written.append((path, len(rows)))
    return written
