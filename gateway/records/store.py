"""The records store: one interface, SQL shared by both backends (`sqlite`, `postgres`).

Every method is synchronous and thread-safe (one connection behind a lock): the writer
calls them from its own thread, the event loop through `anyio.to_thread`. The
connection is made on first use, and again after any failure, so a database that is
down at start-up or goes away later costs the records written meanwhile, never the
gateway. Schema migrations (`gateway.records.migrations`) run on each connection,
under a lock, so replicas starting together apply each step once.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from gateway.records.migrations import MIGRATIONS
from gateway.records.model import ExecutionRef, FailureRow, FeedbackRow, SearchRow
from gateway.router.signals import UsageSignal, feedback_value

__all__ = [
    "EXECUTION_COLUMNS",
    "TABLES",
    "AlreadyRated",
    "Batch",
    "RecordStore",
    "RecordsError",
    "SqlStore",
    "StoreUnavailable",
]

logger = logging.getLogger(__name__)

EXECUTION_COLUMNS = (
    "id, at, server, tool, session_id, client_id, arguments, response_summary, response_size, "
    "latency_ms, status, error_code, attempts, search_id, trace_id, parent_id"
)
TABLES = ("executions", "failures", "feedback", "searches")

_ROWS_SQL = {
    "executions": "SELECT * FROM executions WHERE at >= ? ORDER BY at",
    "failures": (
        "SELECT f.* FROM failures f JOIN executions e ON e.id = f.execution_id WHERE e.at >= ? ORDER BY e.at, f.seq"
    ),
    "feedback": "SELECT * FROM feedback WHERE at >= ? ORDER BY at",
    "searches": "SELECT * FROM searches WHERE at >= ? ORDER BY at",
}
_CALL_SIGNALS = (
    "SELECT s.query, e.tool, e.status, e.at FROM executions e LEFT JOIN searches s ON s.id = e.search_id "
    "WHERE e.at >= ? AND e.attempts > 0 ORDER BY e.at"  # only calls that reached their server
)
_FEEDBACK_SIGNALS = (
    "SELECT s.query, e.tool, f.rating, f.score, f.at FROM feedback f "
    "JOIN executions e ON e.id = f.execution_id LEFT JOIN searches s ON s.id = e.search_id "
    "WHERE f.at >= ? ORDER BY f.at"
)


class RecordsError(Exception):
    """Base of the records' own errors."""


class StoreUnavailable(RecordsError):
    """The database could not be reached, migrated or written; the message says which and why."""


class AlreadyRated(RecordsError):
    """Feedback for this token exists already."""


@dataclass
class Batch:
    """What one flush writes, in one transaction."""

    executions: list[tuple[Any, ...]] = field(default_factory=list)
    failures: list[FailureRow] = field(default_factory=list)
    searches: list[SearchRow] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.executions) + len(self.searches)


