"""The audit trail of the operator console: who did what to which target, when, and how it went.

Written through (not buffered like executions), so an action is on record when its answer
is sent; the `audit` table comes from migration 3 and, unlike executions, is kept past
`GATEWAY_RECORDS__RETENTION_DAYS`: it is small, and what it is for is looking back.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from gateway.records.store import RecordStore

__all__ = ["AUDIT_ACTIONS", "AuditRow", "audit_rows", "write_audit"]

AUDIT_ACTIONS = (
    "login",
    "logout",
    "restart",
    "disable",
    "enable",
    "approve",
    "tool_disable",
    "tool_enable",
    "reload",
    "run_tool",
    "feedback",
)
"""What the console records; another action is refused (a typo must not start a new kind silently)."""
MAX_AUDIT = 1000


@dataclass(frozen=True)
class AuditRow:
    principal: str
    """Who: an API key's name, `jwt:<subject>`, or `local` (no authentication, loopback)."""
    action: str
    target: str | None
    outcome: str
    """`ok`, or what went wrong, in one line."""
    details: dict[str, Any] = field(default_factory=dict)
    at: float = field(default_factory=time.time)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def __post_init__(self) -> None:
        if self.action not in AUDIT_ACTIONS:
            raise ValueError(f"unknown audit action {self.action!r}; actions: {', '.join(AUDIT_ACTIONS)}")


def write_audit(store: RecordStore, row: AuditRow) -> None:
    """Record one action (synchronous: call it from a worker thread)."""
    details = json.dumps(row.details, ensure_ascii=False, sort_keys=True) if row.details else None
    store.run(
        "INSERT INTO audit (id, at, principal, action, target, outcome, details, replica) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (row.id, row.at, row.principal, row.action, row.target, row.outcome, details, store.replica),
    )


def audit_rows(store: RecordStore, limit: int = 100) -> list[dict[str, Any]]:
    """The latest actions, newest first."""
    if not 1 <= limit <= MAX_AUDIT:
        raise ValueError(f"limit must be from 1 to {MAX_AUDIT}; got {limit}")
    names, rows = store.read(
        "SELECT id, at, principal, action, target, outcome, details, replica FROM audit "
        f"ORDER BY at DESC LIMIT {int(limit)}"
    )
    found = [dict(zip(names, row, strict=True)) for row in rows]
    for entry in found:
        entry["details"] = json.loads(entry["details"]) if entry["details"] else {}
    return found
