"""Reads of the call log for the operator console and `mcp-gateway calls`: indexed, newest first.

Every query here is bounded (a `LIMIT`, or a recent time window) and served by an index from
migration 3 (`executions (server, at)`, `(tool, at)`, `(status, at)`, the overview's covering
`(at, server, status, latency_ms)`, `feedback (execution_id)`) or the time index of migration 1,
so it stays fast with 100,000 records (`bench/admin_overhead.py`).

Statuses as an operator asks for them (`CALL_STATUSES`):
`ok` (the server answered with a result), `error` (it was sent and failed, or the server
answered with an error result), `timeout`, and `refused` (an admission layer refused it
before it reached a server: recorded with no attempt).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.errors import error_class
from gateway.records.store import RecordStore

__all__ = [
    "CALL_STATUSES",
    "MAX_CALLS",
    "CallFilter",
    "ServerWindow",
    "call_detail",
    "call_rows",
    "feedback_rows",
    "status_of",
    "window",
]

CALL_STATUSES = ("ok", "error", "timeout", "refused")
MAX_CALLS = 1000
"""The most calls one listing returns (`limit`)."""
MAX_LATENCY_ROWS = 20_000
"""The most recent calls whose latencies the overview reads for its p50s (its counts are exact)."""

_LIST_COLUMNS = (
    "id, at, server, tool, status, error_code, latency_ms, attempts, client_id, session_id, trace_id, replica, "
    "parent_id, "
    "substr(response_summary, 1, 160) AS summary"
)
_STATUS_SQL = {
    "ok": "status = 'success'",
    "error": "status IN ('error', 'timeout') AND attempts > 0",
    "timeout": "status = 'timeout'",
    "refused": "status IN ('error', 'timeout') AND attempts = 0",
}


@dataclass(frozen=True)
class CallFilter:
    """Which calls to list: all given conditions hold. `since` and `before` are Unix seconds
    (`before` excludes: pass the last listed call's `at` for the next page)."""

    server: str | None = None
    tool: str | None = None
    status: str | None = None
    since: float | None = None
    before: float | None = None
    limit: int = 100

    def __post_init__(self) -> None:
        if self.status is not None and self.status not in CALL_STATUSES:
            raise ValueError(f"status must be one of {', '.join(CALL_STATUSES)}; got {self.status!r}")
        if not 1 <= self.limit <= MAX_CALLS:
            raise ValueError(f"limit must be from 1 to {MAX_CALLS}; got {self.limit}")


def status_of(status: str, attempts: int) -> str:
    """A stored execution's status as `CALL_STATUSES` name it."""
    if status == "success":
        return "ok"
    if attempts == 0:
        return "refused"
    return "timeout" if status == "timeout" else "error"


def _where(flt: CallFilter) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    for column, value in (("server", flt.server), ("tool", flt.tool)):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    if flt.status is not None:
        clauses.append(_STATUS_SQL[flt.status])
    if flt.since is not None:
        clauses.append("at >= ?")
        params.append(flt.since)
    if flt.before is not None:
        clauses.append("at < ?")
        params.append(flt.before)
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def _dicts(names: Sequence[str], rows: Sequence[tuple[Any, ...]]) -> list[dict[str, Any]]:
    return [dict(zip(names, row, strict=True)) for row in rows]


def call_rows(store: RecordStore, flt: CallFilter) -> list[dict[str, Any]]:
    """Calls matching `flt`, newest first, without their arguments and full results (see `call_detail`)."""
    where, params = _where(flt)
    names, rows = store.read(
        f"SELECT {_LIST_COLUMNS} FROM executions{where} ORDER BY at DESC LIMIT {int(flt.limit)}", params
    )
    calls = _dicts(names, rows)
    for call in calls:
        call["status"] = status_of(call["status"], call["attempts"])
    return calls


def call_detail(store: RecordStore, execution_id: str) -> dict[str, Any] | None:
    """One call with its (redacted, as stored) arguments, result summary, failures and feedback."""
    names, rows = store.read(
        "SELECT id, at, server, tool, status, error_code, latency_ms, attempts, client_id, session_id, trace_id, "
        "replica, parent_id, search_id, arguments, response_summary, response_size FROM executions WHERE id = ?",
        (execution_id,),
    )
    if not rows:
        return None
    call = _dicts(names, rows)[0]
    call["stored_status"] = call["status"]
    call["status"] = status_of(call["status"], call["attempts"])
    names, rows = store.read(
        "SELECT seq, attempt, error_type, code, details FROM failures WHERE execution_id = ? ORDER BY seq",
        (execution_id,),
    )
    call["failures"] = _dicts(names, rows)
    names, rows = store.read(
        "SELECT at, rating, score, comment, client_id FROM feedback WHERE execution_id = ? ORDER BY at",
        (execution_id,),
    )
    call["feedback"] = _dicts(names, rows)
    names, rows = store.read(  # a code-mode program's run: the calls it made, in order
        "SELECT id, at, server, tool, status, error_code, latency_ms, attempts FROM executions "
        "WHERE parent_id = ? ORDER BY at",
        (execution_id,),
    )
    call["inner_calls"] = _dicts(names, rows)
    for inner in call["inner_calls"]:
        inner["status"] = status_of(inner["status"], inner["attempts"])
    return call


def feedback_rows(store: RecordStore, limit: int) -> list[dict[str, Any]]:
    """The latest feedback, newest first, with the server and tool of the call it rates."""
    if not 1 <= limit <= MAX_CALLS:
        raise ValueError(f"limit must be from 1 to {MAX_CALLS}; got {limit}")
    names, rows = store.read(
        "SELECT f.at, f.execution_id, e.server, e.tool, f.rating, f.score, f.comment, f.client_id "
        f"FROM feedback f LEFT JOIN executions e ON e.id = f.execution_id ORDER BY f.at DESC LIMIT {int(limit)}"
    )
    return _dicts(names, rows)


@dataclass
class ServerWindow:
    """One server's calls over a recent window: `calls` and `errors` exact; the per-minute series (oldest
    first) of calls and latencies from the latest `MAX_LATENCY_ROWS` calls of the window (all of them
    unless the window holds more)."""

    calls: int
    errors: int
    """Failures of the upstream's or the gateway's making (`gateway.errors.error_class`)."""
    per_minute: list[int]
    latencies: list[list[float]]
    caller_errors: int = 0
    """Calls that failed for the caller's mistake (an unknown tool, bad arguments): counted apart."""


def window(store: RecordStore, first_minute: float, minutes: int) -> dict[str, ServerWindow]:
    """Per server, the calls of the `minutes` minutes from `first_minute` (Unix seconds, a minute's start):
    one aggregate query for the exact counts, one bounded read of the latest calls for the series."""
    _, rows = store.read(  # the window first (the covering time index), then grouped: not a scan of every call
        "SELECT server, COUNT(*) FROM (SELECT server FROM executions WHERE at >= ? ORDER BY at) recent GROUP BY server",
        (first_minute,),
    )
    found = {server: ServerWindow(int(calls), 0, [0] * minutes, [[] for _ in range(minutes)]) for server, calls in rows}
    _, failed = store.read(  # only the failures' rows are read for their codes
        "SELECT server, error_code, COUNT(*) FROM executions WHERE at >= ? AND status <> 'success' "
        "GROUP BY server, error_code",
        (first_minute,),
    )
    for server, code, count in failed:
        entry = found.get(server)
        if entry is None:
            continue
        if error_class(code) == "caller":
            entry.caller_errors += int(count)
        else:
            entry.errors += int(count)
    _, recent = store.read(
        f"SELECT server, at, latency_ms FROM executions WHERE at >= ? ORDER BY at DESC LIMIT {MAX_LATENCY_ROWS}",
        (first_minute,),
    )
    for server, at, latency in recent:
        index = int((at - first_minute) // 60)
        entry = found.get(server)
        if entry is not None and 0 <= index < minutes:
            entry.per_minute[index] += 1
            entry.latencies[index].append(latency)
    return found