class RecordStore(Protocol):
    """Where records live. Implementations: `SqliteStore`, `PostgresStore`."""

    description: str
    """Where, for messages (never a password)."""
    replica: str | None
    """The replica writing (`GATEWAY_REPLICA_ID`), stored with executions and audit rows."""

    def write(self, batch: Batch) -> None: ...

    def execution(self, execution_id: str) -> ExecutionRef | None: ...

    def add_feedback(self, row: FeedbackRow) -> None:
        """Raises `AlreadyRated` when the token was used."""
        ...

    def delete_before(self, cutoff: float) -> int:
        """Delete records older than `cutoff` (Unix seconds); returns how many executions went."""
        ...

    def rows(self, table: str, since: float | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Column names and rows of one table (see `TABLES`), oldest first."""
        ...

    async def usage_signals(self, since: float | None = None) -> Sequence[UsageSignal]: ...

    def read(self, sql: str, params: Sequence[Any] = ()) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Column names and rows of one query (`?` placeholders), for `gateway.records.queries`."""
        ...

    def run(self, sql: str, params: Sequence[Any] = ()) -> None:
        """One statement in its own transaction, written through (`gateway.records.audit`)."""
        ...

    def close(self) -> None: ...


class SqlStore:
    """The shared SQL; a backend says how to connect, how transactions start, and what its errors are."""

    description = "records store"
    replica: str | None = None
    """This process's replica id (`GATEWAY_REPLICA_ID`), written with each execution and audit row."""
    placeholder = "?"
    errors: tuple[type[BaseException], ...] = ()
    """Exceptions that mean the database failed (the connection is dropped and made again)."""

    def __init__(self) -> None:
        self._connection: Any = None
        self._lock = threading.Lock()

    # ---- backend hooks ----------------------------------------------------------------

    def _open(self) -> Any:
        raise NotImplementedError

    @contextmanager
    def _transaction(self, connection: Any) -> Iterator[None]:
        raise NotImplementedError
        yield  # pragma: no cover

    def _lock_schema(self, cursor: Any) -> None:
        """Serialize migrations between processes (inside the migration transaction)."""

    def _is_unique_violation(self, error: BaseException) -> bool:
        raise NotImplementedError

    # ---- connection -------------------------------------------------------------------

    def _sql(self, text: str) -> str:
        return text if self.placeholder == "?" else text.replace("?", self.placeholder)

    def _connect(self) -> Any:
        if self._connection is None:
            connection = self._open()
            try:
                self._migrate(connection)
            except BaseException:
                connection.close()
                raise
            self._connection = connection
        return self._connection

    def _migrate(self, connection: Any) -> None:
        with self._transaction(connection):
            cursor = connection.cursor()
            self._lock_schema(cursor)
            cursor.execute(
                "CREATE TABLE IF NOT EXISTS schema_version "
                "(version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
            )
            cursor.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version")
            current = int(cursor.fetchone()[0])
            for migration in MIGRATIONS:
                if migration.version <= current:
                    continue
                for statement in migration.statements():
                    cursor.execute(statement)
                cursor.execute(
                    self._sql("INSERT INTO schema_version VALUES (?, ?, ?)"),
                    (migration.version, migration.description, _now()),
                )
                logger.info("%s: schema migration %d applied", self.description, migration.version)

    @contextmanager
    def _using(self) -> Iterator[Any]:
        """A connected cursor under the lock; a database failure drops the connection and says why."""
        with self._lock:
            try:
                connection = self._connect()
                with self._transaction(connection):
                    yield connection.cursor()
            except self.errors as error:
                if self._is_unique_violation(error):
                    raise
                self._drop()
                raise StoreUnavailable(f"{self.description}: {_one_line(error)}") from error

    def _drop(self) -> None:
        if self._connection is not None:
            try:
                self._connection.close()
            except self.errors:
                pass
            self._connection = None

    def close(self) -> None:
        with self._lock:
            self._drop()

    def schema_version(self) -> int:
        with self._using() as cursor:
            cursor.execute("SELECT MAX(version) FROM schema_version")
            return int(cursor.fetchone()[0])

    # ---- writes -----------------------------------------------------------------------

    def write(self, batch: Batch) -> None:
        with self._using() as cursor:
            if batch.executions:
                marks = ", ".join("?" * (len(batch.executions[0]) + 1))
                sql = f"INSERT INTO executions ({EXECUTION_COLUMNS}, replica) VALUES ({marks})"
                cursor.executemany(self._sql(sql), [(*row, self.replica) for row in batch.executions])
            if batch.failures:
                cursor.executemany(
                    self._sql("INSERT INTO failures VALUES (?, ?, ?, ?, ?, ?)"),
                    [(f.execution_id, f.seq, f.attempt, f.error_type, f.code, f.details) for f in batch.failures],
                )
            if batch.searches:
                cursor.executemany(
                    self._sql("INSERT INTO searches VALUES (?, ?, ?, ?, ?, ?, ?)"),
                    [
                        (s.id, s.at, s.session_id, s.client_id, s.query, _json_list(s.results), s.latency_ms)
                        for s in batch.searches
                    ],
                )

    def add_feedback(self, row: FeedbackRow) -> None:
        try:
            with self._using() as cursor:
                cursor.execute(
                    self._sql("INSERT INTO feedback VALUES (?, ?, ?, ?, ?, ?, ?)"),
                    (row.token, row.execution_id, row.at, row.rating, row.score, row.comment, row.client_id),
                )
        except self.errors as error:
            if self._is_unique_violation(error):
                raise AlreadyRated(row.token) from None
            raise

    def delete_before(self, cutoff: float) -> int:
        with self._using() as cursor:
            old = "SELECT id FROM executions WHERE at < ?"
            cursor.execute(self._sql(f"DELETE FROM failures WHERE execution_id IN ({old})"), (cutoff,))
            cursor.execute(self._sql(f"DELETE FROM feedback WHERE at < ? OR execution_id IN ({old})"), (cutoff, cutoff))
            cursor.execute(self._sql("DELETE FROM searches WHERE at < ?"), (cutoff,))
            cursor.execute(self._sql("DELETE FROM executions WHERE at < ?"), (cutoff,))
            return int(cursor.rowcount or 0)

    # ---- reads ------------------------------------------------------------------------

    def execution(self, execution_id: str) -> ExecutionRef | None:
        with self._using() as cursor:
            cursor.execute(self._sql("SELECT id, server, tool FROM executions WHERE id = ?"), (execution_id,))
            found = cursor.fetchone()
        return None if found is None else ExecutionRef(*found)

    def rows(self, table: str, since: float | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
        if table not in _ROWS_SQL:
            raise ValueError(f"no records table {table!r}; tables: {', '.join(TABLES)}")
        with self._using() as cursor:
            cursor.execute(self._sql(_ROWS_SQL[table]), (since if since is not None else float("-inf"),))
            names = [column[0] for column in cursor.description]
            return names, [tuple(row) for row in cursor.fetchall()]

    def signals(self, since: float | None = None) -> list[UsageSignal]:
        start = since if since is not None else float("-inf")
        with self._using() as cursor:
            cursor.execute(self._sql(_CALL_SIGNALS), (start,))
            calls = [
                UsageSignal(query, tool, 1.0 if status == "success" else -1.0, at, "call")
                for query, tool, status, at in cursor.fetchall()
            ]
            cursor.execute(self._sql(_FEEDBACK_SIGNALS), (start,))
            rated = [
                UsageSignal(query, tool, feedback_value(rating, score), at, "feedback")
                for query, tool, rating, score, at in cursor.fetchall()
            ]
        return sorted(calls + rated, key=lambda signal: signal.at)

    async def usage_signals(self, since: float | None = None) -> Sequence[UsageSignal]:
        """`gateway.router.signals.SignalSource`: +1/-1 per call, the rating's value per feedback."""
        return await anyio.to_thread.run_sync(self.signals, since)

    def read(self, sql: str, params: Sequence[Any] = ()) -> tuple[list[str], list[tuple[Any, ...]]]:
        with self._using() as cursor:
            cursor.execute(self._sql(sql), tuple(params))
            names = [column[0] for column in cursor.description]
            return names, [tuple(row) for row in cursor.fetchall()]

    def run(self, sql: str, params: Sequence[Any] = ()) -> None:
        with self._using() as cursor:
            cursor.execute(self._sql(sql), tuple(params))


def _now() -> float:
    return time.time()


def _json_list(values: Sequence[str]) -> str:
    return json.dumps(list(values), ensure_ascii=False)


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text[:300]
