"""The SQLite records store: one file in the data directory, in WAL mode.

WAL lets `mcp-gateway stats` read while the gateway writes, and with
`synchronous=NORMAL` a committed batch survives the process being killed.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gateway.records.store import SqlStore

__all__ = ["SqliteStore"]


class SqliteStore(SqlStore):
    errors = (sqlite3.Error, OSError)

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.description = f"records store {path}"

    def _open(self) -> Any:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(self.path, timeout=10, isolation_level=None, check_same_thread=False)
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error:
            connection.close()
            raise
        return connection

    @contextmanager
    def _transaction(self, connection: Any) -> Iterator[None]:
        connection.execute("BEGIN IMMEDIATE")  # the write lock now: migrations of two processes do not interleave
        try:
            yield
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")

    def _is_unique_violation(self, error: BaseException) -> bool:
        return isinstance(error, sqlite3.IntegrityError)
