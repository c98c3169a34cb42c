"""What the tools need from a database, whichever it is (SQLite or PostgreSQL).

Every method blocks: the tools call them in a worker thread, never on the event loop.
Each call opens its own connection and closes it, so no connection is shared between
threads, a broken connection never outlives a call, and SQLite's file locks are held
only while a call runs. Reads run on a connection that cannot write (SQLite opened
read-only, PostgreSQL in a READ ONLY transaction), so even a function with side
effects called from a SELECT cannot change data.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from .schema import Schema

__all__ = ["Database", "DatabaseError", "QueryTimeout", "Rows", "WriteOutcome", "json_value"]

Backend = Literal["sqlite", "postgresql"]


class DatabaseError(Exception):
    """The database refused or failed a statement; the message is the database's own, without secrets."""


class QueryTimeout(DatabaseError):
    """A statement ran past its time limit and was stopped."""


@dataclass
class Rows:
    """A result set, cut at `max_rows`."""

    columns: list[str]
    rows: list[list[Any]]
    truncated: bool = False


@dataclass
class WriteOutcome:
    """What a write did (or, rolled back, would do)."""

    row_counts: list[int | None]
    """Rows each statement inserted, updated or deleted; None for DDL, which changes no rows."""
    total_changes: int | None = None
    """Rows changed including triggers and foreign-key actions, where the database reports it (SQLite)."""
    returned: list[Rows] = field(default_factory=list)


class Database(Protocol):
    @property
    def backend(self) -> Backend: ...

    @property
    def label(self) -> str:
        """The database in words, without credentials: a file path or a URL without its password."""
        ...

    @property
    def read_only(self) -> bool: ...

    def read_schema(self) -> Schema: ...

    def explain(self, sql: str, timeout_ms: int) -> Rows:
        """The plan of one statement, without running it."""
        ...

    def query(self, statements: Sequence[str], timeout_ms: int, max_rows: int) -> list[Rows]:
        """Run read statements on a connection that cannot write."""
        ...

    def write(self, statements: Sequence[str], timeout_ms: int, *, commit: bool) -> WriteOutcome:
        """Run statements in one transaction; commit it, or roll it back (a dry run)."""
        ...

    def insert(
        self, table: str, records: Sequence[Mapping[str, Any]], returning: str | None, timeout_ms: int
    ) -> list[Any]:
        """Insert every record in one transaction (all or nothing); the `returning` column of each new row."""
        ...


def json_value(value: Any) -> Any:
    """A database value as JSON: bytes as base64 text, decimals, dates and UUIDs as text."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return "base64:" + base64.b64encode(bytes(value)).decode()
    if isinstance(value, decimal.Decimal | datetime.date | datetime.time | datetime.timedelta | uuid.UUID):
        return str(value)
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    return json.loads(json.dumps(value, default=str))
