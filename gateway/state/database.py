"""The shared database of a deployment: one PostgreSQL connection per process, the state schema.

Every method is synchronous and thread-safe (one connection behind a lock), called from a worker
thread or, for the few sub-millisecond reads on the request path, from the event loop. The
connection is made on first use and again after a failure; a failure raises `SharedStateError`
with the reason, never the password. The schema is numbered steps (`MIGRATIONS`), applied under an
advisory lock so replicas starting together apply each once, in their own version table
(`state_schema_version`) beside the records' tables.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from gateway.urls import redact_url

if TYPE_CHECKING:  # imported where a connection is made: a gateway without PostgreSQL never loads it (~10 MB)
    import psycopg

__all__ = ["CHANNEL", "MIGRATIONS", "SharedDatabase", "SharedStateError"]

logger = logging.getLogger(__name__)

CHANNEL = "mcp_gateway_state"
"""The LISTEN/NOTIFY channel of state changes; the payload names what changed (`bus.Topic`)."""
CONNECT_TIMEOUT = 5
_MIGRATION_LOCK = 0x6D637374  # "mcst": any constant every replica shares

MIGRATIONS: tuple[tuple[int, str], ...] = (
    (
        1,
        """
        CREATE TABLE tool_fingerprints (
            server TEXT NOT NULL,
            tool TEXT NOT NULL,
            exposed TEXT NOT NULL,
            approved TEXT NOT NULL,
            pending TEXT,
            trusted TEXT,
            first_seen DOUBLE PRECISION NOT NULL,
            changed_at DOUBLE PRECISION,
            PRIMARY KEY (server, tool)
        );
        CREATE INDEX tool_fingerprints_by_exposed ON tool_fingerprints (exposed);
        CREATE TABLE tool_definitions (fingerprint TEXT PRIMARY KEY, definition TEXT NOT NULL);
        CREATE TABLE state_revisions (topic TEXT PRIMARY KEY, revision BIGINT NOT NULL);
        CREATE TABLE disabled_tools (
            exposed TEXT PRIMARY KEY, disabled_by TEXT NOT NULL, at DOUBLE PRECISION NOT NULL, replica TEXT
        );
        CREATE TABLE disabled_servers (
            server TEXT PRIMARY KEY, disabled_by TEXT NOT NULL, at DOUBLE PRECISION NOT NULL, replica TEXT
        );
        CREATE TABLE console_sessions (
            id_hash TEXT PRIMARY KEY,
            principal TEXT NOT NULL,
            csrf TEXT NOT NULL,
            expires DOUBLE PRECISION NOT NULL,
            replica TEXT
        );
        CREATE INDEX console_sessions_by_expiry ON console_sessions (expires);
        CREATE UNLOGGED TABLE rate_buckets (
            name TEXT PRIMARY KEY,
            tokens DOUBLE PRECISION NOT NULL,
            stamp DOUBLE PRECISION NOT NULL,
            taken BOOLEAN NOT NULL
        )
        """,
    ),
)


class SharedStateError(Exception):
    """The shared database could not be reached, migrated or written; the message says which and why."""


class SharedDatabase:
    """One deployment's database (`GATEWAY_DATABASE_URL`), as this replica (`replica`) uses it."""

    def __init__(self, url: str, replica: str) -> None:
        self.url = url
        self.replica = replica
        self.description = f"shared state {redact_url(url)}"
        self._connection: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()

    def _connect(self) -> psycopg.Connection[Any]:
        import psycopg

        if self._connection is None or self._connection.closed:
            connection = psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT)
            try:
                _migrate(connection, self.description)
            except BaseException:
                connection.close()
                raise
            self._connection = connection
        return self._connection

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Cursor[Any]]:
        """A cursor in one transaction, under the lock; a database failure drops the connection."""
        import psycopg

        with self._lock:
            try:
                connection = self._connect()
                with connection.transaction():
                    yield connection.cursor()
            except (psycopg.Error, OSError) as error:
                self._drop()
                text = " ".join(str(error).split())[:300] or type(error).__name__
                raise SharedStateError(f"{self.description}: {text}") from error

    @contextmanager
    def statement(self) -> Iterator[psycopg.Cursor[Any]]:
        """A cursor for one statement, atomic on its own (autocommit: no BEGIN and COMMIT round trips)."""
        import psycopg

        with self._lock:
            try:
                yield self._connect().cursor()
            except (psycopg.Error, OSError) as error:
                self._drop()
                text = " ".join(str(error).split())[:300] or type(error).__name__
                raise SharedStateError(f"{self.description}: {text}") from error

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.transaction() as cursor:
            cursor.execute(sql, tuple(params))
            return [tuple(row) for row in cursor.fetchall()]

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        """One statement; returns the rows it changed."""
        with self.transaction() as cursor:
            cursor.execute(sql, tuple(params))
            return int(cursor.rowcount or 0)

    def changed(self, cursor: psycopg.Cursor[Any], topic: str) -> None:
        """Inside a transaction that changed `topic`'s state: bump its revision and tell every replica
        (the notification is delivered when the transaction commits)."""
        cursor.execute(
            "INSERT INTO state_revisions VALUES (%s, 1) "
            "ON CONFLICT (topic) DO UPDATE SET revision = state_revisions.revision + 1",
            (topic,),
        )
        cursor.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"{topic} {self.replica}"))

    def notify(self, topic: str) -> None:
        """Tell every replica that `topic` changed (or, for `flush`, is wanted now)."""
        with self.transaction() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"{topic} {self.replica}"))

    def revisions(self) -> dict[str, int]:
        """Every topic's revision: a replica that missed a notification sees the change here."""
        rows = self.rows("SELECT topic, revision FROM state_revisions")
        return {str(topic): int(revision) for topic, revision in rows}

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        import psycopg

        if self._connection is not None:
            try:
                self._connection.close()
            except (psycopg.Error, OSError):
                pass
            self._connection = None


def _migrate(connection: psycopg.Connection[Any], description: str) -> None:
    with connection.transaction():
        cursor = connection.cursor()
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        cursor.execute(
            "CREATE TABLE IF NOT EXISTS state_schema_version "
            "(version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
        )
        cursor.execute("SELECT COALESCE(MAX(version), 0) FROM state_schema_version")
        row = cursor.fetchone()
        current = int(row[0]) if row is not None else 0
        for version, sql in MIGRATIONS:
            if version <= current:
                continue
            for statement in (part.strip() for part in sql.split(";")):
                if statement:
                    cursor.execute(statement.encode())
            cursor.execute("INSERT INTO state_schema_version VALUES (%s, %s)", (version, time.time()))
            logger.info("%s: schema migration %d applied", description, version)
